"""Large dataset files are read a piece at a time, and a cut-off file is named as cut off (issue 18, item 4).

The .json reader streams a top-level array (`datasets/jsonstream.py`) and the .jsonl
reader goes line by line; these tests check that the streaming reader yields exactly
what the whole-file parse does, that a truncated file is reported with its line and
the count of complete rows before the cut, and (slow) that reading a file of tens of
megabytes grows the process by a bounded multiple of the file's size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from finetune_studio.child.datasets import jsonstream
from finetune_studio.child.datasets.errors import DATASET_INVALID, NESTED_TOO_DEEPLY, BadRecord, DatasetError
from finetune_studio.child.datasets.files import read_records
from tests.helpers.whole_file_json import json_records, whole_text

GOOD = Path(__file__).resolve().parents[1] / "data" / "good"

TRICKY_ROWS: list[Any] = [
    {"text": 'she said "hi" \\ and left', "n": [1, 2.5, -3e-2, True, None]},
    {"conversations": [{"from": "human", "value": "line one\nline two\r\n\ttabbed"}, {"nested": {"a": {"b": []}}}]},
    {"text": "unicode: é ✓ 日本語 😀 \u2028 separator", "empty": {}},
    "not an object",
    12345678901234567890,
    {"text": "]" * 40 + "[{,}" + "\\" * 3},
]


def whole_file(path: Path) -> list[tuple[str, Any]]:
    """What the whole-file parse (the reader before streaming, tests/helpers/whole_file_json.py) yields."""
    records = json_records(path, whole_text(path))
    return [(where, _plain(record)) for where, record in records]


def streamed(path: Path) -> list[tuple[str, Any]]:
    return [(where, _plain(record)) for where, record in read_records(path)]


def _plain(record: Any) -> Any:
    return ("bad", record.kind, record.problem) if isinstance(record, BadRecord) else record


def error_of(path: Path) -> DatasetError:
    with pytest.raises(DatasetError) as caught:
        list(read_records(path))
    return caught.value


@pytest.fixture(params=[1 << 20, 7], ids=["1MB-chunks", "7-byte-chunks"])
def chunk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Every streaming test also runs with chunks smaller than a row, so rows straddle chunk ends."""
    monkeypatch.setattr(jsonstream, "CHUNK_BYTES", request.param)
    return int(request.param)


# -- the streaming reader reads what the whole-file parse read -----------------


@pytest.mark.parametrize("name", sorted(path.name for path in GOOD.glob("*.json")))
def test_the_good_corpus_reads_the_same_streamed(name: str, chunk: int) -> None:
    path = GOOD / name
    assert streamed(path) == whole_file(path)
    assert len(streamed(path)) > 1


@pytest.mark.parametrize("indent", [None, 2], ids=["one-line", "indented"])
def test_tricky_rows_read_the_same_streamed(tmp_path: Path, indent: int | None, chunk: int) -> None:
    path = tmp_path / "tricky.json"
    path.write_text("\ufeff  \n" + json.dumps(TRICKY_ROWS, indent=indent, ensure_ascii=False) + "\n\n", "utf-8")
    rows = streamed(path)
    assert rows == whole_file(path)
    assert [record for _, record in rows if not isinstance(record, tuple)] == [
        row for row in TRICKY_ROWS if isinstance(row, dict)
    ]
    if indent:
        assert [where for where, _ in rows][:2] == ["line 3 (row 0)", "line 13 (row 1)"]


def test_an_empty_array_and_a_wrapper_read_as_before(tmp_path: Path, chunk: int) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("[ ]\n")
    assert streamed(empty) == []
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"meta": 1, "data": TRICKY_ROWS}, indent=1))
    assert streamed(wrapped) == whole_file(wrapped)


