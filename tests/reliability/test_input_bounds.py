"""No 5xx from input, and the smaller contract breaks (issue 24, items 6 and 7).

Integers past SQLite's range in a cursor or parameter (bounds.py: MAX_SQL_INTEGER,
`cursor_number`); names no machine can have; hyperparameters that are booleans; an
upload between max_file_bytes and the form's room, with a long name, with two file
parts; a malformed Range on both download routes; deleting a job while its export
runs; a pause checkpoint in the checkpoint list. Each answer is checked for its
status, its shape (OpenAI's under /v1) and the parameter it names.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from finetune_studio.api.app import UPLOAD_FORM_BYTES, create_app
from finetune_studio.config import Settings
from tests.helpers.exports import trained_job
from tests.helpers.jobs import InstantLauncher, dataset, finished_job, start_body
from tests.helpers.polling import wait_for
from tests.helpers.servers import LiveServer

ROW = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
LINE = (json.dumps(ROW) + "\n").encode()
MAX_SQL_INTEGER = 2**63 - 1  # SQLite's largest integer (bounds.MAX_SQL_INTEGER)
TOO_BIG = str(MAX_SQL_INTEGER + 1)
MAX_FILE = 4096


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(data_dir=tmp_path / "data", max_file_bytes=MAX_FILE)
    with TestClient(create_app(settings, launcher=InstantLauncher()), base_url="http://127.0.0.1") as client:
        yield client


def openai_error(answer: Any, status: int, param: str) -> str:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert set(body) == {"error"}, body
    assert body["error"]["param"] == param, body
    return str(body["error"]["message"])


# -- integers and cursors ----------------------------------------------------------


def test_cursors_past_sqlite_integers_are_400_naming_after(client: TestClient, tmp_path: Path) -> None:
    job = finished_job(client, start_body(dataset(tmp_path)))
    for digits in (TOO_BIG, "9" * 5000):  # past SQLite's integers; past what Python reads as a number at all
        events = client.get(f"/v1/fine_tuning/jobs/{job}/events", params={"after": f"ftevent-{job}-{digits}"})
        assert "past the largest this server gives out" in openai_error(events, 400, "after")
        checkpoints = client.get(f"/v1/fine_tuning/jobs/{job}/checkpoints", params={"after": f"ftckpt-{job}-{digits}"})
        assert "past the largest" in openai_error(checkpoints, 400, "after")
    largest = client.get(f"/v1/fine_tuning/jobs/{job}/events", params={"after": f"ftevent-{job}-{MAX_SQL_INTEGER}"})
    assert largest.status_code == 200 and len(largest.json()["data"]) == 7  # every event is before it
    # A checkpoint step past any a job has, in a chat model name: no such model (404), not a 500.
    chat = client.post("/v1/chat/completions", json={
        "model": f"ft:m::{job}:ckpt-step-{'9' * 5000}", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 404 and chat.json()["error"]["param"] == "model", chat.text


@pytest.mark.parametrize("value", ["0", "-1", TOO_BIG, "9" * 5000])
def test_page_sizes_and_event_ids_out_of_range_are_400_under_v1_and_422_elsewhere(
    client: TestClient, tmp_path: Path, value: str
) -> None:
    job = finished_job(client, start_body(dataset(tmp_path)))
    for path in ("/v1/files", "/v1/fine_tuning/jobs", f"/v1/fine_tuning/jobs/{job}/events",
                 f"/v1/fine_tuning/jobs/{job}/checkpoints"):
        openai_error(client.get(path, params={"limit": value}), 400, "limit")
    if value != "0":  # 0 is a fine Last-Event-ID: from the start
        for answer in (client.get(f"/train/stream/{job}", headers={"Last-Event-ID": value}),
                       client.get(f"/train/stream/{job}", params={"last_event_id": value})):
            assert answer.status_code == 422, answer.text
            assert answer.json()["detail"][0]["loc"][-1] in ("Last-Event-ID", "last_event_id")


# -- names and hyperparameters -------------------------------------------------------


def test_a_model_name_no_machine_can_have_is_400_naming_it(client: TestClient, tmp_path: Path) -> None:
    file_id = client.post("/v1/files", files={"file": ("t.jsonl", LINE)}, data={"purpose": "fine-tune"}).json()["id"]
    for model, words in (("m" * 100_000, "100,000 characters"), ("/data/" + "x" * 300, "a name of 300 bytes"),
                         ("org/" + "n" * 120, "a hub id's parts are at most 96")):
        answer = client.post("/v1/fine_tuning/jobs", json={"model": model, "training_file": file_id})
        assert words in openai_error(answer, 400, "model")
        start = client.post("/train/start", json=start_body(dataset(tmp_path), model_name=model))
        assert start.status_code == 400 and start.json()["field"] == "model_name", start.text
        assert words in start.json()["error"] and len(start.text) < 2000
    answer = client.post("/v1/fine_tuning/jobs", json={"model": "org/model", "training_file": "f" * 100_000})
    openai_error(answer, 400, "training_file")
    assert client.get("/train/jobs").json()["count"] == 0


@pytest.mark.parametrize(
    ("hyperparameters", "param"),
    [
        ({"n_epochs": True}, "hyperparameters.n_epochs"),
        ({"batch_size": False}, "hyperparameters.batch_size"),
        ({"learning_rate_multiplier": True}, "hyperparameters.learning_rate_multiplier"),
        ({"n_epochs": "3"}, "hyperparameters.n_epochs"),
        ({"n_epochs": 2.5}, "hyperparameters.n_epochs"),
    ],
)
def test_hyperparameters_are_numbers_never_booleans(client: TestClient, hyperparameters: dict[str, Any], param: str) -> None:
    file_id = client.post("/v1/files", files={"file": ("t.jsonl", LINE)}, data={"purpose": "fine-tune"}).json()["id"]
    answer = client.post("/v1/fine_tuning/jobs", json={"model": "org/model", "training_file": file_id,
                                                       "hyperparameters": hyperparameters})
    openai_error(answer, 400, param)
    dpo = {"type": "dpo", "dpo": {"hyperparameters": {"beta": True}}}
    openai_error(client.post("/v1/fine_tuning/jobs", json={"model": "org/model", "training_file": file_id, "method": dpo}),
                 400, "method.dpo.hyperparameters.beta")


def test_auto_and_real_numbers_are_still_taken(client: TestClient) -> None:
    file_id = client.post("/v1/files", files={"file": ("t.jsonl", LINE)}, data={"purpose": "fine-tune"}).json()["id"]
    answer = client.post("/v1/fine_tuning/jobs", json={
        "model": "org/model", "training_file": file_id,
        "hyperparameters": {"n_epochs": 2, "batch_size": "auto", "learning_rate_multiplier": 2}})
    assert answer.status_code == 200, answer.text
    assert answer.json()["hyperparameters"] == {"n_epochs": 2, "batch_size": "auto", "learning_rate_multiplier": 2.0,
                                                "beta": None}


# -- uploads ---------------------------------------------------------------------------


def test_a_file_just_over_the_limit_is_413_like_any_file_over_it(client: TestClient) -> None:
    files_dir = client.app.state.studio.settings.files_dir  # type: ignore[attr-defined]
    for size in (MAX_FILE + 1, MAX_FILE + UPLOAD_FORM_BYTES // 2, MAX_FILE + UPLOAD_FORM_BYTES + 1):
        body = (LINE * (size // len(LINE) + 1))[:size]
        answer = client.post("/v1/files", files={"file": ("big.jsonl", body)}, data={"purpose": "fine-tune"})
        assert answer.status_code == 413, (size, answer.text)
        error = answer.json()["error"]
        assert error["code"] == "file_too_large" and error["param"] == "file"
        assert f"limit of {MAX_FILE} bytes per file" in error["message"]
    assert list(files_dir.iterdir()) == []  # nothing kept, no partial


def test_a_long_name_keeps_its_suffix_and_is_taken_for_it(client: TestClient) -> None:
    name = "d" * 400 + ".jsonl"
    answer = client.post("/v1/files", files={"file": (name, b'{"text": "hi"}\n')}, data={"purpose": "studio"})
    assert answer.status_code == 200, answer.text
    stored = answer.json()
    assert len(stored["filename"]) == 255 and stored["filename"].endswith(".jsonl")
    assert stored["path"].endswith(".jsonl")


def test_two_file_parts_are_refused_naming_the_field(client: TestClient) -> None:
    parts = [("file", ("a.jsonl", LINE)), ("file", ("b.jsonl", LINE))]
    message = openai_error(client.post("/v1/files", files=parts, data={"purpose": "fine-tune"}), 400, "file")
    assert "2 'file' parts" in message
    twice = client.post("/v1/files", files=[("file", ("a.jsonl", LINE)), ("purpose", (None, b"fine-tune")),
                                            ("purpose", (None, b"studio"))])
    openai_error(twice, 400, "purpose")
    assert client.get("/v1/files").json()["data"] == []


# -- Range -----------------------------------------------------------------------------


def check_ranges(get: Any, whole: bytes) -> None:
    for malformed in ("bytes=10-5", "bytes=abc", "bytes=", "items=0-5", "bytes=5", f"bytes={'9' * 5000}-1"):
        answer = get(malformed)
        assert answer.status_code == 200 and answer.content == whole, (malformed, answer.status_code)
    part = get("bytes=2-5")
    assert part.status_code == 206 and part.content == whole[2:6]
    beyond = get(f"bytes={len(whole) + 10}-")
    assert beyond.status_code == 416 and beyond.headers["content-range"] == f"bytes */{len(whole)}"


def test_a_malformed_range_is_ignored_on_a_files_content(client: TestClient) -> None:
    whole = LINE * 3
    file_id = client.post("/v1/files", files={"file": ("t.jsonl", whole)}, data={"purpose": "fine-tune"}).json()["id"]
    check_ranges(lambda header: client.get(f"/v1/files/{file_id}/content", headers={"Range": header}), whole)


def test_a_malformed_range_is_ignored_on_an_export_download_and_a_running_export_holds_its_job(
    live_server: Any, tmp_path: Path, tools_present: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    server: LiveServer = live_server()
    job_id = trained_job(server, tmp_path)
    with server.client() as client:
        export_id = client.start_export({"job_id": job_id, "format": "gguf", "quantization": "q8_0"})
        wait_for(lambda: client.export_status(export_id)["phase"] == "completed", timeout=60, what="the export")
    name = "model-q8_0.gguf"
    whole = (server.settings.exports_dir / export_id / name).read_bytes()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        check_ranges(lambda header: http.get(f"/export/download/{export_id}/{name}", headers={"Range": header}), whole)

        # Deleting the job while an export of it runs: 409 naming the job and the export.
        go = tmp_path / "go"
        monkeypatch.setenv("FAKE_EXPORT_GO", str(go))  # the next export holds in loading_model
        with server.client() as client:
            held = client.start_export({"job_id": job_id, "format": "merged_16bit"})
            wait_for(lambda: client.export_status(held)["phase"] == "loading_model", timeout=60, what="the export")
        answer = http.delete(f"/train/jobs/{job_id}")
        assert answer.status_code == 409, answer.text
        message = answer.json()["detail"]
        assert message.startswith(f"job {job_id} cannot be deleted while its export {held} is running (loading_model)")
        assert f"POST /export/stop/{held}" in message and "is idle" not in message
        go.touch()
        with server.client() as client:
            wait_for(lambda: client.export_status(held)["phase"] == "completed", timeout=60, what="the export")
        assert http.delete(f"/train/jobs/{job_id}").status_code == 204


# -- checkpoints -------------------------------------------------------------------------


def test_a_pause_checkpoint_is_listed_beside_the_epoch_ones(client: TestClient, tmp_path: Path) -> None:
    job = finished_job(client, start_body(dataset(tmp_path)))
    checkpoints = client.app.state.studio.settings.jobs_dir / job / "checkpoints"  # type: ignore[attr-defined]
    for step, epoch in ((3, 0.75), (4, 1.0), (8, 2.0)):  # 4 steps an epoch; a pause after step 3
        folder = checkpoints / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": epoch}))
    (checkpoints / "checkpoint-9").mkdir()  # half-written: not a checkpoint
    answer = client.get(f"/v1/fine_tuning/jobs/{job}/checkpoints")
    assert answer.status_code == 200, answer.text
    listed = answer.json()["data"]
    assert [c["step_number"] for c in listed] == [8, 4, 3]
    assert listed[-1]["fine_tuned_model_checkpoint"].endswith(f":{job}:ckpt-step-3")
    page = client.get(f"/v1/fine_tuning/jobs/{job}/checkpoints", params={"after": f"ftckpt-{job}-4"}).json()
    assert [c["step_number"] for c in page["data"]] == [3] and not page["has_more"]
