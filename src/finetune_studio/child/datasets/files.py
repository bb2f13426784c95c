"""Reading local dataset files into records, each with where it came from.

`read_records(path)` yields `(where, record)` for every record of a `.jsonl`,
`.json`, `.csv`, `.parquet` or `.txt` file, and raises `DatasetError` for anything
that stops the file from being read: it does not exist, it is empty, it is not
UTF-8, a line is not JSON, a CSV row has the wrong number of fields... What a record
must contain is the shapes' business (`shapes.py`), not this module's.

- `.jsonl`: one JSON object per line; blank lines are skipped. where: "line N".
  Read line by line; a last line cut short (no line break, and the text ends inside
  a value) is a cut-off file (`jsonstream.cut_off`), not a bad row.
- `.json`: a list of objects, or an object whose "data" key holds that list (the
  layout `datasets.load_dataset("json", field="data")` reads). where: "line N (row
  M)": the line the object starts on, and its index in the list. Read a chunk at a
  time (`jsonstream.py`), so a 100 MB file costs one chunk and one row, not copies
  of the file; a document that ends early is named as cut off.
- `.csv`: a header line, then one record per row (a quoted field may span lines);
  every cell is a string; rows whose cells are all empty are skipped. where: "line
  N", the line the row starts on.
- `.parquet`: one record per row, read in batches with pyarrow. where: "row N".
- `.txt`: raw text, one record `{"text": ...}` per paragraph; paragraphs are
  separated by blank lines, and the lines of a paragraph keep their line breaks.
  where: "line N", the paragraph's first line.

Lines count from 1, as editors count; rows count from 0, as pandas, pyarrow and
`datasets` count (and as dataset_slice_start does).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from finetune_studio.child.datasets.errors import (
    NESTED_TOO_DEEPLY,
    BadRecord,
    DatasetError,
    first_line,
    kind_of,
    names,
    quote,
)
from finetune_studio.child.datasets.jsonstream import DepthExceeded, TextWindow, cut_off, document_items, looks_cut
from finetune_studio.conversations import DATASET_SUFFIXES

Record = tuple[str, Any]

SUFFIXES = DATASET_SUFFIXES  # the file store takes the same (finetune_studio.conversations)
TEXT_SUFFIX = ".txt"
_PARQUET_BATCH_ROWS = 2048


def read_records(path: Path) -> Iterator[Record]:
    _check_file(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        kind = f"file type {path.suffix}" if path.suffix else "file without an extension"
        raise DatasetError(path, "", f"unsupported {kind}; use {', '.join(SUFFIXES)}")
    if suffix == ".parquet":
        return _parquet_records(path)
    if suffix in (".jsonl", ".json"):
        # Read a piece at a time: these are the files that reach hundreds of megabytes.
        _check_start(path)
        return _jsonl_records(path) if suffix == ".jsonl" else _json_file_records(path)
    text = _read_text(path)
    if suffix == ".csv":
        return _csv_records(path, text)
    return _txt_records(text)


def _check_file(path: Path) -> None:
    """Fail with the same words for every file type when the file itself is the problem."""
    try:
        if path.is_dir():
            raise DatasetError(path, "", "is a folder; name the dataset files in it, or name the folder in hf_dataset")
        size = path.stat().st_size
    except FileNotFoundError:
        raise DatasetError(path, "", "the file does not exist") from None
    except OSError as exc:
        raise DatasetError(path, "", f"cannot be read ({exc.strerror or exc})") from None
    if size == 0:
        raise DatasetError(path, "", "the file is empty")


def _check_start(path: Path) -> None:
    """What `_read_text` checks first (not empty, not UTF-16), without reading the whole file."""
    try:
        with path.open("rb") as stream:
            head = stream.read(2)
            if head in (b"\xff\xfe", b"\xfe\xff"):
                raise DatasetError(path, "", "is UTF-16 text; save it as UTF-8")
            while head:
                if head.strip():
                    return
                head = stream.read(1 << 16)
    except OSError as exc:
        raise DatasetError(path, "", f"cannot be read ({exc.strerror or exc})") from None
    raise DatasetError(path, "", "the file is empty")


def _not_utf8(path: Path) -> DatasetError:
    """The error for a file a streaming reader found not to be UTF-8, naming the
    first bad byte as a whole-file read does (it raises)."""
    _read_text(path)
    return DatasetError(path, "", "is not valid UTF-8 text; save the file as UTF-8")


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DatasetError(path, "", f"cannot be read ({exc.strerror or exc})") from None
    if not raw.strip():
        raise DatasetError(path, "", "the file is empty")
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise DatasetError(path, "", "is UTF-16 text; save it as UTF-8")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line_start = raw.rfind(b"\n", 0, exc.start) + 1
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DatasetError(
            path,
            f"line {line}",
            f"is not valid UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start - line_start + 1});"
            " save the file as UTF-8",
        ) from None


# -- JSON Lines ---------------------------------------------------------------


def _jsonl_records(path: Path) -> Iterator[Record]:
    rows = 0
    for number, line, ended in _text_lines(path):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            problem = f"bad JSON ({exc.msg} at column {exc.colno})"
            if line.strip() in ("{", "[") or (number == 1 and line.lstrip().startswith("[")):
                # Not one bad line: the whole file is in the wrong format.
                raise DatasetError(
                    path, f"line {number}", f"{problem}; the file looks like one JSON document: name it .json"
                ) from None
            if not ended and looks_cut(exc, line):
                raise cut_off(path, number, rows) from None
            rows += 1
            yield f"line {number}", BadRecord(problem, "bad_json")
            continue
        except RecursionError:
            rows += 1
            yield f"line {number}", BadRecord(NESTED_TOO_DEEPLY, "nested_too_deeply")
            continue
        rows += 1
        if not isinstance(value, dict):
            problem = f"each line must hold one JSON object, found {kind_of(value)}"
            if isinstance(value, list) and number == 1 and all(isinstance(item, dict) for item in value):
                raise DatasetError(
                    path, f"line {number}", f"{problem}; the file looks like one JSON document: name it .json"
                )
            yield f"line {number}", BadRecord(problem, "wrong_type")
            continue
        yield f"line {number}", value


def _text_lines(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(number, line, whether a line break ends it) of each line of a UTF-8 file, read
    line by line; lines are what str.splitlines makes of the whole text."""
    number = 0
    try:
        with path.open("rb") as stream:
            for raw in stream:  # split at b"\n", which no other UTF-8 character contains
                try:
                    piece = raw.decode("utf-8-sig" if number == 0 else "utf-8")
                except UnicodeDecodeError:
                    raise _not_utf8(path) from None
                for full in piece.splitlines(keepends=True):
                    number += 1
                    line = full.splitlines()[0]
                    yield number, line, line != full
    except OSError as exc:
        raise DatasetError(path, "", f"cannot be read ({exc.strerror or exc})") from None


