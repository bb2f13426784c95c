"""Datasets: every file type and shape converts, every bad file names the file, the line or row, and the problem."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from finetune_studio.child.channel import JobFailure
from finetune_studio.child.datasets import (
    HUB_UNREACHABLE,
    DatasetError,
    LoadedData,
    detect_shape,
    load_eval_data,
    load_local,
    load_training_data,
    measure,
)
from finetune_studio.child.datasets import hub as hub_module
from finetune_studio.schemas import TrainingStartRequest
from tests.data.corpus import BAD, BAD_FILES, GOOD, BadFile

QA_MAPPING = {"system": "system", "question": "user", "answer": "assistant"}


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def jsonl(*rows: object) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def chat(*turns: tuple[str, str]) -> dict[str, Any]:
    return {"messages": [{"role": role, "content": content} for role, content in turns]}


def request(**fields: Any) -> TrainingStartRequest:
    return TrainingStartRequest.model_validate(
        {"model_name": "m", "training_type": "LoRA/QLoRA", "format_type": "auto", **fields}
    )


def fails(call: Callable[[], object]) -> JobFailure:
    with pytest.raises(JobFailure) as caught:
        call()
    return caught.value


# -- shapes ---------------------------------------------------------------------------


def test_alpaca_rows_become_conversations(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "a.jsonl",
        jsonl(
            {"instruction": "Add", "input": "1 and 2", "output": "3"},
            {"instruction": "Hi", "output": "Hello", "system": "Be kind."},
            {"instruction": "Bye", "input": None, "output": "Ciao"},
        ),
    )
    data = load_local([path], "alpaca")
    assert data.shape == "alpaca" and data.per_file == {path: 3} and data.is_conversational
    assert data.rows[0]["messages"] == [
        {"role": "user", "content": "Add\n\n1 and 2"},
        {"role": "assistant", "content": "3"},
    ]
    assert data.rows[1]["messages"][0] == {"role": "system", "content": "Be kind."}
    assert data.rows[2]["messages"][0]["content"] == "Bye"


def test_auto_detects_each_shape_and_reports_it(tmp_path: Path) -> None:
    cases = {
        "chatml": chat(("user", "q"), ("assistant", "a")),
        "sharegpt": {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
        "alpaca": {"instruction": "q", "output": "a"},
        "raw": {"text": "plain text"},
    }
    for shape, row in cases.items():
        path = write(tmp_path, f"{shape}.jsonl", jsonl(row))
        data = load_local([path], "auto")
        assert (data.shape, data.shapes, data.detected) == (shape, {path: shape}, True)
    assert load_local([str(tmp_path / "sharegpt.jsonl")], "auto").rows[0] == chat(("user", "q"), ("assistant", "a"))
    assert load_local([str(tmp_path / "raw.jsonl")], "auto").rows == [{"text": "plain text"}]
    assert load_local([str(tmp_path / "raw.jsonl")], "raw").detected is False


def test_detection_looks_inside_the_turns() -> None:
    assert detect_shape({"messages": [{"from": "human", "value": "q"}]}) == "sharegpt"
    assert detect_shape({"conversations": [{"role": "user", "content": "q"}]}) == "chatml"
    assert detect_shape({"messages": '[{"role": "user", "content": "q"}]'}) == "chatml"  # JSON text, as in a CSV cell
    assert detect_shape({"messages": []}) == "chatml" and detect_shape({"conversations": None}) == "sharegpt"
    assert detect_shape({"instruction": "q", "output": "a", "text": "t"}) == "alpaca"
    assert detect_shape({"prompt": "q", "completion": "a"}) is None


def test_sources_of_different_conversational_shapes_combine(tmp_path: Path) -> None:
    alpaca = write(tmp_path, "a.jsonl", jsonl({"instruction": "q", "output": "a"}))
    sharegpt = write(
        tmp_path, "s.jsonl", jsonl({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]})
    )
    data = load_local([alpaca, sharegpt], "auto")
    assert data.shape == "alpaca+sharegpt" and data.is_conversational and len(data.rows) == 2
    assert data.per_file == {alpaca: 1, sharegpt: 1}


def test_raw_text_and_conversations_do_not_mix(tmp_path: Path) -> None:
    alpaca = write(tmp_path, "a.jsonl", jsonl({"instruction": "q", "output": "a"}))
    raw = write(tmp_path, "r.jsonl", jsonl({"text": "t"}))
    error = fails(lambda: load_local([alpaca, raw], "auto"))
    assert (
        error.message
        == f"{raw}: holds raw text (raw) but {alpaca} holds conversations (alpaca); one job trains on one kind of data"
    )


def test_chatml_accepts_openai_text_parts_and_developer_and_tool_turns(tmp_path: Path) -> None:
    row = {
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Oslo?"}]},
            {"role": "assistant", "content": "Calling the weather tool."},
            {"role": "tool", "content": "-3 C, snow"},
            {"role": "assistant", "content": "Cold and snowy."},
        ],
        "weight": 1,
    }
    data = load_local([write(tmp_path, "c.jsonl", jsonl(row))], "chatml")
    roles = [m["role"] for m in data.rows[0]["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert data.rows[0]["messages"][1]["content"] == "Weather in Oslo?"

    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    error = fails(lambda: load_local([write(tmp_path, "i.jsonl", jsonl(image))], "chatml"))
    assert "messages[0].content[0] is a 'image_url' part; only text parts are supported" in error.message


@pytest.mark.parametrize(
    "roles, problem",
    [
        (["user", "assistant"], None),
        (["system", "user", "assistant", "user", "assistant"], None),
        (["user", "assistant", "tool", "tool", "assistant"], None),
        (["user", "user", "assistant"], "messages[0] and messages[1] are both user turns"),
        (["user", "assistant", "assistant"], "messages[1] and messages[2] are both assistant turns"),
        (["user", "assistant", "system", "user", "assistant"], "messages[2] is a system turn"),
        (["user", "system", "assistant"], "messages[1] is a system turn; a system turn may only come first"),
        (["user", "tool", "assistant"], "messages[1] is a tool turn that does not follow an assistant turn"),
        (["user", "assistant", "tool", "user", "assistant"], "messages[3] is a user turn right after a tool turn"),
        (["user", "assistant", "user"], "the conversation ends with a user turn (messages[2])"),
    ],
)
def test_turn_order_rules(tmp_path: Path, roles: list[str], problem: str | None) -> None:
    path = write(tmp_path, "c.jsonl", jsonl({"messages": [{"role": r, "content": f"{r} says"} for r in roles]}))
    if problem is None:
        assert [m["role"] for m in load_local([path], "chatml").rows[0]["messages"]] == roles
    else:
        error = fails(lambda: load_local([path], "chatml"))
        assert isinstance(error, DatasetError) and error.where == "line 1" and problem in error.problem
        assert error.problems == {"roles_out_of_order": {"count": 1, "examples": [
            {"file": path, "where": "line 1", "problem": error.problem}]}}


@pytest.mark.parametrize(
    "roles, kept",
    [
        (["assistant", "user", "assistant"], ["user", "assistant"]),  # FastChat's rule
        (["system", "assistant", "user", "assistant"], ["system", "user", "assistant"]),
        (["system", "assistant"], None),  # nothing to learn from once the greeting goes
        (["user"], None),
        (["system"], None),
    ],
)
def test_conventions_repair_rows_instead_of_failing_them(tmp_path: Path, roles: list[str], kept: list[str] | None) -> None:
    good = chat(("user", "q"), ("assistant", "a"))
    path = write(tmp_path, "c.jsonl", jsonl(good, {"messages": [{"role": r, "content": f"{r} says"} for r in roles]}))
    data = load_local([path], "chatml")
    if kept is None:
        assert data.rows == [good] and data.dropped_rows == 1
        assert "dropped 1 empty conversations (no turns, or no assistant turn, left)" in data.warnings
    else:
        assert [m["role"] for m in data.rows[1]["messages"]] == kept and data.dropped_rows == 0
        assert any("dropped a leading assistant turn in 1 conversations" in w for w in data.warnings)


def test_an_explicit_shape_that_does_not_fit_says_which_would(tmp_path: Path) -> None:
    path = write(
        tmp_path, "s.jsonl", jsonl({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]})
    )
    error = fails(lambda: load_local([path], "chatml"))
    assert (
        "conversations[0] has 'from' and 'value', the sharegpt shape; set format_type sharegpt or auto" in error.message
    )
    assert "missing the column 'text'" in fails(lambda: load_local([path], "raw")).message


# -- custom_format_mapping ------------------------------------------------------------


def test_custom_mapping_makes_messages_in_the_mapping_order(tmp_path: Path) -> None:
    rows = [
        {"instruction": "Add", "input": "2 and 3", "output": "5", "persona": "You count.", "id": 1},
        {"instruction": "Hi", "input": "", "output": "Hello", "persona": "", "id": 2},
        {"instruction": "Bye", "input": None, "output": "Ciao", "persona": None, "id": 3},
    ]
    path = write(tmp_path, "m.jsonl", jsonl(*rows))
    mapping = {"persona": "system", "instruction": "user", "input": "user", "output": "assistant"}
    data = load_local([path], "alpaca", mapping)  # the mapping wins over format_type
    assert data.shape == "custom" and data.shapes == {path: "custom"} and not data.detected
    assert data.rows[0] == chat(("system", "You count."), ("user", "Add\n\n2 and 3"), ("assistant", "5"))
    assert data.rows[1] == chat(("user", "Hi"), ("assistant", "Hello"))  # an empty system column drops the message
    assert data.rows[2] == chat(("user", "Bye"), ("assistant", "Ciao"))

    multi = write(tmp_path, "multi.jsonl", jsonl({"q1": "a?", "a1": "b.", "q2": "c?", "a2": "d."}))
    turns = load_local([multi], "auto", {"q1": "user", "a1": "assistant", "q2": "User", "a2": "assistant"}).rows[0]
    assert [m["role"] for m in turns["messages"]] == ["user", "assistant", "user", "assistant"]


@pytest.mark.parametrize(
    "row, problem",
    [
        (
            {"question": "q"},
            "missing the column 'answer', which custom_format_mapping maps to assistant (found: question)",
        ),
        ({"question": "q", "answer": 42}, "'answer' must be a string, found a number"),
        ({"question": " ", "answer": "a"}, "'question' is empty, so the user turn has no text"),
        ({"question": "q", "answer": None}, "'answer' is empty, so the assistant turn has no text"),
    ],
)
def test_custom_mapping_row_problems(tmp_path: Path, row: dict[str, Any], problem: str) -> None:
    path = write(tmp_path, "m.jsonl", jsonl({"question": "ok", "answer": "ok"}, row))
    error = fails(lambda: load_local([path], "auto", {"question": "user", "answer": "assistant"}))
    assert error.message.startswith(f"{path}, line 2: {problem}. In all, 1 of 2 rows are bad")


@pytest.mark.parametrize(
    "mapping, problem",
    [
        (
            {"question": "human", "answer": "assistant"},
            "maps 'question' to 'human'; the roles are system, user, assistant",
        ),
        (
            {"answer": "assistant", "question": "user"},
            "answer (assistant), question (user): 'answer' (assistant) is an assistant turn before any user turn",
        ),
        ({"question": "user"}, "the conversation has no assistant turn"),
        (
            {"question": "user", "answer": "assistant", "note": "system"},
            "'note' (system) is a system turn; a system turn may only come first",
        ),
    ],
)
def test_a_custom_mapping_that_cannot_work_is_a_config_error(
    tmp_path: Path, mapping: dict[str, str], problem: str
) -> None:
    path = write(tmp_path, "m.jsonl", jsonl({"question": "q", "answer": "a", "note": "n"}))
    error = fails(lambda: load_local([path], "auto", mapping))
    assert error.error_code == "config_invalid" and problem in error.message


def test_an_empty_custom_mapping_means_none(tmp_path: Path) -> None:
    path = write(tmp_path, "a.jsonl", jsonl({"instruction": "q", "output": "a"}))
    assert load_local([path], "auto", {}).shape == "alpaca"


# -- file types -----------------------------------------------------------------------


def test_each_good_file_type(tmp_path: Path) -> None:
    chatml = load_local([str(GOOD / "chatml.jsonl")], "auto")
    assert (chatml.shape, len(chatml.rows)) == ("chatml", 4)
    assert chatml.rows[3]["messages"][0] == {"role": "system", "content": "Answer in one word."}  # developer

    sharegpt = load_local([str(GOOD / "sharegpt.json")], "sharegpt")  # {"data": [...]}
    assert len(sharegpt.rows) == 3
    assert sharegpt.rows[2] == chat(
        ("user", "What is 10 times 10?"), ("assistant", "100."), ("user", "Halve it."), ("assistant", "50.")
    )

    alpaca = load_local([str(GOOD / "alpaca.csv")], "auto")
    assert alpaca.shape == "alpaca"
    assert [r["messages"][0]["content"] for r in alpaca.rows] == [
        "What is the capital of Italy?",
        "Add the numbers.\n\n2, 3 and 5",
        "Summarize the note.\n\nThe meeting moved to Tuesday\nbecause the room was booked.",
        'Say "hello" in French.',
    ]

    qa = load_local([str(GOOD / "qa.parquet")], "auto", QA_MAPPING)
    assert qa.rows[0] == chat(
        ("system", "You answer in one word."), ("user", "Capital of France?"), ("assistant", "Paris")
    )
    assert qa.rows[3] == chat(("user", "Opposite of hot?"), ("assistant", "Cold"))  # a null system column

    notes = load_local([str(GOOD / "notes.txt")], "auto")
    assert notes.shape == "raw"
    assert notes.rows == [
        {
            "text": "Fine-tuning adapts a pretrained language model to a task with a small dataset.\n"
            "LoRA trains two low-rank matrices beside each frozen weight."
        },
        {"text": "The learning rate, the batch size and the number of steps decide how far the\nweights move."},
        {"text": "The quick brown fox jumps over the lazy dog."},
    ]


def test_json_rows_are_located_by_line_and_row(tmp_path: Path) -> None:
    rows = [{"text": "a"}, {"text": "b"}, {"text": 3}]
    pretty = write(tmp_path, "p.json", json.dumps(rows, indent=2))
    assert fails(lambda: load_local([pretty], "raw")).message.startswith(
        f"{pretty}, line 8 (row 2): 'text' must be a string, found a number. In all, 1 of 3 rows are bad"
    )
    wrapped = write(tmp_path, "w.json", json.dumps({"version": 1, "data": rows}))
    assert fails(lambda: load_local([wrapped], "raw")).message.startswith(f"{wrapped}, line 1 (row 2): ")
    assert len(load_local([write(tmp_path, "ok.json", json.dumps({"data": rows[:2]}, indent=1))], "raw").rows) == 2
    scalar = write(tmp_path, "s.json", json.dumps([{"text": "a"}, 5]))
    assert (
        "line 1 (row 1): each row must be a JSON object, found a number"
        in fails(lambda: load_local([scalar], "raw")).message
    )
    other = write(tmp_path, "o.json", json.dumps({"train": rows}))
    assert "found an object with the keys 'train'" in fails(lambda: load_local([other], "raw")).message


def test_csv_lines_count_multiline_fields_and_skip_empty_rows(tmp_path: Path) -> None:
    text = 'instruction,output\n"two\nlines",a\n\n,\nq,\n'
    path = write(tmp_path, "c.csv", text)
    error = fails(lambda: load_local([path], "alpaca"))
    assert error.message.startswith(f"{path}, line 6: 'output' is empty. In all, 1 of 2 rows are bad (50.0%)")

    messages = json.dumps([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a, b"}])
    cell = write(tmp_path, "m.csv", "messages\n" + '"' + messages.replace('"', '""') + '"\n')
    assert load_local([cell], "auto").rows == [chat(("user", "q"), ("assistant", "a, b"))]
    broken = write(tmp_path, "b.csv", "messages\n[not json\n")
    assert (
        "'messages' must be a list of turns; found text that is not a JSON list"
        in fails(lambda: load_local([broken], "chatml")).message
    )

    twice = write(tmp_path, "d.csv", "text,text\na,b\n")
    assert (
        fails(lambda: load_local([twice], "raw")).message
        == f"{twice}, line 1: the header names the column 'text' twice"
    )
    bom = tmp_path / "bom.csv"
    bom.write_bytes("\ufefftext\nhello\n".encode())
    assert load_local([str(bom)], "auto").rows == [{"text": "hello"}]


def test_parquet_conversations_and_types(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"messages": [chat(("user", "q"), ("assistant", "a"))["messages"]], "n": [1]}), path)
    data = load_local([str(path)], "auto")
    assert (data.shape, data.rows) == ("chatml", [chat(("user", "q"), ("assistant", "a"))])

    numbers = tmp_path / "n.parquet"
    pq.write_table(pa.table({"text": ["fine", "also fine"]}), numbers)
    assert len(load_local([str(numbers)], "raw").rows) == 2
    pq.write_table(pa.table({"text": [1, 2]}), numbers)
    assert fails(lambda: load_local([str(numbers)], "raw")).message.startswith(
        f"{numbers}, row 0: 'text' must be a string, found a number. In all, 2 of 2 rows are bad (100.0%): wrong_type 2"
    )
    empty = tmp_path / "e.parquet"
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), empty)
    assert fails(lambda: load_local([str(empty)], "raw")).message == f"{empty}: no usable rows: it holds no records"


def test_txt_is_raw_text_only(tmp_path: Path) -> None:
    path = write(tmp_path, "t.txt", "\n\nfirst\n\n\nsecond, line one\nsecond, line two\n")
    assert load_local([path], "raw").rows == [{"text": "first"}, {"text": "second, line one\nsecond, line two"}]
    error = fails(lambda: load_local([path], "alpaca"))
    assert (
        error.message
        == f"{path}: a .txt file holds raw text (one row per paragraph); use format_type raw or auto, not alpaca"
    )
    error = fails(lambda: load_local([path], "auto", {"a": "user", "b": "assistant"}))
    assert error.error_code == "config_invalid" and "custom_format_mapping needs a file with columns" in error.message
    assert "the file is empty" in fails(lambda: load_local([write(tmp_path, "blank.txt", "\n \n")], "raw")).message


def test_whole_file_problems(tmp_path: Path) -> None:
    assert fails(lambda: load_local([str(tmp_path / "nope.jsonl")], "auto")).message.endswith(
        "nope.jsonl: the file does not exist"
    )
    assert "is a folder" in fails(lambda: load_local([str(tmp_path)], "auto")).message
    utf16 = tmp_path / "u.jsonl"
    utf16.write_bytes('{"text": "x"}\n'.encode("utf-16"))
    assert fails(lambda: load_local([str(utf16)], "raw")).message == f"{utf16}: is UTF-16 text; save it as UTF-8"
    array = write(tmp_path, "array.jsonl", json.dumps([{"text": "a"}, {"text": "b"}], indent=2))
    assert "the file looks like one JSON document: name it .json" in fails(lambda: load_local([array], "raw")).message
    assert fails(lambda: load_local([], "auto")).error_code == "config_invalid"


@pytest.mark.parametrize(
    "name, content, format_type, where, problem",
    [
        (
            "shape.jsonl",
            jsonl({"prompt": "q", "completion": "a"}),
            "auto",
            "line 1",
            "cannot tell the dataset's shape from its columns (prompt, completion); expected messages (chatml),"
            " conversations (sharegpt), instruction + output (alpaca) or text (raw), or set custom_format_mapping,"
            ' e.g. {"prompt": "user", "completion": "assistant"}',
        ),
        (
            "comma.json",
            '[\n  {"text": "a"}\n  {"text": "b"}\n]\n',
            "raw",
            "line 3",
            "bad JSON (Expecting ',' delimiter at column 3)",
        ),
        (
            "object.jsonl",
            '{\n  "text": "a"\n}\n',
            "raw",
            "line 1",
            "the file looks like one JSON document: name it .json",
        ),
        (
            "fake.parquet",
            '{"text": "JSON, not Parquet"}\n',
            "raw",
            "",
            "is not a Parquet file pyarrow can read (Parquet magic bytes",
        ),
        ("quote.csv", 'text\n"never closed\n', "raw", "line 2", "bad CSV (unexpected end of data)"),
        (
            "nulls.jsonl",
            jsonl({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}]}),
            "chatml",
            "line 1",
            "messages[1].content is missing or null",
        ),
        (
            "emptyturn.jsonl",
            jsonl({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}]}),
            "chatml",
            "",
            "no usable rows: all 1 rows were left out (1 empty conversations)",
        ),
        (
            "notlist.jsonl",
            jsonl({"messages": {"role": "user"}}),
            "chatml",
            "line 1",
            "'messages' must be a non-empty list of turns, found an object",
        ),
        ("noext", "text\n", "auto", "", "unsupported file without an extension"),
        (
            "string.jsonl",
            jsonl({"text": "a"}, "just text"),
            "auto",
            "line 2",
            "each line must hold one JSON object, found a string",
        ),
        (
            "role.jsonl",
            jsonl({"conversations": [{"from": "human", "value": "q"}, {"from": "bot", "value": "a"}]}),
            "sharegpt",
            "line 1",
            "conversations[1].from is 'bot'; expected one of system, human, user, gpt, assistant, function_call",
        ),
    ],
)
def test_more_bad_files(tmp_path: Path, name: str, content: str, format_type: str, where: str, problem: str) -> None:
    path = write(tmp_path, name, content)
    error = fails(lambda: load_local([path], format_type))
    assert isinstance(error, DatasetError) and (error.where, error.source) == (where, path)
    assert problem in error.problem


@pytest.mark.parametrize("bad", BAD_FILES, ids=lambda bad: bad.name)
def test_the_bad_corpus(bad: BadFile) -> None:
    # Read as the child's recipe reads a job's data: the error is the one its job ends with
    # (two of these files also go through a real server: tests/integration/test_datasets.py).
    error = fails(lambda: load_training_data(request(local_datasets=[str(bad.path)], **bad.fields)))
    assert isinstance(error, DatasetError) and error.error_code == "dataset_invalid"
    assert (error.source, error.where) == (str(bad.path), bad.where)
    assert bad.problem in error.problem
    location = f"{bad.path}, {bad.where}" if bad.where else str(bad.path)
    assert error.message.startswith(f"{location}: ")


def test_every_bad_file_is_described() -> None:
    assert sorted(p.name for p in BAD.iterdir()) == sorted(b.name for b in BAD_FILES)
    assert {b.name.rsplit(".", 1)[1] for b in BAD_FILES} >= {"jsonl", "json", "csv", "parquet", "txt"}
    assert sum(1 for b in BAD_FILES if b.where) >= 12


# -- requests: slices, evaluation data, hf_dataset --------------------------------------


def test_slices_select_training_rows_after_every_file_is_checked(tmp_path: Path) -> None:
    first = write(tmp_path, "a.jsonl", jsonl(*({"text": f"a{i}"} for i in range(3))))
    second = write(tmp_path, "b.jsonl", jsonl(*({"text": f"b{i}"} for i in range(3))))
    data = load_training_data(request(local_datasets=[first, second], dataset_slice_start=2, dataset_slice_end=4))
    assert data.rows == [{"text": "a2"}, {"text": "b0"}]
    assert data.per_file == {first: 3, second: 3}
    assert [r["text"] for r in load_training_data(request(local_datasets=[first], dataset_slice_end=1)).rows] == ["a0"]
    error = fails(lambda: load_training_data(request(local_datasets=[first], dataset_slice_start=5)))
    assert error.message == "dataset_slice_start=5 and dataset_slice_end=None leave no rows (the data has 3 rows)"
    bad = write(tmp_path, "bad.jsonl", jsonl({"text": "ok"}, {"text": 1}))
    assert "line 2" in fails(lambda: load_training_data(request(local_datasets=[bad], dataset_slice_end=1))).message


def test_eval_data_from_local_files(tmp_path: Path) -> None:
    train_path = write(tmp_path, "t.jsonl", jsonl({"instruction": "q", "output": "a"}))
    eval_path = write(tmp_path, "e.jsonl", jsonl(chat(("user", "q"), ("assistant", "a"))))
    raw_path = write(tmp_path, "r.jsonl", jsonl({"text": "t"}))
    assert load_eval_data(request(local_datasets=[train_path])) is None
    train = load_training_data(request(local_datasets=[train_path]))
    evaluation = load_eval_data(request(local_datasets=[train_path], local_eval_datasets=[eval_path]), train)
    assert evaluation is not None and (evaluation.shape, len(evaluation.rows)) == ("chatml", 1)
    error = fails(lambda: load_eval_data(request(local_datasets=[train_path], local_eval_datasets=[raw_path]), train))
    assert (
        error.message
        == f"{raw_path}: the evaluation data is raw text (raw) but the training data is conversations (alpaca)"
    )
    error = fails(lambda: load_eval_data(request(local_datasets=[train_path], eval_split="test")))
    assert error.error_code == "config_invalid" and "hf_dataset is not set" in error.message


@pytest.fixture(scope="module")
def saved_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DatasetDict saved with save_to_disk: train (6 alpaca rows, row 4 bad) and test (2 rows)."""
    from datasets import Dataset, DatasetDict

    folder = tmp_path_factory.mktemp("saved") / "qa"
    train = [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(6)]
    train[4]["output"] = ""
    test = [{"instruction": "tq", "output": "ta"}] * 2
    DatasetDict(train=Dataset.from_list(train), test=Dataset.from_list(test)).save_to_disk(str(folder))
    return folder


