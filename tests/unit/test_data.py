"""Dataset reading: every shape converts, every bad file names the file, line and problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune_studio.worker.data import DatasetError, load_local


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def jsonl(*rows: object) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def test_alpaca_rows_become_conversations(tmp_path: Path) -> None:
    path = write(tmp_path, "a.jsonl", jsonl({"instruction": "Add", "input": "1 and 2", "output": "3"}, {"instruction": "Hi", "output": "Hello"}))
    data = load_local([path], "alpaca")
    assert data.shape == "alpaca" and data.per_file == {path: 2}
    assert data.rows[0]["messages"] == [{"role": "user", "content": "Add\n\n1 and 2"}, {"role": "assistant", "content": "3"}]
    assert data.rows[1]["messages"][0]["content"] == "Hi"


def test_auto_detects_each_shape(tmp_path: Path) -> None:
    cases = {
        "chatml": {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        "sharegpt": {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
        "alpaca": {"instruction": "q", "output": "a"},
        "raw": {"text": "plain text"},
    }
    for shape, row in cases.items():
        data = load_local([write(tmp_path, f"{shape}.jsonl", jsonl(row))], "auto")
        assert data.shape == shape
    sharegpt = load_local([str(tmp_path / "sharegpt.jsonl")], "auto").rows[0]
    assert [m["role"] for m in sharegpt["messages"]] == ["user", "assistant"]


def test_a_json_array_file_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, "a.json", json.dumps([{"instruction": "q", "output": "a"}] * 3))
    assert len(load_local([path], "auto").rows) == 3


@pytest.mark.parametrize(
    "name, text, shape, where, problem",
    [
        ("badjson.jsonl", '{"instruction": "q", "output": "a"}\n{"instruction": \n', "alpaca", "line 2", "bad JSON"),
        ("empty.jsonl", "\n\n", "alpaca", "", "the file is empty"),
        ("missing.jsonl", jsonl({"instruction": "q", "output": "a"}, {"instruction": "q"}), "alpaca", "line 2", "missing the column 'output'"),
        ("type.jsonl", jsonl({"instruction": "q", "output": 5}), "alpaca", "line 1", "'output' must be a string"),
        ("blank.jsonl", jsonl({"instruction": " ", "output": "a"}), "alpaca", "line 1", "'instruction' is empty"),
        ("notobj.jsonl", "[1, 2]\n", "alpaca", "line 1", "must be a JSON object"),
        ("role.jsonl", jsonl({"messages": [{"role": "bot", "content": "x"}]}), "chatml", "line 1", "expected one of"),
        ("noassistant.jsonl", jsonl({"messages": [{"role": "user", "content": "x"}]}), "chatml", "line 1", "no assistant turn"),
        ("system.jsonl", jsonl({"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]}), "chatml", "line 1", "system message may only come first"),
        ("unknown.jsonl", jsonl({"question": "q", "answer": "a"}), "auto", "line 1", "cannot tell the dataset's shape"),
        ("sharegpt.jsonl", jsonl({"conversations": [{"from": "human", "value": 3}]}), "sharegpt", "line 1", "must be a string"),
        ("notlist.json", '{"a": 1}', "auto", "", "must be a list of rows"),
        ("wrong.csvx", "a,b\n", "auto", "", "unsupported file type"),
    ],
)
def test_bad_files_name_the_file_line_and_problem(tmp_path: Path, name: str, text: str, shape: str, where: str, problem: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(DatasetError) as caught:
        load_local([path], shape)
    assert caught.value.error_code == "dataset_invalid"
    assert caught.value.where == where
    assert problem in caught.value.problem
    assert str(caught.value).startswith(path)


def test_invalid_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DatasetError, match="line 2: is not valid UTF-8"):
        load_local([str(path)], "raw")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_local([str(tmp_path / "nope.jsonl")], "auto")
