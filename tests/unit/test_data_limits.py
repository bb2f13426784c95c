"""Dataset faults made of size and depth: a huge column name, a huge value, thousands of
columns, rows nested past the JSON parser's depth. Each ends in a DatasetError that
names the file and the line, and quotes only an excerpt of what it found."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from finetune_studio.child.datasets import DatasetError, load_local
from finetune_studio.child.datasets.errors import MAX_PROBLEM_CHARS

DEEP = "[" * 100_000 + "]" * 100_000  # far past the parser's ~1,000 levels
GOOD_ROW = {"instruction": "Say hi", "output": "Hi"}


def error_of(path: Path, format_type: str) -> DatasetError:
    with pytest.raises(DatasetError) as caught:
        load_local([str(path)], format_type)
    error = caught.value
    assert error.error_code == "dataset_invalid"
    assert len(error.message) < MAX_PROBLEM_CHARS + 700  # the file name, the place, the problem: no more
    return error


def jsonl(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize(("format_type", "problem"), [
    ("alpaca", "missing the column 'output' (found: instruction, kkkk"),
    ("auto", "cannot tell the dataset's shape from its columns (instruction, kkkk"),
])
def test_a_20_mb_column_name_is_quoted_as_an_excerpt(tmp_path: Path, format_type: str, problem: str) -> None:
    path = jsonl(tmp_path / "wide.jsonl", "", json.dumps({"instruction": "x", "k" * 20_000_000: "v"}))
    error = error_of(path, format_type)
    assert error.message.startswith(f"{path}, line 2: ")
    assert problem in error.message and "... (20,000,000 characters)" in error.message


def test_a_3_mb_value_is_quoted_as_an_excerpt(tmp_path: Path) -> None:
    turns = [{"role": "r" * 3_000_000, "content": "hi"}, {"role": "assistant", "content": "yo"}]
    path = jsonl(tmp_path / "role.jsonl", json.dumps({"messages": turns}))
    error = error_of(path, "chatml")
    assert f"{path}, line 1: messages[0].role is 'rrrr" in error.message
    assert "... (3,000,000 characters); expected one of system" in error.message


def test_a_3_mb_header_and_thousands_of_columns_are_listed_in_part(tmp_path: Path) -> None:
    twice = tmp_path / "twice.csv"
    with open(twice, "w", newline="") as handle:
        csv.writer(handle).writerows([["k" * 3_000_000, "k" * 3_000_000], ["a", "b"]])
    assert "the header names the column 'kkkk" in error_of(twice, "alpaca").message

    many = jsonl(tmp_path / "many.jsonl", json.dumps({f"column_{n}": "x" for n in range(10_000)}))
    error = error_of(many, "alpaca")
    assert "(found: column_0, column_1," in error.message and "column_19 and 9,980 more)" in error.message


@pytest.mark.parametrize(("name", "text", "where"), [
    ("deep.jsonl", "\n".join([json.dumps(GOOD_ROW), "", '{"instruction": ' + DEEP + "}"]) + "\n", "line 3"),
    ("rows.json", "[" + json.dumps(GOOD_ROW) + ",\n" + '{"instruction": ' + DEEP + "}]", "line 2 (row 1)"),
    ("data.json", '{"meta": 1,\n "data": [' + json.dumps(GOOD_ROW) + ",\n\n" + '{"output": ' + DEEP + "}]}", "line 4 (row 1)"),
    ("meta.json", '{"data": [' + json.dumps(GOOD_ROW) + "],\n" + '"meta": ' + DEEP + "}", "line 2"),
])
def test_a_row_nested_too_deeply_is_named_by_its_line(tmp_path: Path, name: str, text: str, where: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    error = error_of(path, "alpaca")
    assert error.message.startswith(f"{path}, {where}: nested too deeply")


def test_a_csv_cell_holding_json_nested_too_deeply_is_named_by_its_line(tmp_path: Path) -> None:
    path = tmp_path / "chat.csv"
    chat = json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerows([["messages"], [chat], [DEEP]])
    for format_type in ("chatml", "auto"):
        assert error_of(path, format_type).message.startswith(f"{path}, line 3: nested too deeply")


def test_nesting_the_parser_takes_is_read(tmp_path: Path) -> None:
    deep_but_readable = "[" * 500 + "]" * 500
    path = jsonl(tmp_path / "ok.jsonl", '{"instruction": "x", "output": "y", "extra": ' + deep_but_readable + "}")
    assert len(load_local([str(path)], "alpaca").rows) == 1
