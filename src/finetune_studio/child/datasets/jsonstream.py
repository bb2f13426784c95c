"""Reading a large JSON array or JSON Lines file a piece at a time, and telling a cut-off file.

`TextWindow` decodes a UTF-8 file in chunks into a window of text that starts where
the caller has got to, and knows the line (and column) of any place in it, so a
reader holds one chunk plus the row it is decoding rather than the whole file (a
100 MB download is read in 1 MB steps). `document_items` yields the rows of a .json
dataset (a list of rows, or an object with one under "data") with the line each
starts on; it raises `DatasetError` for bad JSON or a wrong layout, in the words
the whole-file parse used, and `cut_off` for a document that ends before its closing
"]" or "}": an interrupted download or copy, which a user fixes by fetching the file
again, not by editing a row.

`looks_cut(exc, text)` says whether a parser error is the text running out (a
string, object or literal left open at its end) rather than a mistake in it.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from finetune_studio.child.datasets.errors import DatasetError, names

CHUNK_BYTES = 1 << 20
_SPACE = " \t\r\n"
_LITERAL_PREFIXES = frozenset(word[:n] for word in ("true", "false", "null") for n in range(1, len(word)))
_NUMBER_CHARS = frozenset("0123456789+-.eE")


class DepthExceeded(Exception):
    """The item at `where` is nested past what the parser reads."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.where = where


def cut_off(path: Path, line: int, rows: int) -> DatasetError:
    return DatasetError(
        path,
        "",
        f"is cut off at line {line} (truncated: an interrupted download or copy?);"
        f" the {rows:,} complete rows before the cut were read; fetch or copy the file again",
    )


def looks_cut(exc: json.JSONDecodeError, text: str) -> bool:
    """Whether the parser failed because `text` ends too early (more text could complete it)."""
    if exc.msg.startswith("Unterminated string"):  # no closing quote anywhere up to the end
        return True
    end = len(text.rstrip(_SPACE))
    rest = text[exc.pos : end]
    if not rest:
        return True
    if exc.msg.startswith("Invalid \\uXXXX escape") and end - exc.pos <= 6:
        return True
    return rest in _LITERAL_PREFIXES or (len(rest) <= 2 and set(rest) <= _NUMBER_CHARS)


class TextWindow:
    """A file's text from the reader's position on, decoded chunk by chunk.

    `text` holds what has been read and not yet dropped; positions are indexes into
    it. `drop(pos)` forgets the text before `pos` (keeping count of its lines), and
    `more()` appends the next chunk, at least as much again as the window holds, so
    a row larger than a chunk costs a few re-reads, not one per chunk.
    """

    def __init__(self, path: Path, stream: BinaryIO, not_utf8: Callable[[], DatasetError]) -> None:
        self.path = path
        self._stream = stream
        self._not_utf8 = not_utf8  # the error for a file that is not UTF-8, naming its first bad byte
        self._decoder = codecs.getincrementaldecoder("utf-8-sig")()
        self.text = ""
        self.eof = False
        self._line = 1  # the line of `_cursor`
        self._cursor = 0
        self._dropped_col = 0  # the column of text[0] within its line, counted from 0
        self.resume = 0  # where a reader of part of the document left off

    def more(self) -> bool:
        """Read more of the file into the window; False at the end of the file."""
        if self.eof:
            return False
        raw = self._stream.read(max(CHUNK_BYTES, len(self.text)))
        try:
            piece = self._decoder.decode(raw, final=not raw)
        except UnicodeDecodeError:
            raise self._not_utf8() from None
        if not raw:
            self.eof = True
        self.text += piece
        return bool(raw) or bool(piece)

    def skip_space(self, pos: int) -> int:
        """The first position at or after `pos` that is not whitespace, reading on as
        needed; len(text) when the file ends first."""
        while True:
            text = self.text
            while pos < len(text) and text[pos] in _SPACE:
                pos += 1
            if pos < len(text) or not self.more():
                return pos

    def drop(self, pos: int) -> int:
        """Forget the text before `pos`; returns the new position of what was at `pos`."""
        if pos < CHUNK_BYTES:  # not worth copying the window for
            return pos
        self.line_of(pos)
        newline = self.text.rfind("\n", 0, pos)
        self._dropped_col = pos - newline - 1 if newline >= 0 else self._dropped_col + pos
        self.text = self.text[pos:]
        self._cursor = 0
        return 0

    def line_of(self, pos: int) -> int:
        """The line of `pos`; positions asked for only move forwards, so counting is linear."""
        if pos < self._cursor:
            return self._line - self.text.count("\n", pos, self._cursor)
        self._line += self.text.count("\n", self._cursor, pos)
        self._cursor = pos
        return self._line

    def column_of(self, pos: int) -> int:
        """The column of `pos`, counted from 1."""
        newline = self.text.rfind("\n", 0, pos)
        return pos - newline if newline >= 0 else self._dropped_col + pos + 1

    def last_line(self) -> int:
        """The line of the last character that is not whitespace (the file has been read to its end)."""
        end = len(self.text.rstrip(_SPACE))
        return self.line_of(max(end - 1, 0))

    def bad_json(self, msg: str, pos: int, hint: str = "") -> DatasetError:
        return DatasetError(
            self.path, f"line {self.line_of(pos)}", f"bad JSON ({msg} at column {self.column_of(pos)}){hint}"
        )