def test_hf_dataset_from_a_saved_folder_with_splits_and_slices(saved_dataset: Path) -> None:
    fields = {"hf_dataset": str(saved_dataset), "eval_split": "test", "format_type": "alpaca"}
    data = load_training_data(request(**fields, dataset_slice_start=1, dataset_slice_end=4))
    assert [r["messages"][0]["content"] for r in data.rows] == [
        "q1",
        "q2",
        "q3",
    ]  # row 4, outside the slice, is never read
    assert data.per_file == {f"{saved_dataset} (split train)": 3}
    evaluation = load_eval_data(request(**fields), data)
    assert evaluation is not None and len(evaluation.rows) == 2

    error = fails(lambda: load_training_data(request(**fields, dataset_slice_start=2)))
    assert error.message.startswith(f"{saved_dataset} (split train), row 4: 'output' is empty. In all, 1 of 4 rows")
    error = fails(lambda: load_training_data(request(hf_dataset=str(saved_dataset), train_split="validation")))
    assert error.message == f"{saved_dataset}: has no split 'validation' (it has train, test); set train_split"
    error = fails(lambda: load_training_data(request(hf_dataset=str(saved_dataset), dataset_slice_start=6)))
    assert "leave no rows" in error.message


def test_hf_dataset_and_local_files_are_both_used(saved_dataset: Path, tmp_path: Path) -> None:
    local = write(tmp_path, "l.jsonl", jsonl({"instruction": "local", "output": "x"}))
    data = load_training_data(request(hf_dataset=str(saved_dataset / "test"), local_datasets=[local]))
    assert [r["messages"][0]["content"] for r in data.rows] == ["tq", "tq", "local"]
    assert data.per_file == {str(saved_dataset / "test"): 2, local: 1}
    error = fails(lambda: load_eval_data(request(hf_dataset=str(saved_dataset / "test"), eval_split="test")))
    assert error.error_code == "config_invalid" and "holds one Dataset saved without splits" in error.message


