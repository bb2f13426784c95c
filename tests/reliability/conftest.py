"""Fixtures for the reliability tests: the app under a real uvicorn in this process
(with a stand-in worker, for load and fuzzing, or real children with test hooks:
hooked_child.py), and a launcher that starts no process."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Optional

import pytest
import uvicorn

from finetune_studio.api.app import create_app
from finetune_studio.cli.client import StudioClient
from finetune_studio.cli.local_server import free_port
from finetune_studio.config import Settings
from finetune_studio.supervisor.launcher import LocalProcessLauncher, WorkerLauncher
from finetune_studio.wire import WorkerSpec
from tests.conftest import REPO, ScriptedWorker, wait_for

FAKE_WORKER = "tests.reliability.fake_worker"
FAKE_EXPORT_WORKER = "tests.reliability.fake_export_worker"


class LiveServer:
    """create_app(settings, launcher) served by uvicorn on 127.0.0.1, in a thread of the test process."""

    def __init__(
        self, settings: Settings, launcher: Optional[WorkerLauncher] = None, export_launcher: Optional[WorkerLauncher] = None
    ) -> None:
        self.settings = settings
        self.app = create_app(settings, launcher, export_launcher=export_launcher)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            ws="none",
            lifespan="on",
            backlog=2048,
            timeout_graceful_shutdown=3,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn-{self.port}", daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        wait_for(lambda: self.server.started or not self.thread.is_alive(), timeout=30, what="uvicorn to start")
        assert self.server.started, "uvicorn did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir

    def client(self, token: Optional[str] = None) -> StudioClient:
        return StudioClient(self.url, token=token)


@pytest.fixture
def live_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """live_server(launcher=None, **settings) -> a started LiveServer whose jobs run
    tests/reliability/fake_worker.py, or what `launcher` starts (hooked_child.HookedLauncher:
    real children with test hooks); its exports run tests/reliability/fake_export_worker.py."""
    monkeypatch.chdir(REPO)  # the fake worker is imported from the repository
    servers: list[LiveServer] = []

    def start(launcher: Optional[WorkerLauncher] = None, **overrides: Any) -> LiveServer:
        values: dict[str, Any] = {"data_dir": tmp_path / "data", "stop_grace_seconds": 5, "kill_grace_seconds": 1}
        values.update(overrides)
        server = LiveServer(
            Settings(**values),
            launcher or LocalProcessLauncher(module=FAKE_WORKER),
            export_launcher=LocalProcessLauncher(module=FAKE_EXPORT_WORKER),
        )
        servers.append(server)
        return server.__enter__()

    yield start
    for server in servers:
        server.__exit__()


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
