"""Real data as people have it: every bad row is counted by kind (not only the first),
`bad_rows: "skip"` trains without them up to `max_bad_row_fraction`, and the known
conventions (role aliases, FastChat's leading-assistant rule, empty turns and empty
conversations) repair rows and say so, on every shape."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from finetune_studio.child.channel import Channel, JobFailure, StopSignal
from finetune_studio.child.datasets import DatasetError, LoadedData, load_training_data
from finetune_studio.schemas import TrainingStartRequest
from finetune_studio.training.recipe import Recipe
from finetune_studio.wire import WorkerSpec
from tests.helpers.dumps import DUMP_ROWS, Dump
from tests.helpers.recipes import run_recipe


def request(**fields: Any) -> TrainingStartRequest:
    return TrainingStartRequest.model_validate(
        {"model_name": "m", "training_type": "LoRA/QLoRA", "format_type": "auto", **fields}
    )


def load(path: Path | str, **fields: Any) -> LoadedData:
    return load_training_data(request(local_datasets=[str(path)], **fields))


def fails(path: Path | str, **fields: Any) -> DatasetError:
    with pytest.raises(JobFailure) as caught:
        load(path, **fields)
    assert isinstance(caught.value, DatasetError) and caught.value.error_code == "dataset_invalid"
    return caught.value


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Counter[str]]:
    made = Dump()
    path = made.write(tmp_path_factory.mktemp("dump"))
    return path, made.cases


def test_the_dump_holds_every_case(dump: tuple[Path, Counter[str]]) -> None:
    _, cases = dump
    assert sum(cases.values()) == DUMP_ROWS
    assert cases["unknown_role"] == 20 and cases["missing"] == 30 and cases["bad_json"] == 10
    assert cases["two_users"] == 20 and cases["long"] == 1 and cases["empty"] == 100


def test_by_default_the_dump_fails_naming_every_kind_the_count_and_the_option(dump: tuple[Path, Counter[str]]) -> None:
    path, _ = dump
    error = fails(path)
    # The first bad row in the usual words (row 4: "bot"), then the whole count.
    assert error.message.startswith(f"{path}, line 5: conversations[1].from is 'bot'; expected one of system, human")
    assert error.message.endswith(
        "In all, 80 of 10,000 rows are bad (0.80%): missing_field 30, unknown_role 20, roles_out_of_order 20,"
        ' bad_json 10; set bad_rows: "skip" to train without them'
    )
    assert {kind: found["count"] for kind, found in error.problems.items()} == {
        "missing_field": 30,
        "unknown_role": 20,
        "roles_out_of_order": 20,
        "bad_json": 10,
    }
    examples = error.problems["bad_json"]["examples"]
    assert [e["where"] for e in examples] == ["line 8", "line 1008", "line 2008"]
    assert all(e["file"] == str(path) and e["problem"].startswith("bad JSON (") for e in examples)
    assert error.problems["roles_out_of_order"]["examples"][0] == {
        "file": str(path),
        "where": "line 9",
        "problem": "conversations[0] and conversations[1] are both user turns;"
        " merge them or put the assistant's answer between them",
    }
    assert "missing the column 'conversations' (found: id, items)" in error.problems["missing_field"]["examples"][0]["problem"]
    assert len(error.message) < 2_000 and len(json.dumps(error.problems)) < 8_000  # bounded, whatever the file


def test_skip_trains_on_the_rest_and_counts_what_it_left_out(dump: tuple[Path, Counter[str]]) -> None:
    path, cases = dump
    data = load(path, bad_rows="skip")
    bad = cases["unknown_role"] + cases["missing"] + cases["bad_json"] + cases["two_users"]
    dropped = cases["empty"] + cases["assistant_only"]
    assert (bad, dropped) == (80, 200)
    assert (data.read, data.skipped_rows, data.dropped_rows) == (DUMP_ROWS, bad, dropped)
    assert len(data.rows) == DUMP_ROWS - bad - dropped == 9_720
    assert sum(found["count"] for found in data.problems.values()) == bad
    assert data.warnings == [
        "mapped role aliases in 100 rows (Human -> user, chatgpt -> assistant, GPT -> assistant, bing -> assistant,"
        " bard -> assistant)",
        "dropped a leading assistant turn in 200 conversations (FastChat's rule: a conversation starts with the user)",
        "dropped 200 empty turns in 100 conversations",
        "dropped 200 empty conversations (no turns, or no assistant turn, left)",
        "skipped 80 bad rows of 10,000 (0.80%) in the training data (bad_rows: skip): missing_field 30,"
        " unknown_role 20, roles_out_of_order 20, bad_json 10",
    ]
    first = data.rows[0]["messages"]  # row 0 lost its greeting
    assert first == [{"role": "user", "content": "question 0"}, {"role": "assistant", "content": "answer 0"}]
    aliased = data.rows[1]["messages"]  # row 2 (row 1 was empty)
    assert [m["role"] for m in aliased] == ["system", "user", "assistant", "user", "assistant"]
    long = next(row for row in data.rows if len(row["messages"]) == 126)
    assert long["messages"][-1] == {"role": "assistant", "content": "answer 62"}


def test_skip_still_fails_past_the_fraction_saying_the_fraction_and_the_limit(dump: tuple[Path, Counter[str]]) -> None:
    path, _ = dump
    error = fails(path, bad_rows="skip", max_bad_row_fraction=0.005)
    assert "In all, 80 of 10,000 rows are bad (0.80%)" in error.message
    assert error.message.endswith(
        "that is more than max_bad_row_fraction allows (0.005, 0.5%); fix the rows, or raise max_bad_row_fraction"
    )
    assert error.problems["unknown_role"]["count"] == 20


def test_a_curated_alpaca_file_with_one_bad_row_fails_naming_it(tmp_path: Path) -> None:
    rows = [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(5)]
    rows[2] = {"instruction": "q2", "response": "a2"}
    path = tmp_path / "alpaca.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    error = fails(path, format_type="alpaca")
    assert (error.source, error.where) == (str(path), "line 3")
    assert error.message == (
        f"{path}, line 3: missing the column 'output' (found: instruction, response)."
        ' In all, 1 of 5 rows are bad (20.0%): missing_field 1; set bad_rows: "skip" to train without them'
    )
    assert len(load(path, format_type="alpaca", bad_rows="skip", max_bad_row_fraction=0.2).rows) == 4


def test_every_problem_of_a_file_with_three_different_bad_rows_is_named(tmp_path: Path) -> None:
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    lines = [
        json.dumps(good),
        json.dumps({"messages": [{"role": "user", "content": 7}, {"role": "assistant", "content": "a"}]}),
        json.dumps(good),
        json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "robot", "content": "a"}]}),
        '{"messages": [',
        json.dumps(good),
    ]
    path = tmp_path / "three.jsonl"
    path.write_text("\n".join(lines) + "\n")
    error = fails(path, format_type="chatml")
    assert "In all, 3 of 6 rows are bad (50.0%): wrong_type 1, unknown_role 1, bad_json 1" in error.message
    named = {kind: [(e["where"], e["problem"]) for e in found["examples"]] for kind, found in error.problems.items()}
    assert named == {
        "wrong_type": [("line 2", "messages[0].content must be a string, found a number")],
        "unknown_role": [
            (
                "line 4",
                "messages[1].role is 'robot'; expected one of system, developer, user, assistant, tool, human, gpt,"
                " chatgpt, bing, bard",
            )
        ],
        "bad_json": [("line 5", "bad JSON (Expecting value at column 15)")],
    }


GOOD_ROWS = {
    "alpaca": {"instruction": "q", "output": "a"},
    "chatml": {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
    "sharegpt": {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
    "custom": {"question": "q", "answer": "a"},
}
BAD_ROWS = {
    "alpaca": ({"instruction": "q", "output": 3}, "wrong_type"),
    "chatml": (
        {"messages": [{"role": "user", "content": "q"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        "roles_out_of_order",
    ),
    "sharegpt": ({"conversations": [{"from": "human", "value": "q"}, {"from": "ai", "value": "a"}]}, "unknown_role"),
    "custom": ({"question": "q"}, "missing_field"),
}


@pytest.mark.parametrize("shape", sorted(GOOD_ROWS))
def test_the_same_on_every_shape(tmp_path: Path, shape: str) -> None:
    bad, kind = BAD_ROWS[shape]
    rows = [GOOD_ROWS[shape]] * 30
    rows[7] = rows[19] = bad
    path = tmp_path / f"{shape}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    fields: dict[str, Any] = {"format_type": "auto"}
    if shape == "custom":
        fields["custom_format_mapping"] = {"question": "user", "answer": "assistant"}
    error = fails(path, **fields)
    assert error.where == "line 8" and f"In all, 2 of 30 rows are bad (6.67%): {kind} 2;" in error.message
    assert [e["where"] for e in error.problems[kind]["examples"]] == ["line 8", "line 20"]
    assert "max_bad_row_fraction allows (0.05, 5%)" in fails(path, bad_rows="skip", **fields).message
    data = load(path, bad_rows="skip", max_bad_row_fraction=0.1, **fields)
    assert (len(data.rows), data.skipped_rows, list(data.problems)) == (28, 2, [kind])


def test_chatml_takes_sharegpt_role_names_and_says_so(tmp_path: Path) -> None:
    row = {"messages": [{"role": "Human", "content": "q"}, {"role": "gpt", "content": "a"}]}
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(row) + "\n")
    data = load(path, format_type="chatml")
    assert data.rows == [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    assert data.warnings == ["mapped role aliases in 1 rows (Human -> user, gpt -> assistant)"]


def test_bad_rows_in_csv_and_json_files_are_counted_too(tmp_path: Path) -> None:
    csv_path = tmp_path / "a.csv"
    csv_path.write_text("instruction,output\nq,a\nq,a,extra\nq,\nq,a\n")
    error = fails(csv_path, format_type="alpaca")
    assert error.where == "line 3" and "2 of 4 rows are bad (50.0%): wrong_field_count 1, empty_field 1" in error.message
    json_path = tmp_path / "a.json"
    json_path.write_text(json.dumps([{"instruction": "q", "output": "a"}, 5, {"instruction": "q", "output": "a"}]))
    data = load(json_path, format_type="alpaca", bad_rows="skip", max_bad_row_fraction=0.5)
    assert (len(data.rows), data.skipped_rows, list(data.problems)) == (2, 1, ["wrong_type"])


def test_nothing_left_fails_saying_what_was_left_out(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"conversations": []}) + "\n" + json.dumps({"conversations": [{"from": "gpt", "value": "hi"}]}) + "\n")
    error = fails(path, format_type="sharegpt")
    assert error.message == f"{path}: no usable rows: all 2 rows were left out (2 empty conversations)"
    every = fails(path, format_type="chatml", bad_rows="skip", max_bad_row_fraction=1.0)
    assert every.message == f"{path}: no usable rows: all 2 rows were left out (1 empty conversations and 1 bad rows)"


def test_the_jobs_statuses_carry_the_problems_and_the_rows_trained_on(
    dump: tuple[Path, Counter[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = dump
    (tmp_path / "error").mkdir()
    (tmp_path / "skip").mkdir()
    statuses, ended = run_recipe(tmp_path / "error", monkeypatch, path, {"format_type": "sharegpt"})
    assert isinstance(ended, JobFailure) and "80 of 10,000 rows are bad" in ended.message
    failed = statuses[-1]
    assert failed["phase"] == "loading_dataset"
    assert failed["details"]["dataset_problems"]["bad_json"]["count"] == 10

    # Under skip the data passes: the facts every later status carries say what was trained on.
    spec = {"model_name": "m", "training_type": "LoRA/QLoRA", "local_datasets": [str(path)], "format_type": "sharegpt"}
    stop = StopSignal()
    recipe = Recipe(WorkerSpec("job2", tmp_path / "skip", {**spec, "bad_rows": "skip"}), Channel(io.StringIO(), stop), stop)
    train, _ = recipe.read_data()
    assert recipe.facts["dataset"]["rows"] == len(train.rows) == 9_720
    assert (recipe.facts["dataset"]["skipped_rows"], recipe.facts["dataset"]["dropped_rows"]) == (80, 200)
    assert recipe.facts["dataset"]["problems"]["missing_field"]["count"] == 30
    assert any("skipped 80 bad rows of 10,000" in warning for warning in recipe.channel.warnings)