# -- JSON ---------------------------------------------------------------------


def _json_file_records(path: Path) -> Iterator[Record]:
    """A list of rows, or an object with one under "data", is read a piece at a time;
    anything else (a mistake) is read whole, as the messages about it need the whole document."""
    try:
        with path.open("rb") as stream:
            window = TextWindow(path, stream, lambda: _not_utf8(path))
            start = window.skip_space(0)
            if window.text.startswith(("[", "{"), start):
                try:
                    for index, (line, value) in enumerate(document_items(window, start)):
                        where = f"line {line} (row {index})"
                        if not isinstance(value, dict):
                            problem = f"each row must be a JSON object, found {kind_of(value)}"
                            yield where, BadRecord(problem, "wrong_type")
                            continue
                        yield where, value
                except DepthExceeded as deep:
                    raise DatasetError(path, deep.where, NESTED_TOO_DEEPLY) from None
                return
    except OSError as exc:
        raise DatasetError(path, "", f"cannot be read ({exc.strerror or exc})") from None
    raise _not_rows(path, _read_text(path))


def _not_rows(path: Path, text: str) -> DatasetError:
    """The error for a .json document that does not start as a list or an object:
    either it is not JSON (where it stops being JSON), or it is one plain value."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        return bad_document(path, exc)
    found = kind_of(document)  # neither a list nor an object: json.loads skips the same spaces the window does
    return DatasetError(path, "", f'a .json dataset must be a list of rows, or {{"data": [rows]}}; found {found}')


def bad_document(path: Path, exc: json.JSONDecodeError) -> DatasetError:
    """The error for a .json file that json.loads, reading it whole, found not to be
    JSON (tests/helpers/whole_file_json.py, the whole-file reader, words its errors with it too)."""
    hint = ""
    if exc.msg == "Extra data":
        hint = "; the file looks like JSON Lines (one object per line): name it .jsonl"
    return DatasetError(path, f"line {exc.lineno}", f"bad JSON ({exc.msg} at column {exc.colno}){hint}")


# -- CSV ----------------------------------------------------------------------


def _csv_records(path: Path, text: str) -> Iterator[Record]:
    # A long document in one cell is normal for raw text; the default limit is 128 KiB.
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: list[str] | None = None
    while True:
        start = reader.line_num + 1
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise DatasetError(path, f"line {reader.line_num}", f"bad CSV ({exc})") from None
        if not any(cell.strip() for cell in cells):
            continue
        if header is None:
            header = cells
            seen: set[str] = set()
            for name in header:
                if name in seen:
                    raise DatasetError(path, f"line {start}", f"the header names the column {quote(name)} twice")
                seen.add(name)
            continue
        if len(cells) != len(header):
            problem = (
                f"has {len(cells)} fields but the header has {len(header)} ({names(header)});"
                " quote fields that contain commas"
            )
            yield f"line {start}", BadRecord(problem, "wrong_field_count")
            continue
        yield f"line {start}", dict(zip(header, cells, strict=True))


# -- Parquet ------------------------------------------------------------------


def _parquet_records(path: Path) -> Iterator[Record]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(path, "", f"is not a Parquet file pyarrow can read ({first_line(exc)})") from None
    row = 0
    try:
        for batch in table.iter_batches(batch_size=_PARQUET_BATCH_ROWS):
            for record in batch.to_pylist():
                yield f"row {row}", record
                row += 1
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(path, f"row {row}", f"cannot be read ({first_line(exc)})") from None


# -- plain text ---------------------------------------------------------------


def _txt_records(text: str) -> Iterator[Record]:
    paragraph: list[str] = []
    first = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            if not paragraph:
                first = number
            paragraph.append(line)
        elif paragraph:
            yield f"line {first}", {"text": "\n".join(paragraph)}
            paragraph = []
    if paragraph:
        yield f"line {first}", {"text": "\n".join(paragraph)}
