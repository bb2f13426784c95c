"""Issue 16, without training: the method fields of the request, the rows of dpo, orpo,
kto and grpo read from every file type and checked row by row with file and line,
GRPO's built-in rewards, and the method metrics of a progress event."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from finetune_studio.child.channel import JobFailure
from finetune_studio.child.datasets import DatasetError, LoadedData, load_training_data
from finetune_studio.child.numbers import parse_number
from finetune_studio.schemas import TrainingProgress, TrainingStartRequest
from finetune_studio.training.callbacks import method_metrics
from finetune_studio.training.rewards import build_rewards

BASE: dict[str, Any] = {"model_name": "m", "training_type": "LoRA/QLoRA", "format_type": "auto", "local_datasets": ["d.jsonl"]}
GRPO: dict[str, Any] = {"training_method": "grpo", "reward_functions": [{"name": "exact_match"}]}


def request(**fields: Any) -> TrainingStartRequest:
    return TrainingStartRequest.model_validate({**BASE, **fields})


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def load(path: Path, method: str, **fields: Any) -> LoadedData:
    return load_training_data(request(local_datasets=[str(path)], training_method=method, **fields))


def refused(path: Path, method: str, **fields: Any) -> DatasetError:
    with pytest.raises(JobFailure) as caught:
        load(path, method, **fields)
    assert isinstance(caught.value, DatasetError), caught.value.message
    return caught.value


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


# -- the request --------------------------------------------------------------------


def test_old_bodies_are_unchanged_and_sft_is_the_default() -> None:
    plain = request()
    assert plain.training_method == "sft" and plain.beta is None and plain.reward_functions == []
    assert plain.num_generations is None and plain.max_completion_length is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"beta": 0.1}, "beta applies to training_method dpo, orpo, kto and grpo; remove it for sft"),
        ({"training_method": "grpo"}, "training_method grpo needs reward_functions"),
        ({"training_method": "dpo", "num_generations": 4}, "num_generations applies to training_method grpo only"),
        ({"reward_functions": [{"name": "length", "target": 3}], "max_completion_length": 8},
         "reward_functions, max_completion_length apply to training_method grpo only"),
        ({"training_method": "dpo", "beta": 0}, "beta must be above 0 for dpo"),
        ({"training_method": "kto"}, "training_method kto needs batch_size 2 or more"),
        ({"training_method": "dpo", "training_type": "Continued Pretraining"}, "Continued Pretraining trains on raw text"),
        ({"training_method": "orpo", "custom_format_mapping": {"q": "user", "a": "assistant"}},
         "reads the columns prompt, chosen, rejected"),
        ({**GRPO, "reward_functions": [{"name": "regex", "pattern": "(unclosed"}]}, "is not a valid regular expression"),
        ({**GRPO, "reward_functions": [{"name": "python", "code": "import os"}]}, "does not match any of the expected tags"),
        ({**GRPO, "reward_functions": [{"name": "exact_match", "colunm": "answer"}]}, "Extra inputs are not permitted"),
        ({**GRPO, "num_generations": 1}, "greater than or equal to 2"),
    ],
)
def test_method_fields_that_do_not_fit_are_refused_saying_what_to_fix(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        request(**fields)
    assert message in str(caught.value)


def test_a_dpo_request_is_what_the_openai_face_needs() -> None:
    dpo = request(training_method="dpo", beta=0.2)
    assert dpo.training_method == "dpo" and dpo.beta == 0.2
    assert dpo.redacted()["training_method"] == "dpo"  # stored and shown with the job


# -- the rows -------------------------------------------------------------------------


def test_preference_rows_in_every_shape_become_conversations(tmp_path: Path) -> None:
    rows = [
        {"prompt": "Say yes", "chosen": "Yes.", "rejected": "No."},
        {"prompt": user("Hi"), "chosen": assistant("Hello"), "rejected": "Go away", "system": "Be kind"},
        {"chosen": user("Q") + assistant("A"), "rejected": user("Q") + assistant("B")},  # the implicit prompt
        {"input": {"messages": user("2+2?")}, "preferred_output": assistant("4"), "non_preferred_output": assistant("5")},
    ]
    data = load(write_jsonl(tmp_path / "p.jsonl", rows), "dpo")
    assert data.shape == "preference" and data.is_conversational
    assert data.rows[0] == {"prompt": user("Say yes"), "chosen": assistant("Yes."), "rejected": assistant("No.")}
    assert data.rows[1]["prompt"] == [{"role": "system", "content": "Be kind"}, *user("Hi")]
    assert data.rows[1]["rejected"] == assistant("Go away")
    assert data.rows[2] == {"prompt": user("Q"), "chosen": assistant("A"), "rejected": assistant("B")}
    assert data.rows[3] == {"prompt": user("2+2?"), "chosen": assistant("4"), "rejected": assistant("5")}
    assert data.warnings == []


def test_every_file_type_carries_preference_rows(tmp_path: Path) -> None:
    rows = [{"prompt": f"q{i}", "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(3)]
    (tmp_path / "p.json").write_text(json.dumps(rows))
    with (tmp_path / "p.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["prompt", "chosen", "rejected"])
        writer.writeheader()
        writer.writerows(rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    for name in ("p.json", "p.csv", "p.parquet"):
        data = load(tmp_path / name, "orpo")
        assert [row["chosen"] for row in data.rows] == [assistant(f"good {i}") for i in range(3)], name
    (tmp_path / "p.txt").write_text("some raw text\n")
    assert "reads rows with the columns prompt, chosen, rejected" in refused(tmp_path / "p.txt", "dpo").message


def test_bad_preference_rows_are_refused_with_file_and_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [
        {"prompt": "fine", "chosen": "a", "rejected": "b"},
        {"prompt": "no rejected", "chosen": "a"},
        {"prompt": "wrong type", "chosen": 3, "rejected": "b"},
        {"prompt": user("x"), "chosen": [{"role": "robot", "content": "a"}], "rejected": "b"},
        {"prompt": "", "chosen": "a", "rejected": "b"},
        {"prompt": user("x") + assistant("y"), "chosen": "a", "rejected": "b"},
        "{not json",
    ])
    error = refused(path, "dpo")
    assert error.message.startswith(f"{path}, line 2: missing the column 'rejected' (found: prompt, chosen)")
    assert error.problems["missing_field"]["count"] == 1
    assert error.problems["wrong_type"]["examples"][0] == {
        "file": str(path), "where": "line 3", "problem": "'chosen' must be text or a non-empty list of messages"
        ' ({"role", "content"}), found a number'}
    assert error.problems["unknown_role"]["examples"][0]["where"] == "line 4"
    assert error.problems["empty_field"]["examples"][0]["where"] == "line 5"
    assert "prompt[1] and chosen[0] are both assistant turns" in error.problems["roles_out_of_order"]["examples"][0]["problem"]
    assert error.problems["bad_json"]["examples"][0]["where"] == "line 7"
    assert "6 of 7 rows are bad" in error.message
    skipped = load(path, "dpo", bad_rows="skip", max_bad_row_fraction=0.9)
    assert len(skipped.rows) == 1 and skipped.skipped_rows == 6


def test_a_pair_whose_chosen_is_its_rejected_is_warned_about(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "a", "chosen": "same", "rejected": "same"},
        {"prompt": "b", "chosen": "good", "rejected": "bad"},
    ])
    data = load(path, "dpo")
    assert len(data.rows) == 2
    assert data.warnings == [
        "1 preference row has the same chosen and rejected answer; they teach nothing"
        " (the preference loss cannot tell the two apart): fix them or remove them"
    ]


def test_kto_rows_read_labels_as_files_hold_them_and_refuse_one_label_only(tmp_path: Path) -> None:
    path = tmp_path / "k.csv"
    path.write_text("prompt,completion,label\nhi,hello,true\nhi,go away,False\nhey,hello,1\nhey,bye,no\n")
    data = load(path, "kto", batch_size=2)
    assert data.shape == "unpaired"
    assert [row["label"] for row in data.rows] == [True, False, True, False]
    assert data.rows[0] == {"prompt": user("hi"), "completion": assistant("hello"), "label": True}

    one = tmp_path / "one.jsonl"
    write_jsonl(one, [{"prompt": "a", "completion": "b", "label": True}] * 3)
    error = refused(one, "kto", batch_size=2)
    assert error.message == (
        f"{one}: every one of the 3 rows has label true; kto learns from the contrast between desirable and"
        " undesirable completions: add rows labelled false (undesirable)"
    )
    bad = write_jsonl(tmp_path / "bad.jsonl", [
        {"prompt": "a", "completion": "b", "label": "maybe"},
        {"prompt": "a", "chosen": "b", "rejected": "c"},
    ])
    error = refused(bad, "kto", batch_size=2)
    assert error.message.startswith(f"{bad}, line 1: 'label' is 'maybe'; it must be true")
    assert "paired rows (chosen, rejected) are for training_method dpo or orpo" in (
        error.problems["missing_field"]["examples"][0]["problem"])


def test_grpo_rows_keep_the_columns_their_rewards_read(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "g.jsonl", [
        {"prompt": "2+2?", "answer": 4, "noise": [1, 2]},
        {"prompt": user("3+3?"), "answer": "6"},
        {"prompt": "5+5?"},
        {"prompt": "1+1?", "answer": "two"},
        {"prompt": user("a") + assistant("b"), "answer": "1"},
    ])
    fields = {"reward_functions": [{"name": "numeric_match"}, {"name": "length", "target": 2}], "bad_rows": "skip",
              "max_bad_row_fraction": 0.9}
    data = load(path, "grpo", **fields)
    assert data.shape == "prompt"
    assert data.rows == [{"prompt": user("2+2?"), "answer": "4"}, {"prompt": user("3+3?"), "answer": "6"}]
    assert data.problems["missing_field"]["examples"][0] == {
        "file": str(path), "where": "line 3",
        "problem": "missing the column 'answer', which the reward numeric_match reads (found: prompt)"}
    assert data.problems["wrong_type"]["examples"][0]["problem"] == "'answer' is 'two', which holds no number for numeric_match"
    assert data.problems["roles_out_of_order"]["examples"][0]["problem"] == (
        "the prompt ends with the assistant's turn (prompt[1]); it must end with the user's turn, which the model answers")
    with pytest.raises(JobFailure) as caught:
        load(path, "grpo", reward_functions=[{"name": "exact_match", "column": "completion"}])
    assert caught.value.error_code == "config_invalid" and "a name the trainer gives to its own values" in caught.value.message


def test_a_format_type_that_is_not_used_is_said(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "c"}])
    data = load_training_data(request(local_datasets=[str(path)], training_method="dpo", format_type="alpaca"))
    assert data.warnings == ["format_type alpaca is not used: training_method dpo reads rows with the columns prompt, chosen, rejected"]


# -- the rewards -------------------------------------------------------------------------


def rewards_of(*configs: dict[str, Any]) -> list[Any]:
    parsed = request(training_method="grpo", reward_functions=list(configs)).reward_functions
    return build_rewards(parsed)[0]


def test_the_built_in_rewards_score_as_documented() -> None:
    completions = [assistant("The answer is 1,000."), assistant("answer: Paris"), "  4  ", assistant("")]
    ids = [[1] * 6, [1] * 4, [1], []]
    call = {"prompts": [user("q")] * 4, "completions": completions, "completion_ids": ids}
    exact, exact_extract, numeric, numeric_tol = rewards_of(
        {"name": "exact_match"},
        {"name": "exact_match", "extract": r"answer: (\w+)", "ignore_case": False},
        {"name": "numeric_match"},
        {"name": "numeric_match", "tolerance": 0.5},
    )
    answers = {"answer": ["1000", "paris", "4", "x"]}
    assert exact(**call, **answers) == [0.0, 0.0, 1.0, 0.0]
    assert exact_extract(**call, **answers) == [0.0, 0.0, 0.0, 0.0]  # "Paris" is not "paris" with ignore_case off
    assert exact_extract(**call, answer=["x", "Paris", "x", "x"]) == [0.0, 1.0, 0.0, 0.0]
    assert numeric(**call, **answers) == [1.0, 0.0, 1.0, 0.0]
    assert numeric_tol(**call, answer=["1000.4", "0", "4.6", "0"]) == [1.0, 0.0, 0.0, 0.0]

    search, full = rewards_of({"name": "regex", "pattern": r"\d"},
                              {"name": "regex", "pattern": r"\s*\d\s*", "full_match": True, "miss_reward": -1})
    assert search(**call) == [1.0, 0.0, 1.0, 0.0]
    assert full(**call) == [-1.0, -1.0, 1.0, -1.0]

    chars, tokens, words = rewards_of({"name": "length", "target": 5},
                                      {"name": "length", "target": 4, "unit": "tokens", "tolerance": 1},
                                      {"name": "length", "target": 2, "unit": "words"})
    assert chars(**call) == [1 / (1 + 15 / 2.5), 1 / (1 + 8 / 2.5), 1 / (1 + 0 / 2.5), 1 / (1 + 5 / 2.5)]
    assert tokens(**call) == [1 / 3, 1.0, 1 / 4, 1 / 5]
    assert words(**call)[1] == 1.0
    assert [r.__name__ for r in (chars, tokens, words)] == ["length", "length_2", "length_3"]


def test_numbers_are_read_as_people_write_them() -> None:
    assert parse_number("it is 1,250.5 in all") == 1250.5
    assert parse_number("-3 then 7e2") == 700.0
    assert parse_number("none") is None


# -- the metrics -------------------------------------------------------------------------


def test_method_metrics_are_what_the_trainer_logs_beyond_the_loss_and_finite() -> None:
    logs = {"loss": 0.6, "learning_rate": 1e-3, "grad_norm": 1.0, "epoch": 0.5, "num_tokens": 100.0,
            "rewards/margins": 0.25, "rewards/accuracies": 1.0, "logps/chosen": -float("inf"), "kl": float("nan"),
            "step_time": 0.1, "note": "text"}
    assert method_metrics(logs) == {"rewards/margins": 0.25, "rewards/accuracies": 1.0}
    evaluation = {"eval_loss": 0.5, "eval_rewards/margins": 0.3, "eval_runtime": 1.0, "epoch": 1.0}
    assert method_metrics(evaluation, prefix="eval_") == {"eval_rewards/margins": 0.3}
    assert method_metrics({"loss": 1.0}) is None
    progress = TrainingProgress.model_validate(
        {"step": 1, "total_steps": 2, "loss": 0.6, "learning_rate": 1e-3, "progress_percent": 50.0,
         "metrics": {"reward": 0.5, "reward_std": math.nan}}
    )
    assert progress.metrics == {"reward": 0.5}
