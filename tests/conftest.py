"""Shared fixtures: the tiny model (built once per session), real servers on 127.0.0.1.

Servers run as real `finetune-studio serve` processes, so every test exercises the
same code path a user does: the API process, its supervisor, real training children.
Tests of the server alone script a worker in-process instead (tests.helpers.jobs's
`ScriptedWorker`). What the tests share besides fixtures is in tests/helpers/.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.helpers.disks import SmallDisk
from tests.helpers.servers import ServerProcess, stopped_at_teardown


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
    def make(env: Optional[dict[str, str]] = None, data_dir: Optional[Path] = None, args: Optional[list[str]] = None) -> ServerProcess:
        return ServerProcess(data_dir or tmp_path / "data", env, args)

    yield from stopped_at_teardown(make, ServerProcess.start, ServerProcess.stop)


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
