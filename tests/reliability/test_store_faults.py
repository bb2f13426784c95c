"""Writes that fail on the supervision path: a child is never started in a loop.

A full disk under the data dir once made the supervisor start export children over
and over (the write recording each one failed, the write ending the job failed too,
so the job stayed queued): about 110 children of 200 MB filled the machine. Here the
store's writes fail on purpose, through a connection that refuses them while told
to (deterministic: SQLite on a full disk may still write into a WAL it has already
grown), and on a real tmpfs filled to the last byte.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.helpers.children import STAND_IN_EXPORT_WORKER, STAND_IN_WORKER
from tests.helpers.disks import SmallDisk
from tests.helpers.jobs import dataset, start_body
from tests.helpers.polling import wait_for
from tests.helpers.servers import LiveServer

_WRITES = ("insert", "update", "delete", "begin", "replace")


class FailingConnection:
    """A sqlite3 connection whose writes fail with SQLITE_FULL while `failing` is set."""

    def __init__(self, real: sqlite3.Connection) -> None:
        self.real = real
        self.failing = threading.Event()
        self.refused = 0

    def execute(self, sql: str, *args: Any) -> Any:
        if self.failing.is_set() and sql.lstrip().lower().startswith(_WRITES):
            self.refused += 1
            raise sqlite3.OperationalError("database or disk is full")
        return self.real.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def __enter__(self) -> Any:
        return self.real.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self.real.__exit__(*exc)


def our_workers() -> list[psutil.Process]:
    """This process's live stand-in children (the server runs in a thread here)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if STAND_IN_WORKER in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.Error:
            continue
    return found


class Watch:
    """Samples, until closed, the most stand-in children alive at once and whether /health answered."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.most_children = 0
        self.health: list[str] = []
        self.unanswered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while not self._stop.is_set():
                self.most_children = max(self.most_children, len(our_workers()))
                try:
                    answer = client.get("/health")
                    assert answer.status_code == 200
                    self.health.append(answer.json()["status"])
                except (httpx.HTTPError, AssertionError):
                    self.unanswered += 1
                self._stop.wait(0.02)


@pytest.fixture
def failing_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LiveServer, FailingConnection]]:
    from finetune_studio.config import Settings
    from finetune_studio.supervisor.launcher import LocalProcessLauncher

    monkeypatch.setenv("FAKE_WORKER_LOG", str(tmp_path / "workers.log"))
    monkeypatch.setenv("FAKE_WORKER_STEP_S", "0.05")
    settings = Settings(data_dir=tmp_path / "data", stop_grace_seconds=5, kill_grace_seconds=1)
    with LiveServer(settings, LocalProcessLauncher(module=STAND_IN_WORKER)) as server:
        store = server.app.state.studio.service.store
        connection = FailingConnection(store._db)
        store._db = connection
        yield server, connection


def starts(tmp_path: Path) -> int:
    log = tmp_path / "workers.log"
    return sum(1 for line in log.read_text().splitlines() if line.startswith("start")) if log.exists() else 0


def test_a_child_that_cannot_be_recorded_is_killed_and_the_job_is_held_failed_not_started_again(
    failing_server: tuple[LiveServer, FailingConnection], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    server, connection = failing_server
    go = tmp_path / "go"
    monkeypatch.setenv("FAKE_WORKER_GO", str(go))  # the stand-in waits for it before it trains
    client = server.client()
    request.addfinalizer(client.close)
    data = dataset(tmp_path)
    first = client.start(start_body(data, max_steps=3))
    second = client.start(start_body(data, max_steps=3))
    wait_for(lambda: client.status(first)["phase"] == "configuring", what="the first job to get ready")

    with Watch(server.url) as watch:
        connection.failing.set()  # every write fails from now: the first job's next phase, the second's start
        go.touch()
        wait_for(lambda: connection.refused >= 4, what="writes to be refused")
        time.sleep(2)  # long enough for a start loop to start dozens of children
        assert watch.most_children <= 1, f"{watch.most_children} children alive at once with one slot"
        degraded = client.health()
        assert degraded["status"] == "degraded"
        assert degraded["store"]["error_code"] == "disk_full"
        assert "Free space" in degraded["store"]["message"]
        # Each job is shown failed from memory, and neither runs on.
        for job_id in (first, second):
            status = client.status(job_id)
            assert status["phase"] == "error", status
            assert status["details"]["error_code"] == "disk_full"
        assert starts(tmp_path) <= 2, "a job whose state cannot be written was started again"
        assert not our_workers(), "a child whose job cannot be recorded is still alive"

        connection.failing.clear()  # space again: the held ends are written, the health is ok again
        wait_for(lambda: client.health()["status"] == "ok", timeout=30, what="health to be ok again")
        assert watch.unanswered == 0, "/health went unanswered while writes failed"
        assert "degraded" in watch.health
    store = server.app.state.studio.service.store
    wait_for(lambda: not server.app.state.studio.service.held_ids(), what="the held ends to be written")
    for job_id in (first, second):
        stored = store.get_job(job_id)
        assert stored.phase == "error" and stored.status["details"]["error_code"] == "disk_full"
        events = [e for e in client.stream(job_id) if e.kind == "status"]
        assert events[-1].data["phase"] == "error"
    assert starts(tmp_path) <= 2
    # The queue goes on once writes succeed: a new job runs to the end.
    third = client.start(start_body(data, max_steps=2))
    wait_for(lambda: client.status(third)["phase"] == "completed", what="a job after the fault to complete")


def test_failed_starts_back_off_and_never_exceed_the_slots(
    failing_server: tuple[LiveServer, FailingConnection], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Many queued jobs and a store that refuses every write: each start's child is
    killed, the starts slow down, and no more than one child is ever alive."""
    server, connection = failing_server
    client = server.client()
    request.addfinalizer(client.close)
    data = dataset(tmp_path)
    jobs = [client.start(start_body(data, max_steps=3)) for _ in range(12)]
    connection.failing.set()  # the first may have started already; every start from now fails
    with Watch(server.url) as watch:
        time.sleep(2.5)
        started = starts(tmp_path)
        assert watch.most_children <= 1
        connection.failing.clear()
        wait_for(lambda: all(client.status(j)["phase"] in ("completed", "error") for j in jobs), timeout=60,
                 what="every job to end")
    # After each failed start the next waits 0.5, 1, 2 s ...: a handful, not dozens, started in 2.5 s.
    assert started <= 5, f"{started} children started in 2.5 s of failing writes"
    assert watch.unanswered == 0