def document_items(window: TextWindow, start: int) -> Iterator[tuple[int, Any]]:
    """(line, value) of each row of the document that starts at `start` with "[" (a
    list of rows) or "{" (the list under its "data" key), then checks that only
    whitespace follows it."""
    if window.text.startswith("[", start):
        yield from array_items(window, start)
    else:
        yield from _data_items(window, start)
    _check_end(window)


def _check_end(window: TextWindow) -> None:
    """Only whitespace may follow the document (which ended at `window.resume`)."""
    pos = window.skip_space(window.drop(window.resume))
    if pos < len(window.text):
        hint = "; the file looks like JSON Lines (one object per line): name it .jsonl"
        raise window.bad_json("Extra data", pos, hint)


def _data_items(window: TextWindow, pos: int) -> Iterator[tuple[int, Any]]:
    """The rows of the list under the "data" key of the object at `pos`; the other
    keys' values are read and dropped."""
    keys: list[str] = []
    rows = 0
    streamed = False
    pos = _next(window, pos + 1, rows)
    while window.text[pos] != "}":
        pos = window.drop(pos)
        if window.text[pos] != '"':
            raise window.bad_json("Expecting property name enclosed in double quotes", pos)
        key, end = _decode(window, pos, rows, None)
        keys.append(key)
        colon = _next(window, end, rows)
        if window.text[colon] != ":":
            raise window.bad_json("Expecting ':' delimiter", colon)
        at = _next(window, colon + 1, rows)
        if key == "data" and streamed:
            raise DatasetError(window.path, f"line {window.line_of(pos)}", 'names the key "data" twice; keep one')
        if key == "data" and window.text[at] == "[":
            for item in array_items(window, at):
                rows += 1
                yield item
            streamed = True
            end = window.resume
        else:
            _, end = _decode(window, at, rows, None)
        after = _next(window, end, rows)
        if window.text[after] == "}":
            pos = after
            break
        if window.text[after] != ",":
            raise window.bad_json("Expecting ',' delimiter", after)
        pos = _next(window, after + 1, rows)
        if window.text[pos] == "}":  # a trailing comma
            raise window.bad_json("Expecting property name enclosed in double quotes", pos)
    window.resume = pos + 1
    if not streamed:
        found = f"an object with the keys {names(dict.fromkeys(keys), quoted=True) or '(none)'}"
        _check_end(window)  # first: a JSON Lines file named .json is the likelier mistake
        raise DatasetError(
            window.path, "", f'a .json dataset must be a list of rows, or {{"data": [rows]}}; found {found}'
        )


def _next(window: TextWindow, pos: int, rows: int) -> int:
    """The next character that is not whitespace; a file that ends first is cut off."""
    pos = window.skip_space(pos)
    if pos >= len(window.text):
        raise cut_off(window.path, window.last_line(), rows)
    return pos


def _decode(window: TextWindow, pos: int, rows: int, row: int | None) -> tuple[Any, int]:
    """The JSON value at `pos` and where it ends, reading on while the window holds only part of it."""
    while True:
        try:
            value, end = _DECODER.raw_decode(window.text, pos)
        except json.JSONDecodeError as exc:
            if looks_cut(exc, window.text) and window.more():
                continue
            if looks_cut(exc, window.text):
                raise cut_off(window.path, window.last_line(), rows) from None
            raise window.bad_json(exc.msg, exc.pos) from None
        except RecursionError:
            where = f"line {window.line_of(pos)}" + (f" (row {row})" if row is not None else "")
            raise DepthExceeded(where) from None
        # A number at the window's end may go on in the next chunk: decode it again then.
        if end < len(window.text) or not window.more():
            return value, end


_DECODER = json.JSONDecoder()


def array_items(window: TextWindow, pos: int) -> Iterator[tuple[int, Any]]:
    """(line, value) of each item of the JSON array whose "[" is at `pos`; then
    `window.resume` is the position after its "]"."""
    index = 0
    pos = _next(window, pos + 1, index)
    if window.text[pos] == "]":
        window.resume = pos + 1
        return
    while True:
        pos = window.drop(pos)
        value, end = _decode(window, pos, index, index)
        yield window.line_of(pos), value
        index += 1
        after = _next(window, end, index)
        mark = window.text[after]
        if mark == "]":
            window.resume = after + 1
            return
        if mark != ",":
            raise window.bad_json("Expecting ',' delimiter", after)
        pos = _next(window, after + 1, index)
        if window.text[pos] == "]":
            raise window.bad_json("Illegal trailing comma before end of array", after)
