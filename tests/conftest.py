"""Shared fixtures: the tiny model (built once per session), real servers on 127.0.0.1.

Servers run as real `finetune-studio serve` processes, so every test exercises the
same code path a user does: the API process, its supervisor, real training children.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest

from finetune_studio.cli.client import StreamEvent, StudioClient

REPO = Path(__file__).resolve().parent.parent
DEMO_DATA = Path(str(resources.files("finetune_studio.demo") / "tiny_alpaca.jsonl"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """A `finetune-studio serve` child on a free loopback port."""

    def __init__(self, data_dir: Path, env: Optional[dict[str, str]] = None, args: Optional[list[str]] = None) -> None:
        self.data_dir = data_dir
        self.env = {**os.environ, "FINETUNE_STUDIO_STOP_GRACE_SECONDS": "20", **(env or {})}
        self.args = args or []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.log_path = data_dir / f"server-{self.port}.log"

    def start(self) -> "ServerProcess":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "finetune_studio.cli.main", "serve", "--port", str(self.port),
                 "--data-dir", str(self.data_dir), "--log-level", "warning", *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited at start-up:\n{self.log_path.read_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server did not answer /health:\n{self.log_path.read_text()}")

    def client(self, token: Optional[str] = None) -> StudioClient:
        return StudioClient(self.url, token=token)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def restart(self) -> "ServerProcess":
        self.stop()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        return self.start()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama, built once per test session by the CLI."""
    directory = tmp_path_factory.mktemp("models") / "tiny-llama"
    subprocess.run(
        [sys.executable, "-m", "finetune_studio.cli.main", "make-tiny-model", str(directory)],
        check=True,
        capture_output=True,
    )
    return directory


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Any]:
    """Start servers (stopped at teardown): start_server(env=..., data_dir=...)."""
    servers: list[ServerProcess] = []

    def start(env: Optional[dict[str, str]] = None, data_dir: Optional[Path] = None, args: Optional[list[str]] = None) -> ServerProcess:
        server = ServerProcess(data_dir or tmp_path / "data", env, args)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def server(start_server: Any) -> ServerProcess:
    return start_server()  # type: ignore[no-any-return]


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
    }
    request.update(overrides)
    return request


def collect(client: StudioClient, job_id: str, last_event_id: int = 0) -> list[StreamEvent]:
    return list(client.stream(job_id, last_event_id=last_event_id))


def wait_for(predicate: Any, timeout: float = 120, interval: float = 0.05, what: str = "condition") -> Any:
    """Poll predicate until it returns something truthy; bounded so a broken test fails, not hangs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def phases(events: list[StreamEvent]) -> list[str]:
    return [e.data["phase"] for e in events if e.kind == "status"]
