"""Job requests and what a test reads back of a job; workers that are no process.

`job_request` is a small real LoRA job (the tiny model, the demo data); `start_body`
a request for a server whose worker trains nothing (a stand-in: the model is never
loaded). `ScriptedWorker` is the base of the workers that launchers in this process
return instead of a child (`InstantLauncher`: every phase, one step, completed).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from finetune_studio.cli.client import StreamEvent, StudioClient
from finetune_studio.supervisor.launcher import WorkerExit
from finetune_studio.wire import WorkerSpec
from tests.helpers.paths import DEMO_DATA
from tests.helpers.polling import wait_for

if TYPE_CHECKING:
    from fastapi.testclient import TestClient


def job_request(model: Path, **overrides: Any) -> dict[str, Any]:
    """A small LoRA job on the tiny model and the demo data."""
    request: dict[str, Any] = {
        "model_name": str(model),
        "training_type": "LoRA/QLoRA",
        "format_type": "alpaca",
        "local_datasets": [str(DEMO_DATA)],
        "max_steps": 6,
        "learning_rate": "1e-3",
        "batch_size": 2,
        "lora_r": 4,
        "lora_alpha": 8,
        "max_seq_length": 128,
        "save_steps": 0,
        # Never compiled unless a test asks: under the default `auto`, a long test job (thousands of
        # steps, stopped early) would compile for a minute or more, as its machine's speed decides.
        "compile": False,
    }
    request.update(overrides)
    return request


def dataset(tmp_path: Path, name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_text('{"text": "hello"}\n')
    return path


def start_body(data: Path, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model_name": "some-org/some-model",
        "training_type": "LoRA/QLoRA",
        "format_type": "raw",
        "local_datasets": [str(data)],
        "max_steps": 2,
    }
    body.update(overrides)
    return body


def collect(client: StudioClient, job_id: str, last_event_id: int = 0) -> list[StreamEvent]:
    return list(client.stream(job_id, last_event_id=last_event_id))


def run_to_end(server: Any, request: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Start `request` on `server` (anything with `client()`) and follow it to its end: its id and last status."""
    with server.client() as client:
        job_id = client.start(request)
        return job_id, collect(client, job_id)[-1].data


def phases(events: list[StreamEvent]) -> list[str]:
    """The phases the job went through, in order. A phase said again with new words (training's
    compile decision, a Ray restart's word) is one phase: a status repeating the last one's
    phase is not listed again (`statuses` has every status)."""
    found: list[str] = []
    for event in events:
        if event.kind == "status" and (not found or found[-1] != event.data["phase"]):
            found.append(event.data["phase"])
    return found


def finished_job(client: TestClient, body: dict[str, Any]) -> str:
    """Start `body` on an app whose jobs complete at once (InstantLauncher); its id once completed."""
    answer = client.post("/train/start", json=body)
    assert answer.status_code == 200, answer.text
    job_id = str(answer.json()["job_id"])
    wait_for(lambda: client.get(f"/train/status/{job_id}").json()["phase"] == "completed", timeout=30, interval=0.02,
             what="the instant job to complete")
    return job_id


class ScriptedWorker:
    """A worker that is no process, for a launcher that plays a script: a subclass's
    `messages()` yields the wire's messages and may wait on `stop`, which a stop
    request, SIGTERM or SIGKILL all set; it always exits 0."""

    pid: Optional[int] = None

    def __init__(self) -> None:
        self.stop = asyncio.Event()

    async def request_stop(self) -> None:
        self.stop.set()

    def terminate(self) -> None:
        self.stop.set()

    def kill(self) -> None:
        self.stop.set()

    async def wait(self) -> WorkerExit:
        return WorkerExit(0)


class InstantHandle(ScriptedWorker):
    """A worker that is no process: it reports every phase, one step, and completes."""

    def __init__(self, spec: WorkerSpec) -> None:
        super().__init__()
        self.log_path = spec.output_dir / "worker.log"

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        for phase in ("loading_model", "loading_dataset", "configuring", "training"):
            yield {"type": "status", "phase": phase, "message": phase, "details": {}}
        yield {"type": "progress", "progress": {"step": 1, "total_steps": 1, "loss": 1.0, "learning_rate": 0.1,
                                                "progress_percent": 100.0}}
        yield {"type": "status", "phase": "completed", "message": "done", "details": {"adapter_dir": "none"}}


class InstantLauncher:
    async def launch(self, spec: WorkerSpec) -> InstantHandle:
        return InstantHandle(spec)