def test_hf_dataset_from_a_folder_of_files_and_from_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # load_dataset caches what it reads

    folder = tmp_path / "folder"
    folder.mkdir()
    pq.write_table(pa.table({"text": ["one", "two", "three"]}), folder / "train.parquet")
    pq.write_table(pa.table({"text": ["held out"]}), folder / "test.parquet")
    data = load_training_data(request(hf_dataset=str(folder)))
    assert (data.shape, [r["text"] for r in data.rows]) == ("raw", ["one", "two", "three"])
    evaluation = load_eval_data(request(hf_dataset=str(folder), eval_split="test"), data)
    assert evaluation is not None and evaluation.rows == [{"text": "held out"}]
    error = fails(lambda: load_training_data(request(hf_dataset=str(folder), train_split="nope")))
    assert error.error_code == "dataset_invalid" and 'Unknown split "nope"' in error.message

    file_data = load_training_data(request(hf_dataset=str(GOOD / "chatml.jsonl"), dataset_slice_end=2))
    assert len(file_data.rows) == 2
    error = fails(lambda: load_training_data(request(hf_dataset=str(tmp_path / "missing" / "x.jsonl"))))
    assert error.error_code == "dataset_not_found" and "no such file or folder" in error.message


def _bounded(call: Callable[[], object], seconds: float = 120) -> JobFailure:
    """Run call on a thread; a hang fails the test instead of stalling the suite."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting for the hub after {seconds} s"
    assert outcome and isinstance(outcome[0], JobFailure), outcome
    return outcome[0]


def test_an_unreachable_hub_fails_fast_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")  # nothing listens there
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    error = _bounded(lambda: load_training_data(request(hf_dataset="someone/some-dataset")))
    assert error.error_code == "dataset_not_found"
    assert error.message.startswith(f"{HUB_UNREACHABLE} (hf_dataset 'someone/some-dataset': ")


def test_a_silent_hub_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        monkeypatch.setattr(hub_module, "HUB_TIMEOUT_SECONDS", 0.5)
        error = _bounded(lambda: hub_module.check_on_hub("someone/some-dataset", None))
    assert error.error_code == "dataset_not_found" and error.message.startswith(HUB_UNREACHABLE)


class _FakeHub(BaseHTTPRequestHandler):
    """Answers /api/datasets/<id> as the hub would for a few kinds of dataset."""

    answers: ClassVar[dict[str, tuple[int, dict[str, str]]]] = {
        "someone/ok": (200, {}),
        "someone/missing": (404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}),
        "someone/gated": (403, {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to dataset is restricted"}),
        "someone/badtoken": (401, {}),
        "someone/broken": (500, {}),
    }

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        name = self.path.partition("/api/datasets/")[2].partition("?")[0]
        status, headers = self.answers.get(name, (404, {}))
        body = json.dumps({"id": name, "_id": "0", "private": False, "sha": "0"} if status == 200 else {"error": "no"})
        self.send_response(status)
        for key, value in {**headers, "Content-Type": "application/json", "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    "name, answer",
    [
        ("someone/ok", None),
        (
            "someone/missing",
            "is neither a local file or folder nor a dataset on the Hugging Face hub (if it is private",
        ),
        ("someone/gated", "is gated: accept its terms on the hub, then set hf_token"),
        ("someone/badtoken", "the Hugging Face hub refused hf_dataset 'someone/badtoken': "),
        ("someone/broken", f"{HUB_UNREACHABLE} (hf_dataset 'someone/broken': "),
        ("not a hub id!", "is neither a local file or folder nor a hub id"),
    ],
)
def test_the_hubs_answers_are_told_apart(monkeypatch: pytest.MonkeyPatch, name: str, answer: str | None) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        if answer is None:
            hub_module.check_on_hub(name, None)
        else:
            error = _bounded(lambda: hub_module.check_on_hub(name, None))
            assert error.error_code == "dataset_not_found" and answer in error.message
    finally:
        server.shutdown()
        server.server_close()


def test_offline_mode_looks_only_in_the_cache(tmp_path: Path) -> None:
    # HF_HUB_OFFLINE is read when datasets is imported, so this runs in a fresh interpreter.
    script = (
        "from finetune_studio.child.datasets import load_training_data\n"
        "from finetune_studio.schemas import TrainingStartRequest\n"
        "from finetune_studio.child.channel import JobFailure\n"
        "r = TrainingStartRequest(model_name='m', training_type='LoRA/QLoRA', format_type='auto',\n"
        "                         hf_dataset='someone/x')\n"
        "try:\n    load_training_data(r)\nexcept JobFailure as e:\n    print(e.error_code, e.message)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, env=env)
    assert result.stdout.strip() == (
        f"dataset_not_found {HUB_UNREACHABLE}"
        " (hf_dataset 'someone/x': HF_HUB_OFFLINE is set and it is not in the local cache)"
    ), result.stderr


def test_the_package_imports_nothing_heavy() -> None:
    script = (
        "import sys, finetune_studio.child.datasets\n"
        "heavy = ('torch', 'transformers', 'datasets', 'pyarrow', 'huggingface_hub')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stderr


# -- measure ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


def test_measure_counts_tokens_as_the_chat_template_renders_them(tokenizer: Any) -> None:
    data = load_local([str(GOOD / "chatml.jsonl")], "auto")
    expected = [len(tokenizer.apply_chat_template(r["messages"], tokenize=True, return_dict=False)) for r in data.rows]
    limit = sorted(expected)[1]
    assert sorted(expected)[2] > limit  # so some rows are truncated and some are not
    stats = measure(data, tokenizer, max_seq_length=limit)
    assert stats == {
        "rows": 4,
        "shape": "chatml",
        "tokens_min": min(expected),
        "tokens_median": (sorted(expected)[1] + sorted(expected)[2]) / 2,
        "tokens_max": max(expected),
        "tokens_total": sum(expected),
        "max_seq_length": limit,
        "truncated_rows": 2,
    }


def test_measure_raw_text_counts_the_end_of_sequence_token(tokenizer: Any) -> None:
    data = LoadedData(rows=[{"text": "The quick brown fox."}, {"text": "x" * 50}, {"text": "Hi"}], shape="raw")
    expected = [len(tokenizer(r["text"])["input_ids"]) + 1 for r in data.rows]
    stats = measure(data, tokenizer, max_seq_length=10_000)
    assert (stats["tokens_min"], stats["tokens_median"], stats["tokens_max"]) == (
        min(expected),
        sorted(expected)[1],
        max(expected),
    )
    assert stats["truncated_rows"] == 0 and stats["shape"] == "raw"


def test_measure_tokenizes_in_batches(tokenizer: Any) -> None:
    calls: list[int] = []

    class Counting:
        eos_token_id = tokenizer.eos_token_id

        def apply_chat_template(self, conversations: list[Any], **kwargs: Any) -> Any:
            calls.append(len(conversations))
            return tokenizer.apply_chat_template(conversations, **kwargs)

    rows = [chat(("user", f"question {i}"), ("assistant", f"answer {i}")) for i in range(1100)]
    stats = measure(LoadedData(rows=rows, shape="chatml"), Counting(), max_seq_length=4096)
    assert calls == [512, 512, 76] and stats["rows"] == 1100 and stats["tokens_min"] > 0
