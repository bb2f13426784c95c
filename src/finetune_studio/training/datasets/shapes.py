"""Dataset shapes: telling them apart, and turning a record of each into a training row.

A training row is either a conversation, `{"messages": [{"role", "content"}, ...]}`,
which the trainer renders with the model's chat template, or plain text,
`{"text": ...}`.

- `alpaca`: `instruction` and `output` (strings), optional `input` (appended to
  the instruction after a blank line) and `system`.
- `chatml` (OpenAI): `messages`, a list of `{"role", "content"}`; roles `system`
  (`developer` counts as system), `user`, `assistant`, `tool`. A content may also be
  a list of OpenAI text parts (`{"type": "text", "text": ...}`), which are joined.
- `sharegpt`: `conversations`, a list of `{"from", "value"}`; `human`/`user` are
  the user, `gpt`/`assistant`/`function_call` the assistant, `observation`/`tool`
  a tool, `system` the system.
- `raw`: `text`, a non-empty string.
- `custom`: `custom_format_mapping`, a map from column to role (`system`, `user`,
  `assistant`), e.g. `{"question": "user", "answer": "assistant"}`. Each row becomes
  one message per column, in the mapping's order; consecutive columns with the same
  role make one message (non-empty values joined by a blank line), so
  `{"instruction": "user", "input": "user", "output": "assistant"}` reads Alpaca.
  A mapped column missing from a row is an error; an empty or null system column
  drops the system message; an empty user or assistant message is an error.

The two conversational shapes take their list from either column, `messages` or
`conversations`, and a CSV cell holding that list as JSON text is parsed.

`detect_shape` (format_type `auto`) looks at one record: a `messages` or
`conversations` list is chatml when its turns have `role`/`content` and sharegpt
when they have `from`/`value`; then `instruction` + `output` is alpaca; then `text`
is raw.

Turn order (every conversational shape): an optional system turn, first only; then
a user turn; user and assistant turns alternate, except that tool turns may follow
an assistant turn (one or several), and the assistant answers after them; the last
turn is the assistant's. So two user turns in a row, an assistant turn before any
user turn, a system turn after the first, a tool turn after a user turn, and a
conversation that ends without the assistant's answer are all errors.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from finetune_studio.bounds import excerpt
from finetune_studio.training.datasets.errors import (
    NAMES_SHOWN,
    QUOTE_CHARS,
    RowProblem,
    config_error,
    kind_of,
    names,
    quote,
)

Row = dict[str, Any]
Converter = Callable[[Row], Row]

SHAPES = ("alpaca", "sharegpt", "chatml", "raw")
CUSTOM = "custom"
MAPPING_ROLES = ("system", "user", "assistant")

CHATML_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "assistant",
    "observation": "tool",
    "tool": "tool",
}
_TURN_KEYS = {"chatml": ("role", "content"), "sharegpt": ("from", "value")}
_LIST_COLUMNS = {"chatml": ("messages", "conversations"), "sharegpt": ("conversations", "messages")}


def detect_shape(record: Row) -> str | None:
    for column, default in (("messages", "chatml"), ("conversations", "sharegpt")):
        if column in record:
            turns = _maybe_json(record[column])
            if isinstance(turns, list) and turns and isinstance(turns[0], dict):
                if "from" in turns[0] or "value" in turns[0]:
                    return "sharegpt"
                if "role" in turns[0] or "content" in turns[0]:
                    return "chatml"
            return default
    if "instruction" in record and "output" in record:
        return "alpaca"
    if "text" in record:
        return "raw"
    return None


def undetectable(record: Row) -> str:
    """The problem text for a record whose shape `auto` cannot tell."""
    columns = list(record)
    example = ""
    if len(columns) >= 2:
        first, second = (excerpt(str(column), QUOTE_CHARS) for column in columns[:2])
        example = f', e.g. {{"{first}": "user", "{second}": "assistant"}}'
    return (
        f"cannot tell the dataset's shape from its columns ({names(columns) or 'none'}); expected messages"
        " (chatml), conversations (sharegpt), instruction + output (alpaca) or text (raw), or set"
        f" custom_format_mapping{example}"
    )


def converter(shape: str) -> Converter:
    """The function that turns one record of `shape` into a training row (raises RowProblem)."""
    if shape == "alpaca":
        return _alpaca
    if shape == "raw":
        return _raw
    if shape in _TURN_KEYS:
        return lambda record: _conversation(record, shape)
    raise ValueError(f"unknown shape {shape!r}")


# -- alpaca and raw -------------------------------------------------------------


def _string(record: Row, key: str, *, required: bool = True) -> str:
    if key not in record:
        if required:
            raise RowProblem(f"missing the column {key!r} (found: {names(record) or 'nothing'})")
        return ""
    value = record[key]
    if value is None:
        if required:
            raise RowProblem(f"{key!r} is empty (null)")
        return ""
    if not isinstance(value, str):
        raise RowProblem(f"{key!r} must be a string, found {kind_of(value)}")
    if required and not value.strip():
        raise RowProblem(f"{key!r} is empty")
    return value


def _alpaca(record: Row) -> Row:
    instruction = _string(record, "instruction")
    extra = _string(record, "input", required=False)
    output = _string(record, "output")
    system = _string(record, "system", required=False)
    prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
    if system.strip():
        messages.insert(0, {"role": "system", "content": system})
    return {"messages": messages}


def _raw(record: Row) -> Row:
    return {"text": _string(record, "text")}


# -- conversations --------------------------------------------------------------


def _maybe_json(value: Any) -> Any:
    """A conversation stored as JSON text (a CSV cell, a string column) is read as JSON."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _conversation(record: Row, shape: str) -> Row:
    column = next((c for c in _LIST_COLUMNS[shape] if c in record), None)
    if column is None:
        raise RowProblem(f"missing the column {_LIST_COLUMNS[shape][0]!r} (found: {names(record) or 'nothing'})")
    turns = _maybe_json(record[column])
    if isinstance(turns, str):
        raise RowProblem(f"{column!r} must be a list of turns; found text that is not a JSON list")
    if not isinstance(turns, list) or not turns:
        raise RowProblem(f"{column!r} must be a non-empty list of turns, found {kind_of(turns)}")
    role_key, content_key = _TURN_KEYS[shape]
    roles = CHATML_ROLES if shape == "chatml" else SHAREGPT_ROLES
    other = "sharegpt" if shape == "chatml" else "chatml"
    messages = []
    for index, turn in enumerate(turns):
        at = f"{column}[{index}]"
        if not isinstance(turn, dict):
            raise RowProblem(f"{at} must be an object with {role_key!r} and {content_key!r}, found {kind_of(turn)}")
        if role_key not in turn:
            other_role, other_content = _TURN_KEYS[other]
            if other_role in turn:
                raise RowProblem(
                    f"{at} has {other_role!r} and {other_content!r}, the {other} shape; set format_type {other} or auto"
                )
            raise RowProblem(f"{at} has no {role_key!r} (found: {names(turn) or 'nothing'})")
        name = turn[role_key]
        if not isinstance(name, str) or name not in roles:
            raise RowProblem(f"{at}.{role_key} is {quote(name)}; expected one of {', '.join(roles)}")
        role = roles[name]
        content = _content(turn.get(content_key), f"{at}.{content_key}")
        if role in ("user", "assistant") and not content.strip():
            raise RowProblem(f"{at}.{content_key} is empty")
        messages.append({"role": role, "content": content})
    check_order([m["role"] for m in messages], lambda i: f"{column}[{i}]")
    return {"messages": messages}


