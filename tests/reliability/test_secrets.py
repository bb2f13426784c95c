"""Secrets: hf_token and wandb_token never reach the database, a log, an event or an answer.

Unique token strings go to a real server in every way a client can send them (a
job that trains, schema errors, refusals, a body too large, an unknown field); then
every byte the server answered and every file under its data dir (the SQLite file,
its WAL, the server's log, the worker's log, checkpoints, the adapter) is searched.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest

from tests.helpers.jobs import job_request
from tests.helpers.polling import wait_for
from tests.helpers.servers import ServerProcess

pytestmark = pytest.mark.train


def test_tokens_never_appear_in_the_database_logs_events_or_answers(
    start_server: object, tiny_model: Path, tmp_path: Path
) -> None:
    hf_token = f"hf_{uuid.uuid4().hex}"
    wandb_token = f"wandb_{uuid.uuid4().hex}"
    secrets = {"hf_token": hf_token, "wandb_token": wandb_token}
    data_dir = tmp_path / "data"
    # W&B, where installed, stays offline and writes under the data dir, which is searched too.
    env = {"FINETUNE_STUDIO_MAX_REQUEST_BYTES": "65536", "WANDB_MODE": "offline", "WANDB_DIR": str(data_dir)}
    server: ServerProcess = start_server(env=env, data_dir=data_dir, args=["--log-level", "debug"])  # type: ignore[operator]
    answers: list[bytes] = []

    def call(method: str, path: str, **kwargs: object) -> httpx.Response:
        response = httpx.request(method, f"{server.url}{path}", timeout=60, **kwargs)  # type: ignore[arg-type]
        answers.append(response.content)
        return response

    training = job_request(tiny_model, max_steps=2, save_steps=1, enable_wandb=True, wandb_project="p", **secrets)
    job_id = call("POST", "/train/start", json=training).json()["job_id"]

    # Every other way a token can come in, and the answer each gets.
    assert call("POST", "/train/start", json={**training, "num_epochs": 0, "max_steps": None}).status_code == 422
    assert call("POST", "/train/start", json={**training, "hf_token": [hf_token]}).status_code == 422
    assert call("POST", "/train/start", json={**training, "wandb_token": {"key": wandb_token}}).status_code == 422
    raw = json.dumps(training).encode()
    assert call("POST", "/train/start", content=raw, headers={"content-type": "text/plain"}).status_code == 422
    assert call("POST", "/train/start", content=raw[:-5], headers={"content-type": "application/json"}).status_code == 422
    assert call("POST", "/train/start", json={**training, "local_datasets": ["/no/such.jsonl"]}).status_code == 400
    assert call("POST", "/train/start", json={**training, "padding": "x" * 70_000}).status_code == 413
    noted = call("POST", "/train/start", json={**training, "max_steps": 1, "note": hf_token}).json()["job_id"]

    with server.client() as client:
        for job in (job_id, noted):
            wait_for(lambda job=job: client.status(job)["phase"] in ("completed", "error"), timeout=300, what="the job")
        assert client.status(job_id)["phase"] == "completed"
        for job in (job_id, noted):
            for path in (f"/train/status/{job}", f"/train/progress/{job}", f"/train/stream/{job}"):
                call("GET", path)
        call("GET", "/train/jobs")
        assert call("POST", f"/train/stop/{job_id}").status_code == 409
    assert len(answers) == 17

    files = [p for p in server.data_dir.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"studio.db", "studio.db-wal", "worker.log", server.log_path.name, "adapter_model.safetensors"} <= names
    for secret in secrets.values():
        for answer in answers:
            assert secret.encode() not in answer, answer[:500]
        for path in files:
            assert secret.encode() not in path.read_bytes(), f"{secret} found in {path}"
