"""Text that is not text, and paths that are not paths.

A lone UTF-16 surrogate (`"\\ud800"` in JSON) is a Python `str` that cannot be
encoded: once stored, every answer that carried it failed, so one request broke
`GET /train/jobs` for everyone, for good, also after a restart. Requests are refused
at the door (422 naming the field, for every field, nested values and field names
included); what the server stores and answers is cleaned in one place (U+FFFD), so a
dataset row or a file name quoted in a message cannot do it either.

An empty path names nothing (the child read its own working folder): 422.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

from finetune_studio.api.admission import PATH_FIELDS, PATH_LIST_FIELDS, PATH_OR_HUB_FIELDS
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobStore
from finetune_studio.schemas import TrainingStartRequest, TrainingStatus
from tests.helpers.jobs import InstantLauncher, dataset, job_request, start_body
from tests.helpers.polling import wait_for

SURROGATE = "\ud800"
JSON_TYPE = {"content-type": "application/json"}


def _post(url: str, body: Any) -> httpx.Response:
    # json.dumps writes the surrogate as the escape "\ud800", as any client would send it.
    return httpx.post(f"{url}/train/start", content=json.dumps(body), headers=JSON_TYPE, timeout=30)


def _hostile_bodies(base: dict[str, Any]) -> list[tuple[list[Any], dict[str, Any]]]:
    """(the location a 422 must name, a body) with a lone surrogate in every field of the
    request, in list items and dict keys and values, and in an unknown field's name and value."""
    cases: list[tuple[list[Any], dict[str, Any]]] = []
    for name in TrainingStartRequest.model_fields:
        cases.append(([name], {**base, name: f"x{SURROGATE}y"}))  # also for fields that are not strings
    for name in ("local_datasets", "local_eval_datasets", "target_modules"):
        cases.append(([name, 1], {**base, name: [(base.get(name) or ["ok"])[0], SURROGATE]}))
    cases.append((["custom_format_mapping", "question"], {**base, "custom_format_mapping": {"question": SURROGATE}}))
    cases.append((["custom_format_mapping", "q\ufffd"], {**base, "custom_format_mapping": {f"q{SURROGATE}": "user"}}))
    cases.append((["some_new_field\ufffd"], {**base, f"some_new_field{SURROGATE}": 1}))
    cases.append((["extra", "deep", 0], {**base, "extra": {"deep": [SURROGATE]}}))
    return cases


def test_text_that_is_not_unicode_anywhere_in_a_request_is_422_naming_it(live_server: Any, tmp_path: Path) -> None:
    server = live_server(launcher=InstantLauncher())
    base = start_body(dataset(tmp_path))
    for loc, body in _hostile_bodies(base):
        response = _post(server.url, body)
        assert response.status_code == 422, (loc, response.status_code, response.text[:300])
        errors = response.json()["detail"]
        assert any(error["loc"] == ["body", *loc] and error["type"] == "unicode_invalid" for error in errors), (loc, errors)
        assert "not valid Unicode" in response.text
    # Nothing was stored, and the list serves.
    jobs = httpx.get(f"{server.url}/train/jobs")
    assert jobs.status_code == 200 and jobs.json()["count"] == 0
    # A secret's value is not echoed even as it is refused.
    refused = _post(server.url, {**base, "hf_token": f"hf_secret{SURROGATE}"})
    assert refused.status_code == 422 and "hf_secret" not in refused.text


