"""`POST /datasets/inspect` on a real server (each inspection in a real child) and
`finetune-studio inspect` as a user runs it.

Every shape is previewed through the tiny model's chat template with token
statistics; bad data is reported with the same error, file and line as its job
ends with (computed here as the training child computes it; every bad file of the
corpus is checked in-process by tests/unit/test_inspect.py); a mapping is suggested
for columns of no known shape, and the suggestion reads them; no job is started;
the route wants the token and keeps to the allowed folders.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from finetune_studio.child.channel import JobFailure
from finetune_studio.child.datasets import load_training_data
from finetune_studio.schemas import DatasetInspectRequest
from tests.data.corpus import BAD_FILES, GOOD
from tests.helpers.servers import ServerProcess

pytestmark = pytest.mark.slow

QA_MAPPING = {"system": "system", "question": "user", "answer": "assistant"}
TIMEOUT = httpx.Timeout(300.0)  # an inspection's child imports the tokenizer's libraries: seconds on a busy machine


def inspect(server: ServerProcess, body: dict[str, Any], token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{server.url}/datasets/inspect", json=body, headers=headers, timeout=TIMEOUT)


def job_error(body: dict[str, Any]) -> JobFailure:
    with pytest.raises(JobFailure) as caught:
        load_training_data(DatasetInspectRequest.model_validate(body).training_request())
    return caught.value


SHAPES = [
    ("alpaca.csv", {"format_type": "alpaca"}, "alpaca", 4),
    ("chatml.jsonl", {}, "chatml", 4),
    ("sharegpt.json", {}, "sharegpt", 3),
    ("notes.txt", {"format_type": "raw"}, "raw", 3),
    ("qa.parquet", {"custom_format_mapping": QA_MAPPING}, "custom", 4),
]


def test_every_shape_through_the_models_template(shared_server: ServerProcess, tiny_model: Path) -> None:
    for name, fields, shape, rows in SHAPES:
        body = {"local_datasets": [str(GOOD / name)], "model_name": str(tiny_model), "max_seq_length": 40,
                "preview_rows": 20, **fields}
        answer = inspect(shared_server, body)
        assert answer.status_code == 200, answer.text
        report = answer.json()
        assert report["ok"] is True and report["error"] is None, (name, report)
        assert (report["shape"], report["rows"]) == (shape, rows), name
        assert report["rendered_with"] == ("text" if shape == "raw" else "chat_template")
        tokens = report["tokens"]
        assert 0 < tokens["min"] <= tokens["p50"] <= tokens["p90"] <= tokens["max"], name
        assert len(report["preview"]) == rows  # every row shown
        assert report["truncated_rows"] == sum(1 for row in report["preview"] if row["tokens"] > 40)
        first = report["preview"][0]
        assert first["segments"] and all(s["trains"] for s in first["segments"])
        if shape != "raw":
            assert first["segments"][0]["text"].startswith("<|im_start|>"), name
            assert first["segments"][-1]["role"] == "assistant"
    # Nothing was queued.
    assert httpx.get(f"{shared_server.url}/train/jobs").json()["count"] == 0


def test_the_loss_marks_follow_train_on_completions(shared_server: ServerProcess, tiny_model: Path) -> None:
    body = {"local_datasets": [str(GOOD / "chatml.jsonl")], "model_name": str(tiny_model), "train_on_completions": True}
    report = inspect(shared_server, body).json()
    trained = [s["text"] for s in report["preview"][0]["segments"] if s["trains"]]
    assert trained == ["Paris.<|im_end|>\n"]


# One bad file of each type, located by line, by line and row, and by row.
ROUTE_BAD = ("missing_output.jsonl", "wrong_type.json", "field_count.csv", "null_output.parquet", "sheet.tsv")


def test_bad_data_is_reported_as_its_job_would_report_it(shared_server: ServerProcess) -> None:
    for bad in (b for b in BAD_FILES if b.name in ROUTE_BAD):
        body = {"local_datasets": [str(bad.path)], **bad.fields}
        answer = inspect(shared_server, body)
        assert answer.status_code == 200, answer.text
        report = answer.json()
        error = job_error(body)
        assert report["ok"] is False
        assert (report["error"], report["error_code"]) == (error.message, error.error_code), bad.name
        first = report["problems"][0]
        assert (first["file"], first["where"]) == (str(bad.path), bad.where), bad.name
        assert bad.problem in first["problem"], bad.name


def test_a_mapping_is_suggested_and_reads_the_columns(shared_server: ServerProcess) -> None:
    body = {"local_datasets": [str(GOOD / "qa.parquet")]}
    report = inspect(shared_server, body).json()
    assert report["ok"] is False and report["error_code"] == "dataset_invalid"
    assert report["columns"] == ["system", "question", "answer", "source"]
    assert report["suggested_mapping"] == QA_MAPPING
    again = inspect(shared_server, {**body, "custom_format_mapping": report["suggested_mapping"]}).json()
    assert again["ok"] is True and again["shape"] == "custom" and again["rows"] == 4


def test_requests_a_job_would_be_refused_are_refused(shared_server: ServerProcess) -> None:
    missing = str(GOOD / "no-such-file.jsonl")
    answer = inspect(shared_server, {"local_datasets": [missing]})
    assert answer.status_code == 400 and missing in answer.json()["detail"]
    assert inspect(shared_server, {"local_datasets": []}).status_code == 422
    answer = inspect(shared_server, {"local_datasets": [str(GOOD / "chatml.jsonl")], "model_name": "./no-such-model"})
    assert answer.status_code == 200
    assert answer.json()["error_code"] == "model_not_found" and answer.json()["rows"] == 4  # the data is still read


def test_the_route_wants_the_token_and_keeps_to_the_allowed_folders(start_server: Any, tmp_path: Path) -> None:
    token = "inspect-token-0123456789abcdef"
    inside = tmp_path / "data-in"
    inside.mkdir()
    (inside / "chat.jsonl").write_text((GOOD / "chatml.jsonl").read_text())
    server = start_server(env={"FINETUNE_STUDIO_TOKEN": token, "FINETUNE_STUDIO_ALLOWED_ROOTS": str(inside)})
    body = {"local_datasets": [str(inside / "chat.jsonl")]}
    assert inspect(server, body).status_code == 401
    assert inspect(server, body, token="wrong-token-0123456789abcdef").status_code == 401
    answer = inspect(server, body, token=token)
    assert answer.status_code == 200 and answer.json()["rows"] == 4
    outside = inspect(server, {"local_datasets": [str(GOOD / "chatml.jsonl")]}, token=token)
    assert outside.status_code == 403 and "outside the folders" in outside.json()["detail"]


# -- the CLI ------------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "finetune_studio.cli.main", "inspect", *args], capture_output=True, text=True, timeout=600
    )


def test_the_cli_previews_good_data_and_exits_0(tiny_model: Path) -> None:
    done = cli(str(GOOD / "chatml.jsonl"), "--model", str(tiny_model), "--train-on-completions", "--max-seq-length", "40")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "4 rows to train on, chatml (detected)" in out
    assert "tokens per row: min " in out and "longer than max_seq_length (40): " in out
    assert "longer than max_seq_length (40): 3 of 4 rows" in out
    assert "  x assistant| Paris.<|im_end|>" in out  # row 0 is 48 tokens: its answer is cut off
    assert "  + assistant| Hola.<|im_end|>" in out
    assert "  - user     | What is the capital of France?<|im_end|>" in out
    assert "ok: a job would train on this data as it is" in out


def test_the_cli_names_each_problem_and_exits_1() -> None:
    bad = next(b for b in BAD_FILES if b.name == "missing_output.jsonl")
    done = cli(str(bad.path), "--format", "alpaca")
    assert done.returncode == 1
    assert f"{bad.path}, line 4: missing the column 'output'" in done.stdout
    assert "problems (missing_field 1):" in done.stdout and "a job would end with" in done.stdout

    suggested = cli(str(GOOD / "qa.parquet"), "--output-json")
    assert suggested.returncode == 1
    assert json.loads(suggested.stdout)["suggested_mapping"] == QA_MAPPING
    mapped = cli(str(GOOD / "qa.parquet"), "--mapping", "system=system", "--mapping", "question=user",
                 "--mapping", "answer=assistant")
    assert mapped.returncode == 0, mapped.stdout
    assert cli(str(GOOD / "qa.parquet"), "--mapping", "question").returncode == 2
