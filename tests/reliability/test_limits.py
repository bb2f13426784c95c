"""Limits: a body over the request limit, a queue over its length, a dataset file
over its size: each refused with an error that names the limit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from finetune_studio.api.app import create_app
from finetune_studio.config import Settings, get_settings
from finetune_studio.supervisor.launcher import LocalProcessLauncher
from tests.helpers.children import STAND_IN_WORKER
from tests.helpers.jobs import InstantLauncher, dataset, start_body
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for


@pytest.fixture
def small_limits(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(data_dir=tmp_path / "data", max_request_bytes=4096, max_dataset_bytes=100)
    with TestClient(create_app(settings, launcher=InstantLauncher()), base_url="http://127.0.0.1") as client:
        yield client


def _padded(body: dict[str, Any], size: int) -> bytes:
    """body as JSON of exactly size bytes (an unknown field takes the padding)."""
    text = json.dumps({**body, "padding": ""})
    return json.dumps({**body, "padding": "x" * (size - len(text))}).encode()


def test_a_body_over_the_limit_gets_413_naming_the_limit(small_limits: TestClient, tmp_path: Path) -> None:
    body = start_body(dataset(tmp_path))
    json_type = {"content-type": "application/json"}
    assert small_limits.post("/train/start", content=_padded(body, 4096), headers=json_type).status_code == 200

    declared = small_limits.post("/train/start", content=_padded(body, 4097), headers=json_type)

    def chunks() -> Iterator[bytes]:
        data = _padded(body, 20_000)
        for start in range(0, len(data), 1000):
            yield data[start : start + 1000]

    chunked = small_limits.post("/train/start", content=chunks(), headers=json_type)  # no Content-Length
    for response in (declared, chunked):
        assert response.status_code == 413
        assert "over this server's limit of 4096 bytes" in response.json()["detail"]
        assert "FINETUNE_STUDIO_MAX_REQUEST_BYTES" in response.json()["detail"]
    assert small_limits.get("/train/jobs").json()["count"] == 1
    assert get_settings().max_request_bytes == 1024 * 1024  # the default: 1 MiB


def test_a_chat_body_over_the_limit_gets_413_in_openais_shape(small_limits: TestClient) -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    json_type = {"content-type": "application/json"}
    declared = small_limits.post("/v1/chat/completions", content=_padded(chat, 4097), headers=json_type)
    chunked = small_limits.post("/v1/chat/completions", content=iter([_padded(chat, 20_000)]), headers=json_type)
    for response in (declared, chunked):
        assert response.status_code == 413
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["code"]) == ("invalid_request_error", "request_too_large")
        assert "over this server's limit of 4096 bytes; a chat request carries the whole conversation" in error["message"]
        assert "FINETUNE_STUDIO_MAX_REQUEST_BYTES" in error["message"]
    # A body that fits goes on to the route (which finds no such model).
    fits = small_limits.post("/v1/chat/completions", content=_padded(chat, 4096), headers=json_type)
    assert fits.status_code == 404 and fits.json()["error"]["code"] == "model_not_found"


def test_a_dataset_file_over_the_limit_is_refused_naming_the_file_and_the_limit(
    small_limits: TestClient, tmp_path: Path
) -> None:
    fits = tmp_path / "fits.jsonl"
    fits.write_text('{"text": "' + "a" * (100 - 13) + '"}\n')
    big = tmp_path / "big.jsonl"
    big.write_text('{"text": "' + "a" * (101 - 13) + '"}\n')
    assert (fits.stat().st_size, big.stat().st_size) == (100, 101)

    assert small_limits.post("/train/start", json=start_body(fits)).status_code == 200
    for body in (start_body(big), {**start_body(fits), "local_datasets": [str(fits), str(big)]},
                 {**start_body(fits), "local_eval_datasets": [str(big)]}):
        refused = small_limits.post("/train/start", json=body)
        assert refused.status_code == 400
        answer = refused.json()
        assert answer["status"] == "error"
        assert f"dataset file {big} is 101 bytes, over this server's limit of 100 bytes" in answer["error"]
        assert "FINETUNE_STUDIO_MAX_DATASET_BYTES" in answer["error"]


def test_the_queue_length_comes_from_the_environment_and_is_enforced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("FINETUNE_STUDIO_MAX_QUEUED_JOBS", "3")
    monkeypatch.setenv("FAKE_WORKER_GO", str(tmp_path / "never"))  # the running job holds before its first step
    settings = get_settings(data_dir=tmp_path / "data", stop_grace_seconds=5.0, kill_grace_seconds=1.0)
    assert settings.max_queued_jobs == 3
    body = start_body(dataset(tmp_path))
    with TestClient(create_app(settings, launcher=LocalProcessLauncher(module=STAND_IN_WORKER)), base_url="http://127.0.0.1") as client:
        running = client.post("/train/start", json=body).json()["job_id"]
        wait_for(lambda: client.get(f"/train/status/{running}").json()["phase"] == "configuring", timeout=60,
                 what="the first job to run")
        queued = [client.post("/train/start", json=body) for _ in range(3)]
        assert [r.status_code for r in queued] == [200] * 3
        refused = client.post("/train/start", json=body)
        assert refused.status_code == 429
        assert refused.json()["error"] == "the queue is full (3 jobs waiting, the limit is 3); try again later"
        # Room again once a queued job is gone.
        client.post(f"/train/stop/{queued[0].json()['job_id']}")
        assert client.post("/train/start", json=body).status_code == 200
        client.post(f"/train/stop/{running}")


@pytest.mark.parametrize("number", ["Infinity", "-Infinity", "NaN"])
def test_numbers_that_are_not_finite_are_422_not_500(small_limits: TestClient, tmp_path: Path, number: str) -> None:
    data = dataset(tmp_path)
    for field in ("learning_rate", "weight_decay", "batch_size", "max_grad_norm", "warmup_ratio"):
        raw = f'{{"model_name": "m", "training_type": "LoRA/QLoRA", "format_type": "raw",' \
              f' "local_datasets": ["{data}"], "{field}": {number}}}'
        response = small_limits.post("/train/start", content=raw, headers={"content-type": "application/json"})
        assert response.status_code == 422, (field, response.text)
        assert any(error["loc"] == ["body", field] for error in response.json()["detail"])
    assert small_limits.get("/train/jobs").json()["count"] == 0
