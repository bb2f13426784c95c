"""Stop in every phase: the job ends `stopped`, and its training child is gone.

A real child is held in each phase by a test hook (tests/helpers/hooked_child.py,
started by the server's HookedLauncher): it announces the phase, then waits there
until the stop arrives, and goes on exactly as it would have. One server per phase,
all started at once, so the four children load torch side by side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.hooked_child import HookedLauncher, Hooks
from tests.helpers.jobs import collect, job_request, phases
from tests.helpers.polling import wait_for
from tests.helpers.processes import alive
from tests.helpers.servers import LiveServer

pytestmark = pytest.mark.train

RUNNING_PHASES = ["loading_model", "loading_dataset", "configuring", "training"]
SEED_ORDER = ["idle", "loading_model", "loading_dataset", "configuring", "training", "completed"]


def test_stop_in_every_phase_ends_stopped_and_the_child_is_gone(live_server: Any, tiny_model: Path, tmp_path: Path) -> None:
    servers: dict[str, LiveServer] = {}
    for phase in RUNNING_PHASES:
        # A long grace: the stop must be cooperative, not the escalation's SIGTERM.
        launcher = HookedLauncher(Hooks(pause_in=phase))
        servers[phase] = live_server(launcher, data_dir=tmp_path / phase, stop_grace_seconds=600)

    jobs: dict[str, tuple[str, str]] = {}
    for phase, server in servers.items():
        with server.client() as client:
            running = client.start(job_request(tiny_model, max_steps=50, save_steps=0))
            queued = client.start(job_request(tiny_model, max_steps=50, save_steps=0))
            jobs[phase] = (running, queued)

    for phase, server in servers.items():
        running, queued = jobs[phase]
        with server.client() as client:
            # idle: a queued job stops at once and never starts a child.
            answer = client.stop(queued)
            assert answer["phase"] == "stopped" and answer["message"] == "Stopped before it started"
            assert phases(collect(client, queued)) == ["idle", "stopped"]
            with pytest.raises(Exception, match="409.*already ended in stopped"):
                client.stop(queued)
            assert not (server.data_dir / "jobs" / queued / "worker.log").exists()

            status = wait_for(
                lambda job=running, phase=phase: (s := client.status(job))["phase"] == phase and s, timeout=180, what=f"the job to reach {phase}"
            )
            pid = status["details"]["worker_pid"]
            assert alive(pid)
            first = client.stop(running)
            assert first["details"]["stop_requested"] is True and first["phase"] == phase
            # A second stop is answered clearly: still stopping, or (if it was quick) already ended.
            again = httpx.post(f"{server.url}/train/stop/{running}")
            assert (again.status_code == 200 and "already requested" in again.json()["message"]) or (
                again.status_code == 409 and "already ended in stopped" in again.json()["detail"]
            ), again.text

    for phase, server in servers.items():
        running, _ = jobs[phase]
        with server.client() as client:
            wait_for(lambda job=running: client.status(job)["phase"] == "stopped", timeout=300, what=f"the stop in {phase}")
            events = collect(client, running)
            reached = SEED_ORDER[: SEED_ORDER.index(phase) + 1]
            assert phases(events) == [*reached, "stopped"]
            final = events[-1].data
            pid = final["details"]["worker_pid"]
            if phase == "training":
                assert final["message"].startswith("Stopped at step 1 of 50")
                assert (Path(final["details"]["adapter_dir"]) / "adapter_model.safetensors").is_file()
            else:
                assert final["message"] == f"Stopped during {phase} (a stop was requested); nothing was trained"
                assert not (server.data_dir / "jobs" / running / "adapter").exists()
            wait_for(lambda pid=pid: not alive(pid), timeout=60, what=f"the child stopped in {phase} to exit")
            with pytest.raises(Exception, match="409"):
                client.stop(running)