def _content(value: Any, at: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # OpenAI content parts
        texts = []
        for index, part in enumerate(value):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                kind = quote(part.get("type")) if isinstance(part, dict) else repr(kind_of(part))
                raise RowProblem(f"{at}[{index}] is a {kind} part; only text parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    if value is None:
        raise RowProblem(f"{at} is missing or null (tool calls without text are not supported)")
    raise RowProblem(f"{at} must be a string, found {kind_of(value)}")


def check_order(roles: list[str], name: Callable[[int], str]) -> None:
    """Raise RowProblem when the turns break the order rules in the module docstring."""
    previous: str | None = None
    for index, role in enumerate(roles):
        here = name(index)
        if role == "system" and index:
            raise RowProblem(f"{here} is a system turn; a system turn may only come first")
        if role == "user" and previous == "user":
            raise RowProblem(
                f"{name(index - 1)} and {here} are both user turns;"
                " merge them or put the assistant's answer between them"
            )
        if role == "user" and previous == "tool":
            raise RowProblem(f"{here} is a user turn right after a tool turn; the assistant answers the tool first")
        if role == "assistant" and previous in (None, "system"):
            raise RowProblem(f"{here} is an assistant turn before any user turn; a conversation starts with the user")
        if role == "assistant" and previous == "assistant":
            raise RowProblem(
                f"{name(index - 1)} and {here} are both assistant turns; merge them or put a user turn between them"
            )
        if role == "tool" and previous not in ("assistant", "tool"):
            raise RowProblem(f"{here} is a tool turn that does not follow an assistant turn")
        previous = role
    if "assistant" not in roles:
        raise RowProblem("the conversation has no assistant turn to learn from")
    if previous != "assistant":
        raise RowProblem(
            f"the conversation ends with a {previous} turn ({name(len(roles) - 1)});"
            " it must end with the assistant's answer"
        )


# -- custom_format_mapping ------------------------------------------------------


def mapping_converter(mapping: dict[str, str]) -> Converter:
    """The converter for a custom_format_mapping; a mapping that cannot work raises config_invalid."""
    if not mapping:
        raise config_error("custom_format_mapping is empty: map at least a user column and an assistant column")
    groups: list[tuple[str, list[str]]] = []
    for column, role_name in mapping.items():
        role = role_name.strip().lower() if isinstance(role_name, str) else role_name
        if role not in MAPPING_ROLES:
            raise config_error(
                f"custom_format_mapping maps {quote(column)} to {quote(role_name)}; the roles are {', '.join(MAPPING_ROLES)}"
            )
        if groups and groups[-1][0] == role:
            groups[-1][1].append(column)
        else:
            groups.append((role, [column]))
    try:
        check_order([role for role, _ in groups], lambda i: f"{_names(groups[i][1])} ({groups[i][0]})")
    except RowProblem as problem:
        order = names(f"{excerpt(column, QUOTE_CHARS)} ({role})" for column, role in mapping.items())
        raise config_error(f"custom_format_mapping gives the turns in the order {order}: {problem.problem}") from None

    def convert(record: Row) -> Row:
        messages = []
        for role, columns in groups:
            parts = []
            for column in columns:
                if column not in record:
                    raise RowProblem(
                        f"missing the column {quote(column)}, which custom_format_mapping maps to {role}"
                        f" (found: {names(record) or 'nothing'})"
                    )
                value = record[column]
                if value is None:
                    continue
                if not isinstance(value, str):
                    raise RowProblem(f"{quote(column)} must be a string, found {kind_of(value)}")
                if value.strip():
                    parts.append(value)
            if parts:
                messages.append({"role": role, "content": "\n\n".join(parts)})
            elif role != "system":
                verb = "is" if len(columns) == 1 else "are"
                raise RowProblem(f"{_names(columns)} {verb} empty, so the {role} turn has no text")
        return {"messages": messages}

    return convert


def _names(columns: list[str]) -> str:
    return " and ".join(quote(c) for c in columns[:NAMES_SHOWN]) + (
        f" and {len(columns) - NAMES_SHOWN:,} more" if len(columns) > NAMES_SHOWN else ""
    )
