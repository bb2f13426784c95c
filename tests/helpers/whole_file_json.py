"""The whole-file `.json` reader that the streaming one (`child/datasets/jsonstream.py`)
replaced, kept as the yardstick: tests/unit/test_large_files.py checks that streaming
yields the same rows and the same errors, and bench/peak_memory.py's `whole` mode
measures its memory. No product path runs it, which is why it lives here and not under src/.

`json_records(path, whole_text(path))` reads the whole text, parses it with json.loads,
and yields `(where, record)` as `read_records` does ("line N (row M)"); a value nested
past the parser's depth is found by walking the rows one by one.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from finetune_studio.child.datasets.errors import NESTED_TOO_DEEPLY, BadRecord, DatasetError, kind_of, names
from finetune_studio.child.datasets.files import bad_document

Record = tuple[str, Any]


def whole_text(path: Path) -> str:
    """The file's text, read whole as the old reader read it (the bytes, then the text)."""
    return path.read_bytes().decode("utf-8-sig")


def json_records(path: Path, text: str) -> Iterator[Record]:
    lines = _LineIndex(text)
    try:
        yield from _json_rows(path, text, lines)
    except _NestedTooDeeply as deep:
        where = f"line {lines.line_of(deep.offset)}" + (f" (row {deep.row})" if deep.row is not None else "")
        raise DatasetError(path, where, NESTED_TOO_DEEPLY) from None


def _json_rows(path: Path, text: str, lines: _LineIndex) -> Iterator[Record]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_document(path, exc) from None
    except RecursionError:
        # Somewhere a value is nested too deeply: read the rows one by one to find its row.
        yield from _json_rows_around_depth(path, text, lines)
        raise DatasetError(path, "", NESTED_TOO_DEEPLY) from None  # not inside a row: the layout itself

    if isinstance(document, list):
        array_at = _skip_space(text, 0)
    elif isinstance(document, dict) and isinstance(document.get("data"), list):
        array_at = _value_offset(text, "data")
    else:
        found = kind_of(document)
        if isinstance(document, dict):
            found += f" with the keys {names(document, quoted=True) or '(none)'}"
        raise DatasetError(path, "", f'a .json dataset must be a list of rows, or {{"data": [rows]}}; found {found}')
    yield from _rows_of(path, text, array_at, lines)


def _json_rows_around_depth(path: Path, text: str, lines: _LineIndex) -> Iterator[Record]:
    """The rows of a document json.loads gave up on, as far as they read: the row
    nested too deeply raises `_NestedTooDeeply` where it starts."""
    start = _skip_space(text, 0)
    if text.startswith("[", start):
        yield from _rows_of(path, text, start, lines)
    elif text.startswith("{", start):
        array_at = _value_offset(text, "data")
        if array_at >= 0 and text.startswith("[", array_at):
            yield from _rows_of(path, text, array_at, lines)


def _rows_of(path: Path, text: str, array_at: int, lines: _LineIndex) -> Iterator[Record]:
    for index, (offset, value) in enumerate(_array_items(text, array_at)):
        where = f"line {lines.line_of(offset)} (row {index})"
        if not isinstance(value, dict):
            yield where, BadRecord(f"each row must be a JSON object, found {kind_of(value)}", "wrong_type")
            continue
        yield where, value


class _NestedTooDeeply(Exception):
    """A value at `offset` (the `row`-th item of the rows, if it is one) is nested past the parser's depth."""

    def __init__(self, offset: int, row: int | None) -> None:
        super().__init__(offset, row)
        self.offset = offset
        self.row = row


class _LineIndex:
    def __init__(self, text: str) -> None:
        self._starts = [0]
        position = text.find("\n")
        while position != -1:
            self._starts.append(position + 1)
            position = text.find("\n", position + 1)

    def line_of(self, offset: int) -> int:
        return bisect.bisect_right(self._starts, offset)


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


def _array_items(text: str, at: int) -> Iterator[tuple[int, Any]]:
    """(offset, value) of each item of the JSON array at `at`; the text is known to be
    valid JSON as far as the parser's depth allows."""
    decoder = json.JSONDecoder()
    at = _skip_space(text, at + 1)  # past "["
    index = 0
    while text[at] != "]":
        try:
            value, end = decoder.raw_decode(text, at)
        except RecursionError:
            raise _NestedTooDeeply(at, index) from None
        yield at, value
        index += 1
        at = _skip_space(text, end)
        if text[at] == ",":
            at = _skip_space(text, at + 1)


def _value_offset(text: str, key: str) -> int:
    """Where the value of the top-level object's `key` starts (the last one, as json.loads keeps)."""
    decoder = json.JSONDecoder()
    at = _skip_space(text, _skip_space(text, 0) + 1)  # past "{"
    found = -1
    while text[at] != "}":
        name, at = decoder.raw_decode(text, at)
        at = _skip_space(text, _skip_space(text, at) + 1)  # past ":"
        if name == key:
            found = at
        try:
            _, at = decoder.raw_decode(text, at)
        except RecursionError:
            if name == key:
                return found  # its rows, read one by one, say which is too deep
            raise _NestedTooDeeply(at, None) from None
        at = _skip_space(text, at)
        if text[at] == ",":
            at = _skip_space(text, at + 1)
    return found
