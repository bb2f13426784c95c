"""Dataset inspection in-process (the child's code): the report agrees with what a job reads.

Every bad file of tests/data/bad is reported with the very error its job ends with,
and located as the job locates it; every good shape is previewed, with the tiny
model's template and without a model; the loss marks follow train_on_completions;
truncation is counted as the trainer would; columns of no known shape get a
mapping that then reads them. (The route and the CLI: tests/integration/test_inspect.py.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from finetune_studio.child.channel import JobFailure
from finetune_studio.child.completions import render
from finetune_studio.child.datasets import load_training_data, measure
from finetune_studio.inspection.inspect import PREVIEW_CHARS, inspect_dataset, suggest_mapping, token_statistics
from finetune_studio.schemas import DatasetInspectRequest
from tests.data.corpus import BAD_FILES, GOOD, BadFile

QA_MAPPING = {"system": "system", "question": "user", "answer": "assistant"}


def inspect(files: list[Path], tokenizer: Any = None, **fields: Any) -> Any:
    return inspect_dataset(DatasetInspectRequest(local_datasets=[str(f) for f in files], **fields), tokenizer)


def job_error(files: list[Path], **fields: Any) -> JobFailure:
    """The error a job on these files ends with (read as the training child reads it)."""
    request = DatasetInspectRequest(local_datasets=[str(f) for f in files], **fields).training_request()
    with pytest.raises(JobFailure) as caught:
        load_training_data(request)
    return caught.value


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


@pytest.mark.parametrize("bad", BAD_FILES, ids=lambda bad: bad.name)
def test_every_bad_file_is_reported_as_its_job_would_report_it(bad: BadFile) -> None:
    report = inspect([bad.path], **bad.fields)
    error = job_error([bad.path], **bad.fields)
    assert not report.ok
    assert (report.error, report.error_code) == (error.message, error.error_code)
    first = report.problems[0]
    assert (first.file, first.where) == (str(bad.path), bad.where)
    assert bad.problem in first.problem


def test_bad_rows_are_counted_and_the_good_rows_still_previewed() -> None:
    bad = GOOD.parent / "bad" / "missing_output.jsonl"
    report = inspect([bad], format_type="alpaca")
    assert not report.ok and report.problem_counts == {"missing_field": 1}
    assert (report.rows, report.read, report.skipped_rows) == (3, 4, 0)  # the job would skip none: it fails
    assert report.preview and report.preview[0].segments[0].role == "user"
    assert not any(w.startswith("skipped ") for w in report.warnings)

    skipped = inspect([bad], format_type="alpaca", bad_rows="skip", max_bad_row_fraction=0.5)
    assert skipped.ok and skipped.error is None
    assert (skipped.rows, skipped.skipped_rows, skipped.problem_counts) == (3, 1, {"missing_field": 1})
    assert (skipped.problems[0].where, skipped.problems[0].kind) == ("line 4", "missing_field")
    assert any(w.startswith("skipped 1 bad rows of 4") for w in skipped.warnings)


SHAPES = [
    ("alpaca.csv", {}, "alpaca"),
    ("chatml.jsonl", {}, "chatml"),
    ("sharegpt.json", {}, "sharegpt"),
    ("notes.txt", {}, "raw"),
    ("qa.parquet", {"custom_format_mapping": QA_MAPPING}, "custom"),
]


@pytest.mark.parametrize(("name", "fields", "shape"), SHAPES, ids=[s[2] for s in SHAPES])
def test_every_shape_without_a_model_shows_each_turn(name: str, fields: dict[str, Any], shape: str) -> None:
    report = inspect([GOOD / name], **fields)
    data = load_training_data(DatasetInspectRequest(local_datasets=[str(GOOD / name)], **fields).training_request())
    assert report.ok and report.error is None and not report.problems
    assert (report.shape, report.rows, report.detected) == (shape, len(data.rows), not fields)
    assert report.tokens is None and report.truncated_rows is None
    assert len(report.preview) == min(3, len(data.rows))
    for row, shown in zip(data.rows[: len(report.preview)], report.preview, strict=True):
        if shape == "raw":
            assert report.rendered_with == "text"
            assert [s.text for s in shown.segments] == [row["text"]]
        else:
            assert report.rendered_with == "messages"
            assert [(s.role, s.text) for s in shown.segments] == [(m["role"], m["content"]) for m in row["messages"]]
        assert all(s.trains for s in shown.segments)


@pytest.mark.parametrize(("name", "fields", "shape"), SHAPES, ids=[s[2] for s in SHAPES])
def test_every_shape_through_the_models_template_and_tokens(
    name: str, fields: dict[str, Any], shape: str, tokenizer: Any
) -> None:
    report = inspect([GOOD / name], tokenizer, model_name="tiny", **fields)
    data = load_training_data(DatasetInspectRequest(local_datasets=[str(GOOD / name)], **fields).training_request())
    stats = measure(data, tokenizer, 2048)
    assert report.ok and report.shape == shape
    assert report.tokens is not None
    assert (report.tokens.min, report.tokens.max, report.tokens.total) == (
        stats["tokens_min"], stats["tokens_max"], stats["tokens_total"]
    )
    assert report.truncated_rows == 0
    for row, shown in zip(data.rows[: len(report.preview)], report.preview, strict=True):
        text = "".join(s.text for s in shown.segments)
        if shape == "raw":
            assert text == row["text"] + tokenizer.eos_token  # the trainer appends it
        else:
            assert report.rendered_with == "chat_template"
            assert text == render(tokenizer, row["messages"])
            assert [s.role for s in shown.segments] == [m["role"] for m in row["messages"]]
            assert shown.segments[0].text.startswith("<|im_start|>")
        assert shown.tokens is not None and shown.tokens > 0


def test_train_on_completions_marks_the_answers_only(tokenizer: Any) -> None:
    report = inspect([GOOD / "chatml.jsonl"], tokenizer, model_name="tiny", train_on_completions=True, preview_rows=2)
    second = report.preview[1]  # two exchanges: both answers train, nothing else
    trained = [s.text for s in second.segments if s.trains]
    assert trained == ["Four.<|im_end|>\n", "Six.<|im_end|>\n"]
    assert [s.role for s in second.segments if not s.trains] == ["user", "assistant", "user", "assistant"]
    raw = inspect([GOOD / "notes.txt"], tokenizer, model_name="tiny", train_on_completions=True)
    assert all(s.trains for row in raw.preview for s in row.segments)
    assert any("train_on_completions needs conversations" in w for w in raw.warnings)


def test_truncation_is_counted_and_marked_where_the_trainer_cuts(tokenizer: Any) -> None:
    report = inspect([GOOD / "alpaca.csv"], tokenizer, model_name="tiny", max_seq_length=32, preview_rows=4)
    data = load_training_data(DatasetInspectRequest(local_datasets=[str(GOOD / "alpaca.csv")]).training_request())
    assert report.truncated_rows == measure(data, tokenizer, 32)["truncated_rows"] > 0
    for row in report.preview:
        assert row.tokens is not None
        cut = [s for s in row.segments if s.truncated]
        assert bool(cut) == (row.tokens > 32)
        if cut:  # everything after the cut is cut, and the kept part is 32 tokens
            first = row.segments.index(cut[0])
            assert all(s.truncated for s in row.segments[first:])
            kept = "".join(s.text for s in row.segments[:first])
            assert len(tokenizer(kept, add_special_tokens=False)["input_ids"]) == 32


def test_a_long_row_is_clipped_in_the_preview(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"text": "word " * 5_000}) + "\n")
    row = inspect([path]).preview[0]
    assert row.clipped and sum(len(s.text) for s in row.segments) == PREVIEW_CHARS


# -- suggested mappings -----------------------------------------------------------------


def test_columns_of_no_known_shape_get_a_mapping_that_reads_them() -> None:
    report = inspect([GOOD / "qa.parquet"])
    assert not report.ok and report.error_code == "dataset_invalid"
    assert "cannot tell the dataset's shape" in (report.error or "")
    assert report.columns == ["system", "question", "answer", "source"]
    assert report.suggested_mapping == QA_MAPPING
    follow = inspect([GOOD / "qa.parquet"], custom_format_mapping=report.suggested_mapping)
    assert follow.ok and follow.shape == "custom" and follow.suggested_mapping is None


def test_a_known_shape_gets_no_suggestion_and_a_second_file_can_get_one(tmp_path: Path) -> None:
    assert inspect([GOOD / "chatml.jsonl"]).suggested_mapping is None
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"prompt": "Hi?", "completion": "Hello."}) + "\n")
    report = inspect([GOOD / "chatml.jsonl", odd])
    assert report.columns == ["messages"]
    assert report.suggested_mapping == {"prompt": "user", "completion": "assistant"}
    assert report.problems[0].file == str(odd)


@pytest.mark.parametrize(
    ("record", "mapping"),
    [
        ({"instruction": "a", "context": "b", "response": "c", "category": "d"},
         {"instruction": "user", "context": "user", "response": "assistant"}),  # Dolly
        ({"Question": "q", "Answer": "a"}, {"Question": "user", "Answer": "assistant"}),
        ({"query": "q", "answer": "a", "response": "r"}, {"query": "user", "answer": "assistant"}),
        ({"left": "x", "right": "y"}, {"left": "user", "right": "assistant"}),  # two text columns
        ({"left": "x", "right": "y", "id": 3}, {"left": "user", "right": "assistant"}),
        ({"left": "x", "middle": "y", "right": "z"}, None),
        ({"question": "q", "score": 1}, None),
    ],
)
def test_suggested_mappings(record: dict[str, Any], mapping: Any) -> None:
    assert suggest_mapping(record) == mapping


def test_token_statistics() -> None:
    stats = token_statistics(list(range(1, 101)))
    assert stats is not None
    assert (stats.min, stats.max, stats.mean, stats.total) == (1, 100, 50.5, 5050)
    assert (stats.p50, stats.p90, stats.p95, stats.p99) == (50, 90, 95, 99)
    one = token_statistics([7])
    assert one is not None and (one.min, one.p50, one.p99, one.max) == (7, 7, 7, 7)
    assert token_statistics([]) is None


def test_the_request_refuses_what_a_training_request_refuses() -> None:
    with pytest.raises(ValueError, match="no training data"):
        DatasetInspectRequest()
    with pytest.raises(ValueError, match="dataset_slice_end must be greater"):
        DatasetInspectRequest(local_datasets=["a.jsonl"], dataset_slice_start=4, dataset_slice_end=2)
    with pytest.raises(ValueError, match="path_empty|empty or only spaces"):
        DatasetInspectRequest(local_datasets=[" "])
    # A null stands for the default, as in a start request.
    assert DatasetInspectRequest(local_datasets=["a.jsonl"], train_split=None).train_split == "train"


def test_slices_select_the_rows_a_job_would_train_on() -> None:
    report = inspect([GOOD / "chatml.jsonl"], dataset_slice_start=1, dataset_slice_end=3)
    assert (report.rows, report.read) == (2, 4)
