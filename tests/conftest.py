"""Shared fixtures: the tiny model (built once per session), real servers on 127.0.0.1.

Servers run as real `finetune-studio serve` processes, so every test exercises the
same code path a user does: the API process, its supervisor, real training children.
Tests of the server alone script a worker in-process instead (`ScriptedWorker`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any, Optional

import psutil
import pytest

from finetune_studio.cli.client import StreamEvent, StudioClient
from finetune_studio.cli.local_server import LocalServer
from finetune_studio.supervisor.launcher import WorkerExit

REPO = Path(__file__).resolve().parent.parent
DEMO_DATA = Path(str(resources.files("finetune_studio.demo") / "tiny_alpaca.jsonl"))


class ServerProcess(LocalServer):
    """A `finetune-studio serve` child on a free loopback port, and clients for it."""

    def __init__(self, data_dir: Path, env: Optional[dict[str, str]] = None, args: Optional[list[str]] = None) -> None:
        super().__init__(data_dir, env={"FINETUNE_STUDIO_STOP_GRACE_SECONDS": "20", **(env or {})}, args=args or ())

    def client(self, token: Optional[str] = None) -> StudioClient:
        return StudioClient(self.url, token=token)

    def inference_child(self) -> Optional[int]:
        """The pid of the server's chat child, None while it has none."""
        assert self.pid is not None
        for child in psutil.Process(self.pid).children():
            if "finetune_studio.inference.child" in child.cmdline():
                return int(child.pid)
        return None


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that trains for real or drives a browser is slow as well, so that
    `pytest -m "not slow"` leaves them out: the fast lane (`bash scripts/test.sh -m "not slow"`)."""
    for item in items:
        if item.get_closest_marker("train") or item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.slow)


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


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the tests of a module that neither restart it nor change its
    settings: each test waits for its own jobs, so the next finds the queue empty.
    (A server's start and clean stop cost seconds; the jobs are what is tested.)"""
    server = ServerProcess(tmp_path_factory.mktemp("shared") / "data")
    server.start()
    yield server
    server.stop()


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


class SmallDisk:
    """A tmpfs of a few MiB mounted at `path`: a disk that a test can fill (`fill`) and
    free again (`free`), so that every write under it fails with ENOSPC in between."""

    FILLER = ".filler"

    def __init__(self, path: Path) -> None:
        self.path = path

    def free_bytes(self) -> int:
        info = os.statvfs(self.path)
        return info.f_bavail * info.f_frsize

    def fill(self) -> None:
        """Take every free byte (the filler grows until the kernel says ENOSPC)."""
        chunk = b"\0" * (64 * 1024)
        with open(self.path / self.FILLER, "ab", buffering=0) as filler:
            for size in (len(chunk), 4096, 1):
                try:
                    while True:
                        filler.write(chunk[:size])
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
        assert self.free_bytes() == 0

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.path / self.FILLER).unlink()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A 16 MiB tmpfs to fill (tests run as root here and in CI: `mount -t tmpfs` works);
    skipped, saying why, where it cannot be mounted. Unmounted at teardown."""
    point = tmp_path / "small-disk"
    point.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16M", "tmpfs", str(point)], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"a small tmpfs cannot be mounted here ({exc}): the disk-full tests need mount and root")
    if mounted.returncode != 0:
        pytest.skip(
            f"a small tmpfs cannot be mounted here (mount said: {mounted.stderr.strip() or mounted.returncode}):"
            " the disk-full tests need root, or CAP_SYS_ADMIN"
        )
    try:
        yield SmallDisk(point)
    finally:
        if subprocess.run(["umount", str(point)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=30)  # still busy: detach it
