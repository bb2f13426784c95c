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

Conventions of the dumps people download (sharegpt and chatml), applied before the
turn order is checked and counted in `Notes` for the job's warnings: role names are
also read through ROLE_ALIASES, in any case (`Human`, `chatgpt`, `bing`, `bard`...);
turns whose text is empty or only spaces are dropped; assistant turns before the
first user turn are dropped (FastChat's rule); a conversation left without an
assistant turn (or with no turns) raises `EmptyConversation`, and the loader leaves
it out without counting it as a bad row. A role that is no alias is still a bad row
(`unknown_role`).

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
from finetune_studio.child.datasets.errors import (
    NAMES_SHOWN,
    QUOTE_CHARS,
    RowProblem,
    config_error,
    kind_of,
    names,
    quote,
)
from finetune_studio.conversations import CHAT_ROLES, OrderKind, is_text_part, order_problem

Row = dict[str, Any]

# The kinds of bad row (RowProblem.kind), as the job's error and status count them.
MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
EMPTY_FIELD = "empty_field"
WRONG_SHAPE = "wrong_shape"
UNKNOWN_ROLE = "unknown_role"
ORDER = "roles_out_of_order"
UNSUPPORTED_CONTENT = "unsupported_content"


class EmptyConversation(Exception):
    """A conversation with nothing to learn from once the conventions ran (no turns
    left, or no assistant turn): dropped and counted, not a bad row."""


class Notes:
    """What the conventions did to a source's conversations, counted for `details.warnings`."""

    def __init__(self) -> None:
        self.aliased_rows = 0
        self.aliases: dict[str, str] = {}  # name as found -> role, in the order first seen
        self.leading_assistant = 0
        self.empty_turn_rows = 0
        self.empty_turns = 0
        self.empty_conversations = 0
        self.identical_pairs = 0  # preference rows whose chosen answer is their rejected one (methods.py)

    def warnings(self) -> list[str]:
        said = []
        if self.identical_pairs:
            said.append(
                f"{self.identical_pairs:,} preference row{'s have' if self.identical_pairs > 1 else ' has'} the same"
                " chosen and rejected answer; they teach nothing"
                " (the preference loss cannot tell the two apart): fix them or remove them"
            )
        if self.aliased_rows:
            mapped = names(f"{name} -> {role}" for name, role in self.aliases.items())
            said.append(f"mapped role aliases in {self.aliased_rows:,} rows ({mapped})")
        if self.leading_assistant:
            said.append(
                f"dropped a leading assistant turn in {self.leading_assistant:,} conversations (FastChat's rule:"
                " a conversation starts with the user)"
            )
        if self.empty_turns:
            said.append(f"dropped {self.empty_turns:,} empty turns in {self.empty_turn_rows:,} conversations")
        if self.empty_conversations:
            said.append(
                f"dropped {self.empty_conversations:,} empty conversations (no turns, or no assistant turn, left)"
            )
        return said


Converter = Callable[[Row, Notes], Row]

SHAPES = ("alpaca", "sharegpt", "chatml", "raw")
CUSTOM = "custom"
MAPPING_ROLES = ("system", "user", "assistant")

CHATML_ROLES = CHAT_ROLES  # OpenAI's roles (finetune_studio.conversations), which the file store checks too
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
# Role names that dumps use (ShareGPT scrapes of ChatGPT, Bing and Bard, any case), as conventions.
ROLE_ALIASES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
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
        return lambda record, notes: _conversation(record, shape, notes)
    raise ValueError(f"unknown shape {shape!r}")


# -- alpaca and raw -------------------------------------------------------------


def _string(record: Row, key: str, *, required: bool = True) -> str:
    if key not in record:
        if required:
            raise RowProblem(f"missing the column {key!r} (found: {names(record) or 'nothing'})", MISSING_FIELD)
        return ""
    value = record[key]
    if value is None:
        if required:
            raise RowProblem(f"{key!r} is empty (null)", EMPTY_FIELD)
        return ""
    if not isinstance(value, str):
        raise RowProblem(f"{key!r} must be a string, found {kind_of(value)}", WRONG_TYPE)
    if required and not value.strip():
        raise RowProblem(f"{key!r} is empty", EMPTY_FIELD)
    return value


def _alpaca(record: Row, notes: Notes) -> Row:
    instruction = _string(record, "instruction")
    extra = _string(record, "input", required=False)
    output = _string(record, "output")
    system = _string(record, "system", required=False)
    prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
    if system.strip():
        messages.insert(0, {"role": "system", "content": system})
    return {"messages": messages}


def _raw(record: Row, notes: Notes) -> Row:
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


def _conversation(record: Row, shape: str, notes: Notes) -> Row:
    column = next((c for c in _LIST_COLUMNS[shape] if c in record), None)
    if column is None:
        raise RowProblem(
            f"missing the column {_LIST_COLUMNS[shape][0]!r} (found: {names(record) or 'nothing'})", MISSING_FIELD
        )
    turns = _maybe_json(record[column])
    if isinstance(turns, str):
        raise RowProblem(f"{column!r} must be a list of turns; found text that is not a JSON list", WRONG_TYPE)
    if not isinstance(turns, list):
        raise RowProblem(f"{column!r} must be a non-empty list of turns, found {kind_of(turns)}", WRONG_TYPE)
    role_key, content_key = _TURN_KEYS[shape]
    roles = CHATML_ROLES if shape == "chatml" else SHAREGPT_ROLES
    other = "sharegpt" if shape == "chatml" else "chatml"
    kept: list[tuple[int, dict[str, Any]]] = []  # (index in the row, message): names stay the row's
    aliased = False
    empty = 0
    for index, turn in enumerate(turns):
        at = f"{column}[{index}]"
        if not isinstance(turn, dict):
            raise RowProblem(
                f"{at} must be an object with {role_key!r} and {content_key!r}, found {kind_of(turn)}", WRONG_TYPE
            )
        if role_key not in turn:
            other_role, other_content = _TURN_KEYS[other]
            if other_role in turn:
                raise RowProblem(
                    f"{at} has {other_role!r} and {other_content!r}, the {other} shape; set format_type {other} or auto",
                    WRONG_SHAPE,
                )
            raise RowProblem(f"{at} has no {role_key!r} (found: {names(turn) or 'nothing'})", MISSING_FIELD)
        name = turn[role_key]
        role = roles.get(name) if isinstance(name, str) else None
        if role is None and isinstance(name, str):
            role = ROLE_ALIASES.get(name.strip().lower())
            if role is not None:
                aliased = True
                if len(notes.aliases) < NAMES_SHOWN:
                    notes.aliases.setdefault(excerpt(name, QUOTE_CHARS), role)
        if role is None:
            expected = ", ".join(list(roles) + [alias for alias in ROLE_ALIASES if alias not in roles])
            raise RowProblem(f"{at}.{role_key} is {quote(name)}; expected one of {expected}", UNKNOWN_ROLE)
        content = _content(turn.get(content_key), f"{at}.{content_key}")
        if not content.strip():
            empty += 1  # an empty turn teaches nothing; dropped, as FastChat and Axolotl do
            continue
        message: dict[str, Any] = {"role": role, "content": content}
        if shape == "chatml" and role == "assistant" and turn.get("weight") == 0 and not isinstance(turn["weight"], bool):
            # OpenAI's "context, not trained on": train_on_completions leaves it out of the loss (completions.py).
            message["weight"] = 0
        kept.append((index, message))
    notes.aliased_rows += aliased
    if empty:
        notes.empty_turns += empty
        notes.empty_turn_rows += 1
    start = 1 if kept and kept[0][1]["role"] == "system" else 0
    leading = 0
    while start + leading < len(kept) and kept[start + leading][1]["role"] == "assistant":
        leading += 1  # FastChat's rule: the conversation starts with the user, so an opening greeting goes
    if leading:
        del kept[start : start + leading]
        notes.leading_assistant += 1
    if not any(message["role"] == "assistant" for _, message in kept):
        notes.empty_conversations += 1
        raise EmptyConversation
    check_order([message["role"] for _, message in kept], lambda i: f"{column}[{kept[i][0]}]")
    return {"messages": [message for _, message in kept]}


def _content(value: Any, at: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # OpenAI content parts
        texts = []
        for index, part in enumerate(value):
            if not is_text_part(part):
                kind = quote(part.get("type")) if isinstance(part, dict) else repr(kind_of(part))
                raise RowProblem(f"{at}[{index}] is a {kind} part; only text parts are supported", UNSUPPORTED_CONTENT)
            texts.append(part["text"])
        return "".join(texts)
    if value is None:
        raise RowProblem(f"{at} is missing or null (tool calls without text are not supported)", MISSING_FIELD)
    raise RowProblem(f"{at} must be a string, found {kind_of(value)}", WRONG_TYPE)


def check_order(roles: list[str], name: Callable[[int], str]) -> None:
    """Raise RowProblem (kind roles_out_of_order) when the turns break the order rules
    in the module docstring (finetune_studio.conversations.order_problem)."""
    problem = order_problem(roles)
    if problem is not None:
        raise RowProblem(problem.text(_ORDER_WORDS, name), ORDER)


# The turn order's problems (finetune_studio.conversations) in a dataset row's words.
_ORDER_WORDS: dict[OrderKind, str] = {
    "system_not_first": "{here} is a system turn; a system turn may only come first",
    "two_user_turns": "{before} and {here} are both user turns; merge them or put the assistant's answer between them",
    "two_assistant_turns": "{before} and {here} are both assistant turns; merge them or put a user turn between them",
    "user_after_tool": "{here} is a user turn right after a tool turn; the assistant answers the tool first",
    "assistant_before_user": "{here} is an assistant turn before any user turn; a conversation starts with the user",
    "tool_without_assistant": "{here} is a tool turn that does not follow an assistant turn",
    "no_assistant": "the conversation has no assistant turn to learn from",
    "wrong_last": "the conversation ends with a {role} turn ({here}); it must end with the assistant's answer",
}


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

    def convert(record: Row, notes: Notes) -> Row:
        messages = []
        for role, columns in groups:
            parts = []
            for column in columns:
                if column not in record:
                    raise RowProblem(
                        f"missing the column {quote(column)}, which custom_format_mapping maps to {role}"
                        f" (found: {names(record) or 'nothing'})",
                        MISSING_FIELD,
                    )
                value = record[column]
                if value is None:
                    continue
                if not isinstance(value, str):
                    raise RowProblem(f"{quote(column)} must be a string, found {kind_of(value)}", WRONG_TYPE)
                if value.strip():
                    parts.append(value)
            if parts:
                messages.append({"role": role, "content": "\n\n".join(parts)})
            elif role != "system":
                verb = "is" if len(columns) == 1 else "are"
                raise RowProblem(f"{_names(columns)} {verb} empty, so the {role} turn has no text", EMPTY_FIELD)
        return {"messages": messages}

    return convert


def _names(columns: list[str]) -> str:
    return " and ".join(quote(c) for c in columns[:NAMES_SHOWN]) + (
        f" and {len(columns) - NAMES_SHOWN:,} more" if len(columns) > NAMES_SHOWN else ""
    )
