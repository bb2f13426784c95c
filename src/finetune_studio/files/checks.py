"""What an uploaded file must be, by purpose; checked once, when it is uploaded.

- `fine-tune`: JSONL in one of OpenAI's fine-tuning formats, every line checked:
  - chat: `{"messages": [{"role", "content", "weight"?}, ...]}`: roles `system`
    (or `developer`), `user`, `assistant`; content a string or text parts; turns in
    the order a chat template renders (a system turn only first, users and
    assistants taking turns, ending with the assistant); `weight` (0 or 1) only on
    assistant turns, 0 meaning "context, not trained on"; at least one trained turn.
  - preference (DPO): `{"input": {"messages": [...]}, "preferred_output": [{assistant}],
    "non_preferred_output": [{assistant}]}`, the input ending with a user turn.
  A file holds one format. Tool calls and tool turns are refused: this server
  trains text turns only.
- `studio`: any file the studio's dataset reader takes (.jsonl .json .csv .parquet
  .txt): UTF-8 text (JSONL: an object per line) or a Parquet file; the job that
  reads it checks its rows.

A bad file raises `InvalidFile` naming each bad line (the first few) and what is
wrong there. The file is read a line at a time, so its size costs no memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, get_args

from finetune_studio.conversations import CHAT_ROLES, DATASET_SUFFIXES, OrderKind, is_text_part, order_problem
from finetune_studio.errors import InvalidFile

Purpose = Literal["fine-tune", "studio"]
PURPOSES: tuple[str, ...] = get_args(Purpose)
# The suffixes the training child's dataset reader takes (finetune_studio.conversations).
STUDIO_SUFFIXES = DATASET_SUFFIXES
# Bad lines named in one refusal; the rest are counted.
NAMED_PROBLEMS = 5
# Characters of a line's JSON error or a role quoted back.
_QUOTE = 60


@dataclass(frozen=True)
class FileFacts:
    """What the check found: the format (`chat` | `preference` for fine-tune files, the
    suffix for studio files), the rows, and whether any assistant turn has weight 0."""

    format: str
    rows: int
    weighted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "rows": self.rows, "weighted": self.weighted}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileFacts:
        return cls(format=str(data["format"]), rows=int(data["rows"]), weighted=bool(data.get("weighted", False)))


class _RowProblem(Exception):
    pass


def check_file(path: Path, purpose: str, filename: str) -> FileFacts:
    """Check the file at `path` (uploaded as `filename`) for `purpose`, or raise InvalidFile."""
    if purpose == "fine-tune":
        return check_fine_tune(path, filename)
    if purpose == "studio":
        return check_studio(path, filename)
    raise InvalidFile(
        f"purpose {purpose!r} is not one this server keeps files for: use \"fine-tune\" (OpenAI's chat or preference"
        " JSONL, for /v1/fine_tuning/jobs) or \"studio\" (any dataset file the studio reads)",
        param="purpose",
    )


# -- fine-tune ------------------------------------------------------------------


def check_fine_tune(path: Path, filename: str) -> FileFacts:
    found: Optional[str] = None  # the file's format, from its first row
    first_line = 0
    rows = 0
    weighted = False
    problems: list[str] = []
    bad = 0
    for number, line in _lines(path):
        try:
            row = _json_object(line)
            kind = _format_of(row)
            if found is None:
                found, first_line = kind, number
            elif kind != found:
                raise _RowProblem(
                    f"is in the {kind} format but line {first_line} is in the {found} format; a file holds one format"
                )
            weighted = (_check_chat(row) if kind == "chat" else _check_preference(row)) or weighted
            rows += 1
        except _RowProblem as problem:
            bad += 1
            if len(problems) < NAMED_PROBLEMS:
                problems.append(f"line {number} {problem}")
    if bad:
        more = f"; and {bad - len(problems)} more bad lines" if bad > len(problems) else ""
        raise InvalidFile(f"{filename} is not a valid fine-tuning file: {'; '.join(problems)}{more}", param="file")
    if found is None:
        raise InvalidFile(
            f"{filename} holds no rows: a fine-tuning file has one JSON object per line, e.g."
            ' {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}',
            param="file",
        )
    return FileFacts(format=found, rows=rows, weighted=weighted)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line; a line that is not UTF-8 is reported as such."""
    with path.open("rb") as stream:
        for number, raw in enumerate(stream, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidFile(
                    f"line {number} is not UTF-8 text (byte {exc.start + 1} of the line): save the file as UTF-8",
                    param="file",
                ) from None
            if text.strip():
                yield number, text


def _json_object(line: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _RowProblem(f"is not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise _RowProblem(f"must be a JSON object, found {_kind(row)}")
    return row


def _format_of(row: dict[str, Any]) -> str:
    if "messages" in row:
        return "chat"
    if "input" in row or "preferred_output" in row or "non_preferred_output" in row:
        return "preference"
    keys = ", ".join(repr(key)[:_QUOTE] for key in list(row)[:8]) or "nothing"
    raise _RowProblem(
        f"has neither \"messages\" (OpenAI's chat format) nor \"input\", \"preferred_output\" and"
        f" \"non_preferred_output\" (its preference format, for DPO); found {keys}"
    )


def _check_chat(row: dict[str, Any]) -> bool:
    """Check one chat row; True when an assistant turn has weight 0."""
    messages = row["messages"]
    if not isinstance(messages, list) or not messages:
        raise _RowProblem(f"\"messages\" must be a non-empty list of messages, found {_kind(messages)}")
    roles = []
    trained = 0
    weighted = False
    for index, message in enumerate(messages):
        at = f"messages[{index}]"
        role = _message(message, at)
        if "weight" in message:
            weight = message["weight"]
            if role != "assistant":
                raise _RowProblem(f"{at} has a weight, but only assistant messages take one")
            if isinstance(weight, bool) or weight not in (0, 1):
                raise _RowProblem(f"{at}.weight is {json.dumps(weight)[:_QUOTE]}; it must be 0 (not trained on) or 1")
            weighted = weighted or weight == 0
        if role == "assistant" and message.get("weight", 1) == 1:
            trained += 1
        roles.append(role)
    _check_order(roles, "assistant")
    if not trained:
        raise _RowProblem("has weight 0 on every assistant message, so there is nothing to train on")
    return weighted


def _check_preference(row: dict[str, Any]) -> bool:
    given = row.get("input")
    if not isinstance(given, dict) or "messages" not in given:
        raise _RowProblem(f"\"input\" must be an object with \"messages\", found {_kind(given)}")
    messages = given["messages"]
    if not isinstance(messages, list) or not messages:
        raise _RowProblem(f"input.messages must be a non-empty list of messages, found {_kind(messages)}")
    roles = [_message(message, f"input.messages[{index}]") for index, message in enumerate(messages)]
    _check_order(roles, "user", "input.messages")
    for key in ("preferred_output", "non_preferred_output"):
        output = row.get(key)
        if not isinstance(output, list) or len(output) != 1:
            raise _RowProblem(f"\"{key}\" must be a list of one assistant message, found {_kind(output)}")
        if _message(output[0], f"{key}[0]") != "assistant":
            raise _RowProblem(f"{key}[0] must be an assistant message")
    return False


def _message(message: Any, at: str) -> str:
    """The role of one message (system for developer), after checking its shape."""
    if not isinstance(message, dict):
        raise _RowProblem(f"{at} must be an object with \"role\" and \"content\", found {_kind(message)}")
    role = message.get("role")
    if role in ("tool", "function") or "tool_calls" in message or "function_call" in message:
        raise _RowProblem(f"{at} is a tool call or tool result; this server trains on text messages only: remove it")
    if not isinstance(role, str) or role not in CHAT_ROLES:  # tool turns were refused above
        shown = json.dumps(role)[:_QUOTE] if role is not None else "missing"
        raise _RowProblem(f"{at}.role is {shown}; expected system, developer, user or assistant")
    content = message.get("content")
    if isinstance(content, list):
        for index, part in enumerate(content):
            if not is_text_part(part):
                raise _RowProblem(f"{at}.content[{index}] is not a text part ({{\"type\": \"text\", \"text\": ...}})")
        content = "".join(part["text"] for part in content)
    if not isinstance(content, str):
        raise _RowProblem(f"{at}.content must be text, found {_kind(content)}")
    if not content.strip():
        raise _RowProblem(f"{at}.content is empty")
    return CHAT_ROLES[role]


# The turn order's problems (finetune_studio.conversations) in an upload's words.
_ENDS = "ends with a {role} message ({here}); it must end with the assistant's"
_ORDER_WORDS: dict[OrderKind, str] = {
    "system_not_first": "has a system message at {here}; a system message may only come first",
    "two_user_turns": "has two user messages in a row ({before} and {here}): merge them",
    "two_assistant_turns": "has two assistant messages in a row ({before} and {here}): merge them",
    "assistant_before_user": "has an assistant message at {here} before any user message",
    "user_after_tool": "has a tool message before {here}",  # never: tool messages are refused first
    "tool_without_assistant": "has a tool message at {here}",  # never, as above
    "no_assistant": _ENDS,
    "wrong_last": _ENDS,
}
# A preference row's input ends with the user's message, which its outputs answer.
_INPUT_WORDS: dict[OrderKind, str] = {
    **_ORDER_WORDS,
    "wrong_last": "input.messages ends with a {role} message; it must end with the user's, which the outputs answer",
}


def _check_order(roles: list[str], last: str, where: str = "messages") -> None:
    """The turn order (finetune_studio.conversations), ending with `last`'s message."""
    problem = order_problem(roles, last)
    if problem is not None:
        words = _INPUT_WORDS if last == "user" else _ORDER_WORDS
        raise _RowProblem(problem.text(words, lambda index: f"{where}[{index}]"))


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


# -- studio ---------------------------------------------------------------------


def check_studio(path: Path, filename: str) -> FileFacts:
    suffix = Path(filename).suffix.lower()
    if suffix not in STUDIO_SUFFIXES:
        raise InvalidFile(
            f"{filename}: the studio reads {', '.join(STUDIO_SUFFIXES)} files; name the file with one of these endings",
            param="file",
        )
    if suffix == ".parquet":
        size = path.stat().st_size
        with path.open("rb") as stream:
            head = stream.read(4)
            stream.seek(max(size - 4, 0))
            tail = stream.read(4)
        if size < 8 or head != b"PAR1" or tail != b"PAR1":
            raise InvalidFile(f"{filename} is not a Parquet file (it lacks Parquet's PAR1 marks)", param="file")
        return FileFacts(format="parquet", rows=0)
    rows = 0
    problems: list[str] = []
    for number, line in _lines(path):
        rows += 1
        if suffix == ".jsonl" and len(problems) < NAMED_PROBLEMS:
            try:
                _json_object(line)
            except _RowProblem as problem:
                problems.append(f"line {number} {problem}")
    if problems:
        raise InvalidFile(f"{filename} is not valid JSONL: {'; '.join(problems)}", param="file")
    if not rows:
        raise InvalidFile(f"{filename} is empty", param="file")
    return FileFacts(format=suffix.lstrip("."), rows=rows if suffix in (".jsonl", ".txt") else 0)