@pytest.mark.parametrize(
    ("text", "where", "words"),
    [
        ('[{"a": 1},\n {"a": 2}]\n[{"a": 3}]', "line 3", "Extra data at column 1); the file looks like JSON Lines"),
        ('[{"a": 1},\n {"a": 2},\n]', "line 2", "trailing comma"),
        ('[{"a": 1}\n {"a": 2}]', "line 2", "Expecting ',' delimiter at column 2"),
        ('[{"a": 1},\n {"a": 2,, }]', "line 2", "Expecting property name enclosed in double quotes at column 10"),
    ],
)
def test_bad_json_in_a_streamed_array_names_its_line(tmp_path: Path, text: str, where: str, words: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    error = error_of(path)
    assert error.where == where
    assert words in error.problem
    assert "cut off" not in error.problem


def test_a_row_nested_too_deeply_names_its_row(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('[{"a": 1},\n{"a": ' + "[" * 100_000 + "]" * 100_000 + "}]")
    error = error_of(path)
    assert (error.where, error.problem) == ("line 2 (row 1)", NESTED_TOO_DEEPLY)


def test_a_file_that_is_not_utf8_names_the_byte(tmp_path: Path, chunk: int) -> None:
    for suffix in (".json", ".jsonl"):
        path = tmp_path / f"latin1{suffix}"
        path.write_bytes(b'[{"text": "ok"},\n' if suffix == ".json" else b'{"text": "ok"}\n')
        with path.open("ab") as out:
            out.write('{"text": "café"}\n'.encode("latin-1"))
        error = error_of(path)
        assert error.where == "line 2"
        assert "is not valid UTF-8 text (byte 0xe9 at column 14)" in error.problem


# -- a cut-off file is named as cut off ----------------------------------------


def test_an_array_cut_in_the_middle_of_a_string_is_named_truncated(tmp_path: Path, chunk: int) -> None:
    rows = [{"text": f'row {n} says "hello"\nover two lines', "n": n} for n in range(5)]
    whole = json.dumps(rows, indent=2)
    cut_at = whole.index("row 4 says")  # inside the fifth row's string
    path = tmp_path / "download.json"
    path.write_text(whole[:cut_at])
    error = error_of(path)
    line = whole[:cut_at].count("\n") + 1
    assert error.error_code == DATASET_INVALID
    assert error.message == (
        f"{path}: is cut off at line {line} (truncated: an interrupted download or copy?);"
        " the 4 complete rows before the cut were read; fetch or copy the file again"
    )


@pytest.mark.parametrize(
    ("tail", "complete"),
    [
        ('{"a": 2}', 2),  # no closing "]"
        ('{"a": 2},', 2),  # cut after a comma
        ('{"a": 2}, {"a": tr', 2),  # in a literal
        ('{"a": 2}, {"a": "\\u00', 2),  # in an escape
        ('{"a": 2}, {"a"', 2),  # before the colon
        ('{"a": 2}, {"a": 12', 2),  # in a number
    ],
)
def test_an_array_cut_anywhere_is_named_truncated(tmp_path: Path, tail: str, complete: int, chunk: int) -> None:
    path = tmp_path / "cut.json"
    path.write_text('[{"a": 1},\n' + tail)
    error = error_of(path)
    assert error.where == ""
    assert f"is cut off at line 2 (truncated: an interrupted download or copy?); the {complete} complete rows" in (
        error.problem
    )


def test_a_jsonl_file_whose_last_line_is_cut_is_named_truncated(tmp_path: Path) -> None:
    path = tmp_path / "download.jsonl"
    path.write_text('{"text": "a"}\n\n{"text": "b"}\n{"text": "half a sent')
    error = error_of(path)
    assert error.error_code == DATASET_INVALID
    assert error.message == (
        f"{path}: is cut off at line 4 (truncated: an interrupted download or copy?);"
        " the 2 complete rows before the cut were read; fetch or copy the file again"
    )


def test_a_bad_jsonl_line_elsewhere_stays_a_bad_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    # A line cut short in the middle is one bad row; so is a last line with a real mistake.
    path.write_text('{"text": "a"}\n{"text": "half\n{"text": "c"}\n{"text": "d",}')
    records = streamed(path)
    assert [(where, record[1]) for where, record in records if isinstance(record, tuple)] == [
        ("line 2", "bad_json"),
        ("line 4", "bad_json"),
    ]
    assert [record for _, record in records if isinstance(record, dict)] == [{"text": "a"}, {"text": "c"}]


def test_a_jsonl_file_reads_line_by_line_as_before(tmp_path: Path) -> None:
    path = tmp_path / "lines.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "a"}\r\n\r\n{"text": "b \\u2028"}\n   \n[1]\n{"text": "c"}')
    assert streamed(path) == [
        ("line 1", {"text": "a"}),
        ("line 3", {"text": "b \u2028"}),
        ("line 5", ("bad", "wrong_type", "each line must hold one JSON object, found a list")),
        ("line 6", {"text": "c"}),
    ]


# -- memory ---------------------------------------------------------------------

# Run in a fresh process: the growth of its peak memory (VmHWM), as bench/data_check.py measures it.
PEAK_MEMORY = Path(__file__).resolve().parents[2] / "bench" / "peak_memory.py"


def write_sharegpt(path: Path, megabytes: int) -> int:
    row = {
        "conversations": [
            {"from": "human", "value": "Explain lists and tuples in Python, with an example. " * 4},
            {"from": "gpt", "value": 'A list is mutable; a tuple is not. "Quotes", lines\nand é ✓ survive. ' * 6},
        ]
    }
    line = json.dumps(row, ensure_ascii=False)
    count = megabytes * 1_000_000 // (len(line.encode()) + 2)
    text = "\n".join([line] * count) + "\n" if path.suffix == ".jsonl" else "[\n" + ",\n".join([line] * count) + "\n]\n"
    path.write_text(text, "utf-8")
    return count


# Measured on a 60 MB file (ShareGPT rows of about 900 bytes): reading alone grows the
# process by about 0.1x the file (one chunk and one row; the whole-file reader grew it
# by about 4x), and reading and converting, which keeps every row as Python objects,
# by about 2.6x. The bounds leave room for the allocator.
READ_BOUND = 0.5
LOAD_BOUND = 3.5


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_checking_a_large_file_grows_memory_by_a_bounded_multiple_of_its_size(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"big{suffix}"
    count = write_sharegpt(path, 60)
    size = path.stat().st_size
    for how, bound in (("read", READ_BOUND), ("load", LOAD_BOUND)):
        done = subprocess.run(
            [sys.executable, str(PEAK_MEMORY), str(path), how], capture_output=True, text=True, check=True, timeout=600
        )
        result = json.loads(done.stdout)
        assert result["rows"] == count
        assert result["grown"] < bound * size, f"{how}: grew {result['grown'] / size:.2f}x the file's size"


# -- {"data": [...]} streams too ------------------------------------------------


def whole_file_error(path: Path) -> DatasetError:
    with pytest.raises(DatasetError) as caught:
        whole_file(path)
    return caught.value


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1, "b": [2]}',
        "{ }",
        '{"data": 5, "n": 1}',
        '{"data": {"rows": []}}',
        '{"text": "a"}\n{"text": "b"}',
        '[{"text": "a"}]\n{"text": "b"}',
        '{"a" 1}',
        '{"a": 1,}',
        '{"a": 1 "b": 2}',
        '{\n  "meta": 1,\n  "data": [{"a": 1}] x\n}',
        '{"meta": ' + "[" * 100_000 + "]" * 100_000 + ', "data": []}',
        '{"data": [{"a": 1},\n' + "[" * 100_000 + "]" * 100_000 + "]}",
        # Neither a list nor an object: not streamed, parsed whole to say what it is.
        "\ufeff 42",
        '"a"\n"b"',
        "  nul",
    ],
)
def test_a_wrong_layout_is_told_as_the_whole_file_parse_told_it(tmp_path: Path, text: str, chunk: int) -> None:
    path = tmp_path / "layout.json"
    path.write_text(text)
    assert error_of(path).message == whole_file_error(path).message