# -- a real full disk ------------------------------------------------------------


def test_a_full_disk_under_the_data_dir_never_starts_more_children_than_slots(
    small_disk: SmallDisk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from finetune_studio.config import Settings
    from finetune_studio.supervisor.launcher import LocalProcessLauncher

    monkeypatch.setenv("FAKE_WORKER_STEP_S", "0.02")
    settings = Settings(data_dir=small_disk.path / "data", stop_grace_seconds=5, kill_grace_seconds=1)
    server = LiveServer(settings, LocalProcessLauncher(module=STAND_IN_WORKER), LocalProcessLauncher(module=STAND_IN_EXPORT_WORKER))
    with server, server.client() as client:
        data = dataset(tmp_path)
        done = client.start(start_body(data, max_steps=2))
        wait_for(lambda: client.status(done)["phase"] == "completed", what="a job to complete")
        folder = Path(server.app.state.studio.service.store.get_job(done).output_dir)  # the stand-in saves nothing
        (folder / "adapter").mkdir(exist_ok=True)
        (folder / "adapter" / "adapter_config.json").write_text("{}")
        (folder / "job.json").write_text('{"method": "lora"}')
        with Watch(server.url) as watch:
            small_disk.fill()
            # Whatever of these the full disk lets through, none may loop.
            answers = [httpx.post(f"{server.url}/export/start", json={"job_id": done, "format": "merged_16bit"}) for _ in range(3)]
            answers += [httpx.post(f"{server.url}/train/start", json=start_body(data, max_steps=2)) for _ in range(3)]
            for answer in answers:
                assert answer.status_code < 500 or answer.status_code in (503, 507), answer.text
            time.sleep(3)
            assert watch.most_children <= 2, f"{watch.most_children} children at once with a training and an export slot"
            small_disk.free()
            wait_for(lambda: client.health()["status"] == "ok", timeout=30, what="health to be ok again")
            assert watch.unanswered == 0, "/health went unanswered on a full disk"
        for job in client.jobs():
            wait_for(lambda j=job["job_id"]: client.status(j)["phase"] in ("completed", "error", "stopped"),
                     timeout=60, what="every job to end")
        for export in client.exports():
            wait_for(lambda e=export["export_id"]: client.export_status(e)["phase"] in ("completed", "error", "stopped"),
                     timeout=60, what="every export to end")


def test_a_deleted_jobs_folder_that_cannot_be_removed_is_503_saying_why(
    failing_server: tuple[LiveServer, FailingConnection], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's rows go; its folder stays on a file system that refuses (read-only):
    503 `storage_unavailable` naming the folder and the reason, never a 500."""
    import errno
    import shutil

    server, _ = failing_server
    with server.client() as client:
        done = client.start(start_body(dataset(tmp_path), max_steps=2))
        wait_for(lambda: client.status(done)["phase"] == "completed", what="a job to complete")

        def refuse(path: object, *args: object, **kwargs: object) -> None:
            raise OSError(errno.EROFS, "Read-only file system", str(path))

        monkeypatch.setattr(shutil, "rmtree", refuse)
        answer = httpx.delete(f"{server.url}/train/jobs/{done}")
    assert answer.status_code == 503, answer.text
    assert answer.json()["error_code"] == "storage_unavailable"
    assert "Read-only file system" in answer.json()["detail"] and done in answer.json()["detail"]
    assert answer.headers["x-should-retry"] == "false"
