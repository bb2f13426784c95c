"""Failures are classified, and the error says what to do.

Real children fail in three ways here, side by side (one server each): out of
memory and a full disk are injected at the first training step by a test hook
(tests/helpers/hooked_child.py); target_modules that match nothing is a real
config_invalid. model_not_found and dataset_invalid with real children are in
tests/integration/. The classifier itself, a SIGKILLed worker (worker_died) and a
worker that will not exit are checked with the stand-in worker, without torch.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from finetune_studio.api.app import create_app
from finetune_studio.config import Settings
from finetune_studio.supervisor.launcher import LocalProcessLauncher, WorkerLauncher
from finetune_studio.training.child import classify
from tests.helpers.children import STAND_IN_WORKER
from tests.helpers.hooked_child import HookedLauncher, Hooks
from tests.helpers.jobs import collect, dataset, job_request, phases, start_body
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for
from tests.helpers.processes import alive
from tests.helpers.servers import LiveServer

OOM_ADVICE = ("batch_size", "gradient_accumulation_steps", "max_seq_length")
DISK_ADVICE = ("Free space", "save_steps")


@pytest.mark.train
def test_real_failures_end_in_error_with_their_code_and_a_fix(live_server: Any, tiny_model: Path, tmp_path: Path) -> None:
    cases: dict[str, tuple[WorkerLauncher, dict[str, Any]]] = {
        "out_of_memory": (HookedLauncher(Hooks(fault="out_of_memory")), {}),
        "disk_full": (HookedLauncher(Hooks(fault="disk_full")), {}),
        "config_invalid": (LocalProcessLauncher(), {"target_modules": ["no_such_layer"]}),  # the production child
    }
    started: dict[str, tuple[LiveServer, str]] = {}
    for code, (launcher, overrides) in cases.items():
        server = live_server(launcher, data_dir=tmp_path / code)
        with server.client() as client:
            started[code] = (server, client.start(job_request(tiny_model, max_steps=5, **overrides)))

    finals: dict[str, dict[str, Any]] = {}
    for code, (server, job_id) in started.items():
        with server.client() as client:
            wait_for(lambda job=job_id: client.status(job)["phase"] == "error", timeout=300, what=f"the {code} job to fail")
            events = collect(client, job_id)
            finals[code] = events[-1].data
            failed_in = "training" if code != "config_invalid" else "configuring"
            assert phases(events)[-2:] == [failed_in, "error"]
            assert finals[code]["details"]["error_code"] == code
            wait_for(lambda pid=finals[code]["details"]["worker_pid"]: not alive(pid), timeout=60, what="the child to exit")
            assert client.health() == {"status": "ok"}

    assert "Out of memory (CUDA out of memory" in finals["out_of_memory"]["error"]
    assert all(word in finals["out_of_memory"]["error"] for word in OOM_ADVICE)
    assert "The disk is full (" in finals["disk_full"]["error"] and "No space left on device" in finals["disk_full"]["error"]
    assert all(word in finals["disk_full"]["error"] for word in DISK_ADVICE)
    assert "target_modules ['no_such_layer'] do not match this model's layers" in finals["config_invalid"]["error"]


class _Wrapped(RuntimeError):
    pass


def _wrapped(cause: BaseException) -> BaseException:
    try:
        raise _Wrapped("saving failed") from cause
    except _Wrapped as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (MemoryError(), "out_of_memory"),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), "out_of_memory"),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to"
                      " allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)"), "out_of_memory"),
        (OSError(errno.ENOMEM, "Cannot allocate memory"), "out_of_memory"),
        (OSError(errno.ENOSPC, "No space left on device"), "disk_full"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk_full"),
        (RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on'
                      ' device" })'), "disk_full"),
        (_wrapped(OSError(errno.ENOSPC, "No space left on device")), "disk_full"),
        (ValueError("something else"), "training_failed"),
    ],
)
def test_the_classifier_names_the_failure_and_the_fix(exc: BaseException, code: str) -> None:
    found, text = classify(exc)
    assert found == code
    advice = {"out_of_memory": OOM_ADVICE, "disk_full": DISK_ADVICE, "training_failed": ("Training failed: ",)}[code]
    assert all(word in text for word in advice), text


def stand_in_worker_app(tmp_path: Path, **grace: float) -> tuple[Any, dict[str, Any]]:
    """An app whose jobs run the stand-in worker, and a start body for it (3 steps)."""
    settings = Settings(data_dir=tmp_path / "data", **grace)
    app = create_app(settings, launcher=LocalProcessLauncher(module=STAND_IN_WORKER))
    return app, start_body(dataset(tmp_path), max_steps=None)


def test_a_sigkilled_worker_ends_in_worker_died_naming_the_signal_and_the_likely_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("FAKE_WORKER_GO", str(tmp_path / "never"))  # holds the stand-in before its first step
    app, body = stand_in_worker_app(tmp_path, stop_grace_seconds=5, kill_grace_seconds=1)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        victim = client.post("/train/start", json=body).json()["job_id"]
        after = client.post("/train/start", json=body).json()["job_id"]
        status = wait_for(
            lambda: (s := client.get(f"/train/status/{victim}").json())["phase"] == "configuring" and s,
            timeout=60, what="the worker to run",
        )
        os.kill(status["details"]["worker_pid"], signal.SIGKILL)
        final = wait_for(
            lambda: (s := client.get(f"/train/status/{victim}").json())["phase"] == "error" and s,
            timeout=60, what="worker_died",
        )
        assert final["details"]["error_code"] == "worker_died" and final["details"]["signal"] == "SIGKILL"
        assert "killed by SIGKILL before the job finished" in final["error"]
        assert "ran out of memory" in final["error"] and "batch_size" in final["error"]
        # The server keeps serving, and the next job runs.
        wait_for(lambda: client.get(f"/train/status/{after}").json()["phase"] == "configuring", timeout=60,
                 what="the next job to start")
        client.post(f"/train/stop/{after}")
        wait_for(lambda: client.get(f"/train/status/{after}").json()["phase"] == "stopped", timeout=60, what="stop")


def test_a_worker_that_does_not_exit_after_its_end_is_killed_and_the_queue_moves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("FAKE_WORKER_LINGER", "1")
    app, body = stand_in_worker_app(tmp_path, stop_grace_seconds=0.5, kill_grace_seconds=0.5)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        first, second = (client.post("/train/start", json=body).json()["job_id"] for _ in range(2))
        done = wait_for(
            lambda: (s := client.get(f"/train/status/{first}").json())["phase"] == "completed" and s,
            timeout=60, what="the first job to complete",
        )
        # It reported its end, then lingered: SIGTERM (ignored), then SIGKILL, and the next job runs.
        wait_for(lambda: not alive(done["details"]["worker_pid"]), timeout=60, what="the lingering worker to be killed")
        wait_for(lambda: client.get(f"/train/status/{second}").json()["phase"] == "completed", timeout=60,
                 what="the next job to run")
        assert client.get(f"/train/status/{first}").json()["phase"] == "completed"
