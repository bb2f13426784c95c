"""Smaller holes: a training child's environment held the API token; `HEAD /health`
(what load balancers send) was a 405; a `Last-Event-ID` past the job's last event
streamed keep-alives until the job ended instead of saying so; a seed past what the
trainer takes failed the job late instead of at the door."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from finetune_studio.supervisor.launcher import child_environment
from tests.helpers.jobs import InstantLauncher, dataset, start_body
from tests.helpers.polling import wait_for

TOKEN = "edges-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_a_training_child_gets_none_of_the_servers_settings(
    live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FINETUNE_STUDIO_TOKEN", TOKEN)  # the server's token, as an operator sets it
    monkeypatch.setenv("FINETUNE_STUDIO_MAX_QUEUED_JOBS", "7")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # the training stack's own settings pass
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("FAKE_WORKER_GO", str(tmp_path / "never"))  # the child waits before its first step
    server = live_server()
    assert server.settings.token is not None  # the server did read the token
    job = httpx.post(f"{server.url}/train/start", json=start_body(dataset(tmp_path)), headers=AUTH).json()["job_id"]

    def worker_pid() -> Any:
        details = httpx.get(f"{server.url}/train/status/{job}", headers=AUTH).json()["details"]
        return details.get("worker_pid")

    pid = wait_for(worker_pid, timeout=60, what="the worker to start")
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    names = {entry.split(b"=", 1)[0].decode() for entry in environ.split(b"\0") if entry}
    assert TOKEN.encode() not in environ
    assert not {name for name in names if name.startswith("FINETUNE_STUDIO_")}
    assert {"HF_HOME", "CUDA_VISIBLE_DEVICES", "PATH", "PYTHONUNBUFFERED"} <= names
    httpx.post(f"{server.url}/train/stop/{job}", headers=AUTH)


def test_child_environment_drops_every_server_setting_and_keeps_the_rest() -> None:
    env = child_environment({"FINETUNE_STUDIO_TOKEN": "t", "FINETUNE_STUDIO_SOMETHING_NEW": "s",
                             "PATH": "/bin", "HF_TOKEN": "hf", "WANDB_API_KEY": "w"})
    assert {name: env[name] for name in ("PATH", "HF_TOKEN", "WANDB_API_KEY")} == {
        "PATH": "/bin", "HF_TOKEN": "hf", "WANDB_API_KEY": "w"}
    assert not [name for name in env if name.startswith("FINETUNE_STUDIO_")]


def test_the_tools_folder_setting_reaches_the_export_child() -> None:
    """The server's export check and the export child look for llama.cpp's tools in the same place."""
    env = child_environment({"FINETUNE_STUDIO_LLAMA_CPP_TOOLS": "/opt/llama", "FINETUNE_STUDIO_TOKEN": "t"})
    assert env["FINETUNE_STUDIO_LLAMA_CPP_TOOLS"] == "/opt/llama" and "FINETUNE_STUDIO_TOKEN" not in env


def test_head_health_answers_200_without_a_body_and_without_a_token(live_server: Any) -> None:
    server = live_server(host="0.0.0.0", token=TOKEN)
    head = httpx.head(f"{server.url}/health")
    assert head.status_code == 200 and head.content == b""
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    assert httpx.head(f"{server.url}/train/jobs").status_code == 401  # the API paths still want the token


def test_a_last_event_id_past_the_end_is_416_naming_the_last_event(
    live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_WORKER_GO", str(tmp_path / "go"))  # the job holds before its first step
    server = live_server()
    job = httpx.post(f"{server.url}/train/start", json=start_body(dataset(tmp_path))).json()["job_id"]
    wait_for(lambda: httpx.get(f"{server.url}/train/status/{job}").json()["phase"] == "configuring",
             timeout=60, what="the job to wait in configuring")
    last = 4  # idle, loading_model, loading_dataset, configuring

    def ask(after: int, how: str, timeout: float = 30) -> httpx.Response:
        url = f"{server.url}/train/stream/{job}"
        if how == "header":
            return httpx.get(url, headers={"Last-Event-ID": str(after)}, timeout=timeout)
        return httpx.get(url, params={"last_event_id": after}, timeout=timeout)

    for how in ("header", "query"):
        for after in (last + 1, 10**6):
            past = ask(after, how)  # at once: before, it kept the connection open until the job ended
            assert past.status_code == 416, (how, after, past.text)
            detail = past.json()["detail"]
            assert f"Last-Event-ID {after} is past the end of job {job}'s events: its last event is {last}." in detail
        # Caught up (equal to the last id) is normal for a running job: the stream opens and waits.
        with httpx.stream("GET", f"{server.url}/train/stream/{job}", headers={"Last-Event-ID": str(last)},
                          timeout=30) as caught_up:
            assert caught_up.status_code == 200
    (tmp_path / "go").touch()
    events = httpx.get(f"{server.url}/train/stream/{job}", timeout=60).text
    final = int(events.strip().rsplit("id: ", 1)[1])
    assert ask(final, "header").status_code == 200 and ask(final, "header").text == ""  # finished, fully read
    assert ask(final + 1, "header").status_code == 416


def test_a_seed_the_trainer_cannot_take_is_422(live_server: Any, tmp_path: Path) -> None:
    """Found with huge values: a seed past numpy's 2**32 - 1 used to fail the job only
    after its model had loaded ("Seed must be between 0 and 2**32 - 1")."""
    server = live_server(launcher=InstantLauncher())
    body = start_body(dataset(tmp_path))
    refused = httpx.post(f"{server.url}/train/start", json={**body, "random_seed": 2**32})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "random_seed"]
    assert httpx.post(f"{server.url}/train/start", json={**body, "random_seed": 2**32 - 1}).status_code == 200
