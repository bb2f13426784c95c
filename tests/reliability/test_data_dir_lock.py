"""One server per data dir. A second server on a data dir in use used to run restart
recovery over the first's jobs (killing its training child, ending the job
`server_restarted`), then both ran the same queued jobs. Now the second refuses to
start, naming the one that holds the dir; the lock goes with a server that dies."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from finetune_studio.api.app import create_app
from finetune_studio.cli.local_server import free_port
from finetune_studio.config import Settings
from finetune_studio.errors import DataDirInUse
from finetune_studio.jobs.lock import LOCK_NAME, DataDirLock
from tests.helpers.jobs import InstantLauncher, collect, job_request, phases
from tests.helpers.polling import wait_for

SEED_ORDER = ["idle", "loading_model", "loading_dataset", "configuring", "training", "completed"]


def _serve(data_dir: Path, port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "finetune_studio.cli.main", "serve", "--port", str(port), "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=120, check=False,
    )


@pytest.mark.train
def test_a_second_server_on_a_data_dir_in_use_refuses_and_the_first_trains_on(start_server: Any, tiny_model: Path) -> None:
    first = start_server()
    with first.client() as client:
        running = client.start(job_request(tiny_model, max_steps=60))
        queued = client.start(job_request(tiny_model, max_steps=4))
        wait_for(lambda: client.progress(running), what="the first training step")
        child = client.status(running)["details"]["worker_pid"]

        port = free_port()
        second = _serve(first.data_dir, port)
        assert second.returncode == 2, second.stderr
        assert second.stderr.startswith(f"error: refusing to start: the data dir {first.data_dir} is in use")
        assert f"pid {first.pid}" in second.stderr and f"serving {first.url}" in second.stderr
        assert "--data-dir" in second.stderr and "Traceback" not in second.stderr
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0  # it never listened
        # Served any other way (the app's own start-up), it refuses as well, before recovery.
        with pytest.raises(DataDirInUse, match=f"pid {first.pid}"), \
                TestClient(create_app(Settings(data_dir=first.data_dir), launcher=InstantLauncher()), base_url="http://127.0.0.1"):
            pass
        assert os.path.exists(f"/proc/{child}")  # the first server's child was not killed

        events = {job: collect(client, job) for job in (running, queued)}
    for job, steps in ((running, 60), (queued, 4)):
        assert phases(events[job]) == SEED_ORDER, (job, phases(events[job]))
        # Trained once: exactly one progress event per step (two servers had run it twice).
        assert [e.data["step"] for e in events[job] if e.kind == "progress"] == list(range(1, steps + 1))
        assert [e.id for e in events[job]] == list(range(1, len(events[job]) + 1))


def test_a_killed_servers_lock_goes_with_it(start_server: Any) -> None:
    first = start_server()
    first_pid = first.pid
    assert json.loads((first.data_dir / LOCK_NAME).read_text())["pid"] == first_pid
    first.kill()  # SIGKILL: nothing is cleaned up; the kernel drops the flock
    second = start_server(data_dir=first.data_dir)
    assert second.pid != first_pid
    assert json.loads((first.data_dir / LOCK_NAME).read_text()) | {"since": ""} == {
        "pid": second.pid, "address": second.url, "since": ""}


def test_the_lock_names_its_holder_and_is_free_once_released(tmp_path: Path) -> None:
    with DataDirLock.acquire(tmp_path, "http://127.0.0.1:1234") as lock:
        assert lock.held
        with pytest.raises(DataDirInUse) as refused:
            DataDirLock.acquire(tmp_path, "http://127.0.0.1:5678")
        assert f"pid {os.getpid()}, serving http://127.0.0.1:1234, since " in str(refused.value)
        assert "give this one another --data-dir" in str(refused.value)
    assert not lock.held
    with DataDirLock.acquire(tmp_path, "http://127.0.0.1:5678"):
        pass
    # An app started after a lock was released takes it for its life, and gives it back.
    app = create_app(Settings(data_dir=tmp_path), launcher=InstantLauncher())
    with TestClient(app, base_url="http://127.0.0.1") as client:
        assert client.get("/health").status_code == 200
        with pytest.raises(DataDirInUse):
            DataDirLock.acquire(tmp_path, "elsewhere")
    DataDirLock.acquire(tmp_path, "elsewhere").release()