def test_the_store_keeps_only_text_it_can_serve(tmp_path: Path) -> None:
    """Whatever a child's message quotes (a dataset row, a file name that is not UTF-8),
    the one write path stores it with U+FFFD in place of each lone surrogate; rows an
    older version stored raw are cleaned as they are read."""
    store = JobStore(tmp_path / "studio.db")
    service = JobService(store, tmp_path / "jobs")
    job = service.create_job({"model_name": f"m{SURROGATE}"}, message="Queued", details={f"k{SURROGATE}": SURROGATE})
    for phase in ("loading_model", "loading_dataset"):
        service.transition(job.id, phase, phase)
    name = os.fsdecode(b"rows-\xff.jsonl")  # a file name that is not UTF-8, as Python reads it
    service.transition(job.id, "error", "Training failed", error=f"{name}, line 2: {SURROGATE} bad",
                       details={"error_code": "dataset_invalid", "files": {name: 2}})
    # A row as the old store wrote it: the surrogate as a JSON escape.
    store._db.execute("UPDATE jobs SET request_json = ? WHERE id = ?", ('{"model_name": "old\\udc80"}', job.id))
    for record in store.list_jobs():
        status = service.status_of(record)
        text = status.model_dump_json()  # raised PydanticSerializationError before
        assert "rows-\ufffd.jsonl, line 2: \ufffd bad" in text
        assert record.request == {"model_name": "old\ufffd"}
    assert all(event.data.encode() for event in store.events_after(job.id, 0))
    raw = sqlite3.connect(tmp_path / "studio.db").execute("SELECT status_json FROM jobs").fetchone()[0]
    assert "\\ud" not in raw and TrainingStatus.model_validate_json(raw).phase == "error"
    store.close()


@pytest.mark.train
def test_a_dataset_row_that_is_not_unicode_ends_dataset_invalid_and_every_list_still_serves(
    start_server: Any, tiny_model: Path, tmp_path: Path
) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text(
        '{"instruction": "hello", "input": "", "output": "hi"}\n'
        '{"instruction": "bad \\ud800 row", "input": "", "output": "x"}\n'
    )
    server = start_server()
    with server.client() as client:
        job_id = client.start(job_request(tiny_model, local_datasets=[str(data)]))
        final = wait_for(lambda: (s := client.status(job_id))["phase"] in ("completed", "error", "stopped") and s,
                         what="the job to end")
    assert final["phase"] == "error" and final["details"]["error_code"] == "dataset_invalid", final
    assert f"{data}, line 2" in final["error"] and "not valid Unicode" in final["error"]
    for attempt in ("before", "after a restart"):
        jobs = httpx.get(f"{server.url}/train/jobs", timeout=30)
        assert jobs.status_code == 200, (attempt, jobs.text)
        assert [job["job_id"] for job in jobs.json()["data"]] == [job_id]
        assert httpx.get(f"{server.url}/train/status/{job_id}", timeout=30).status_code == 200
        stream = httpx.get(f"{server.url}/train/stream/{job_id}", timeout=30)
        assert stream.status_code == 200 and stream.text.count("event: status") >= 2
        if attempt == "before":
            server.restart()


def test_a_file_name_that_is_not_utf8_is_answered_not_crashed_on(live_server: Any, tmp_path: Path) -> None:
    folder = tmp_path / "set"
    folder.mkdir()
    (folder / os.fsdecode(b"big-\xff.jsonl")).write_text('{"text": "' + "a" * 200 + '"}\n')
    server = live_server(launcher=InstantLauncher(), max_dataset_bytes=100)
    response = _post(server.url, {**start_body(dataset(tmp_path)), "local_datasets": [], "hf_dataset": str(folder)})
    assert response.status_code == 400, response.text
    assert "big-\ufffd.jsonl" in response.json()["error"] and "over this server's limit" in response.json()["error"]


PATH_NAMES = [*PATH_FIELDS, *PATH_LIST_FIELDS, *PATH_OR_HUB_FIELDS]


@pytest.mark.parametrize("empty", ["", "   ", "\t"])
def test_an_empty_path_in_any_path_field_is_422(live_server: Any, tmp_path: Path, empty: str) -> None:
    server = live_server(launcher=InstantLauncher())
    base = start_body(dataset(tmp_path))
    for name in PATH_NAMES:
        is_list = name in PATH_LIST_FIELDS
        body = {**base, name: [str(dataset(tmp_path)), empty] if is_list else empty}
        response = _post(server.url, body)
        assert response.status_code == 422, (name, response.text)
        loc = ["body", name, 1] if is_list else ["body", name]
        assert any(e["loc"] == loc and e["type"] == "path_empty" for e in response.json()["detail"]), (name, response.text)
    # Other text fields may be empty: they name no path.
    for name in ("project_name", "subset", "wandb_project", "gradient_checkpointing"):
        assert _post(server.url, {**base, name: empty}).status_code == 200, name
    # null (the Studio sends it for an unused field) is not an empty path.
    assert _post(server.url, {**base, "hf_dataset": None, "model_local_path": None}).status_code == 200