def test_rows_under_data_stream_between_other_keys(tmp_path: Path, chunk: int) -> None:
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"meta": {"x": [1, "]"]}, "data": TRICKY_ROWS, "more": True}, indent=2))
    rows = streamed(path)
    assert rows == whole_file(path)
    assert len(rows) == len(TRICKY_ROWS)


def test_a_wrapper_cut_off_is_named_truncated_and_data_twice_is_refused(tmp_path: Path, chunk: int) -> None:
    path = tmp_path / "cut.json"
    path.write_text('{"meta": 1, "data": [{"a": 1},\n{"a": "cu')
    assert "is cut off at line 2 (truncated: an interrupted download or copy?); the 1 complete rows" in (
        error_of(path).problem
    )
    path.write_text('{"data": [{"a": 1}],\n "data": [{"a": 2}]}')
    error = error_of(path)
    assert (error.where, error.problem) == ("line 2", 'names the key "data" twice; keep one')


@pytest.mark.parametrize("wrapped", [False, True], ids=["list", "data-key"])
def test_every_cut_of_a_good_file_is_named_truncated(tmp_path: Path, wrapped: bool, chunk: int) -> None:
    rows = [{"text": 'a "b"\n\\ é', "n": -12.5e3, "ok": [True, None, {}]}, {"text": "2"}, ["x"]]
    whole = json.dumps({"meta": [1, "}"], "data": rows} if wrapped else rows, indent=1, ensure_ascii=False)
    path = tmp_path / "cut.json"
    for end in range(1, len(whole)):
        if not whole[:end].strip() or not whole[end:].strip(" \n"):
            continue
        path.write_text(whole[:end])
        problem = error_of(path).problem
        assert problem.startswith("is cut off at line "), (end, whole[:end], problem)


def test_every_cut_of_a_jsonl_last_line_is_named_truncated(tmp_path: Path) -> None:
    last = json.dumps({"text": 'a "b" \\ é', "n": -12.5e3, "ok": [True, False, None, {}]}, ensure_ascii=False)
    path = tmp_path / "cut.jsonl"
    for end in range(2, len(last)):  # a lone "{" says the file looks like one JSON document
        path.write_text('{"text": "first"}\n' + last[:end])
        problem = error_of(path).problem
        assert problem.startswith("is cut off at line 2 "), (end, last[:end], problem)
        assert "the 1 complete rows" in problem
