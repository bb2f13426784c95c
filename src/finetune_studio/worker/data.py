"""Reading and checking local datasets, and turning every shape into one of two.

Every row is read and checked before any training step. A bad row raises
`DatasetError` naming the file, the line (or array index) and what is wrong, so the
user can fix the file without guessing. Rows come out either conversational
(`{"messages": [{"role", "content"}, ...]}`), which the trainer renders with the
model's chat template, or plain text (`{"text": ...}`).

Shapes: `alpaca` (instruction, input, output), `chatml` (OpenAI `messages`),
`sharegpt` (`conversations` of `from`/`value`), `raw` (`text`), and `auto`, which
picks one from the first row's columns.

This module imports neither torch nor transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from finetune_studio.worker.protocol import JobFailure

SHAPES = ("alpaca", "chatml", "sharegpt", "raw")
ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "tool": "tool", "function_call": "assistant", "observation": "tool"}
SUFFIXES = (".jsonl", ".json")


class DatasetError(JobFailure):
    def __init__(self, path: Path, where: str, problem: str) -> None:
        location = f"{path}, {where}" if where else str(path)
        super().__init__("dataset_invalid", f"{location}: {problem}")
        self.path = path
        self.where = where
        self.problem = problem


@dataclass
class LoadedData:
    rows: list[dict[str, Any]]
    shape: str
    per_file: dict[str, int] = field(default_factory=dict)

    @property
    def is_conversational(self) -> bool:
        return self.shape != "raw"


def detect_shape(row: dict[str, Any]) -> str | None:
    keys = set(row)
    if "messages" in keys:
        return "chatml"
    if "conversations" in keys:
        return "sharegpt"
    if {"instruction", "output"} <= keys:
        return "alpaca"
    if "text" in keys:
        return "raw"
    return None


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, value) for every record of a JSONL or JSON file; `where` names the line or index."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DatasetError(path, "", "the file does not exist") from None
    except IsADirectoryError:
        raise DatasetError(path, "", "is a folder; name the dataset file itself") from None
    except OSError as exc:
        raise DatasetError(path, "", f"cannot be read ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DatasetError(path, f"line {line}", "is not valid UTF-8 text") from None
    if not text.strip():
        raise DatasetError(path, "", "the file is empty")

    if path.suffix.lower() == ".json":
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError(path, f"line {exc.lineno}", f"bad JSON ({exc.msg})") from None
        if not isinstance(value, list):
            raise DatasetError(path, "", f"a .json dataset must be a list of rows, found a {type(value).__name__}")
        for index, item in enumerate(value):
            yield f"row {index}", item
        return

    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"line {number}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(path, f"line {number}", f"bad JSON ({exc.msg} at column {exc.colno})") from None


def _text(row: dict[str, Any], key: str, fail: Callable[[str], DatasetError], *, required: bool = True) -> str:
    value = row.get(key)
    if value is None:
        if required:
            raise fail(f"missing the column {key!r} (found: {', '.join(sorted(row)) or 'nothing'})")
        return ""
    if not isinstance(value, str):
        raise fail(f"{key!r} must be a string, found {type(value).__name__}")
    if required and not value.strip():
        raise fail(f"{key!r} is empty")
    return value


def _check_turns(messages: list[dict[str, str]], fail: Callable[[str], DatasetError]) -> None:
    if not any(m["role"] == "assistant" for m in messages):
        raise fail("the conversation has no assistant turn to learn from")
    for index, message in enumerate(messages):
        if message["role"] == "system" and index != 0:
            raise fail(f"turn {index}: a system message may only come first")


def convert_row(row: Any, shape: str, fail: Callable[[str], DatasetError]) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise fail(f"each row must be a JSON object, found {type(row).__name__}")
    if shape == "alpaca":
        instruction = _text(row, "instruction", fail)
        extra = _text(row, "input", fail, required=False)
        output = _text(row, "output", fail)
        prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
        if isinstance(row.get("system"), str) and row["system"].strip():
            messages.insert(0, {"role": "system", "content": row["system"]})
        return {"messages": messages}
    if shape == "raw":
        return {"text": _text(row, "text", fail)}

    key, role_key, content_key = ("messages", "role", "content") if shape == "chatml" else ("conversations", "from", "value")
    turns = row.get(key)
    if turns is None:
        raise fail(f"missing the column {key!r} (found: {', '.join(sorted(row)) or 'nothing'})")
    if not isinstance(turns, list) or not turns:
        raise fail(f"{key!r} must be a non-empty list of turns")
    messages = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise fail(f"{key}[{index}] must be an object with {role_key!r} and {content_key!r}")
        role = turn.get(role_key)
        content = turn.get(content_key)
        if shape == "sharegpt":
            if role not in SHAREGPT_ROLES:
                raise fail(f"{key}[{index}].{role_key} is {role!r}; expected one of {', '.join(SHAREGPT_ROLES)}")
            role = SHAREGPT_ROLES[role]
        elif role not in ROLES:
            raise fail(f"{key}[{index}].{role_key} is {role!r}; expected one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise fail(f"{key}[{index}].{content_key} must be a string, found {type(content).__name__}")
        messages.append({"role": role, "content": content})
    _check_turns(messages, fail)
    return {"messages": messages}


def load_local(paths: list[str], format_type: str) -> LoadedData:
    """Read, check and convert every row of every file; raises DatasetError on the first bad one."""
    if not paths:
        raise JobFailure("config_invalid", "local_datasets is empty: name at least one dataset file")
    shape = None if format_type == "auto" else format_type
    rows: list[dict[str, Any]] = []
    per_file: dict[str, int] = {}
    for name in paths:
        path = Path(name).expanduser()
        if path.suffix.lower() not in SUFFIXES:
            raise DatasetError(path, "", f"unsupported file type {path.suffix or '(none)'}; use {' or '.join(SUFFIXES)}")
        count = 0
        for where, record in _records(path):

            def fail(problem: str, where: str = where, path: Path = path) -> DatasetError:
                return DatasetError(path, where, problem)

            if shape is None:
                if not isinstance(record, dict):
                    raise fail(f"each row must be a JSON object, found {type(record).__name__}")
                shape = detect_shape(record)
                if shape is None:
                    raise fail(
                        f"cannot tell the dataset's shape from its columns ({', '.join(sorted(record)) or 'none'});"
                        " expected messages (chatml), conversations (sharegpt), instruction+output (alpaca) or text (raw)"
                    )
            rows.append(convert_row(record, shape, fail))
            count += 1
        if count == 0:
            raise DatasetError(path, "", "the file has no rows")
        per_file[str(path)] = count
    assert shape is not None
    return LoadedData(rows=rows, shape=shape, per_file=per_file)
