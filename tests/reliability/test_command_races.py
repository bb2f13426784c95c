"""Commands apply to the job as it is now: stop, cancel, pause, resume and restarts in any order.

Once, a cancel sent right after a resume answered 200 and the job trained on to
`succeeded` (the cancel reached the paused run, which was still exiting), and a
cancel sent while a pause was being carried out ended the job paused. The first
tests pin those races down; the state machine drives random sequences of every
command against a real server (the stand-in child, real processes) and checks the
invariants after each step and at the end.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from finetune_studio.config import Settings
from finetune_studio.supervisor.launcher import LocalProcessLauncher
from tests.helpers.children import STAND_IN_WORKER
from tests.helpers.jobs import dataset, start_body
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for
from tests.helpers.servers import LiveServer

TERMINAL = ("completed", "error", "stopped")
# The commands the machine sends: each one's route and what it asks of the job.
COMMANDS = {
    "stop": ("/train/stop/{}", "stop"),
    "cancel": ("/v1/fine_tuning/jobs/{}/cancel", "stop"),
    "pause": ("/v1/fine_tuning/jobs/{}/pause", "pause"),
    "resume": ("/v1/fine_tuning/jobs/{}/resume", "resume"),
}


def post(server: LiveServer, path: str) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", timeout=30)


def start(server: LiveServer, body: dict[str, Any]) -> str:
    with server.client() as client:
        return client.start(body)


def status(server: LiveServer, job_id: str) -> dict[str, Any]:
    answer = httpx.get(f"{server.url}/train/status/{job_id}", timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def starts(log: Path, job_id: str) -> int:
    """How many times the stand-in child of `job_id` started (its log's "start ID" lines)."""
    return log.read_text().splitlines().count(f"start {job_id}") if log.exists() else 0


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in child's environment: checkpoints on stop, a log of its starts."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("FAKE_WORKER_CHECKPOINTS", "1")
    log = tmp_path / "workers.log"
    monkeypatch.setenv("FAKE_WORKER_LOG", str(log))
    return log


def serve(data_dir: Path) -> LiveServer:
    settings_ = Settings(data_dir=data_dir, stop_grace_seconds=5, kill_grace_seconds=1)
    return LiveServer(settings_, LocalProcessLauncher(module=STAND_IN_WORKER)).__enter__()


def test_a_cancel_right_after_a_resume_ends_the_job_at_once(
    stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The paused child lingers (it ignores SIGTERM), so the resume finds its run still exiting.
    monkeypatch.setenv("FAKE_WORKER_LINGER", "1")
    monkeypatch.setenv("FAKE_WORKER_STEP_S", "0.05")
    server = serve(tmp_path / "data")
    try:
        job = start(server, start_body(dataset(tmp_path), max_steps=400))
        wait_for(lambda: status(server, job)["phase"] == "training", what="the job to train")
        assert post(server, f"/v1/fine_tuning/jobs/{job}/pause").status_code == 200
        wait_for(lambda: (status(server, job).get("details") or {}).get("paused"), what="the job to be paused")
        assert post(server, f"/v1/fine_tuning/jobs/{job}/resume").status_code == 200
        cancel = post(server, f"/v1/fine_tuning/jobs/{job}/cancel")
        assert cancel.status_code == 200, cancel.text
        ended = status(server, job)
        assert ended["phase"] == "stopped" and not (ended.get("details") or {}).get("paused"), ended
        assert cancel.json()["status"] == "cancelled"
        # The lingering paused child is killed after the grace; the job never runs again.
        wait_for(lambda: not server.app.state.studio.supervisor._active, timeout=30, what="the old run to end")
        time.sleep(0.5)
        assert status(server, job)["phase"] == "stopped"
        assert starts(stand_in, job) == 1
        assert post(server, f"/v1/fine_tuning/jobs/{job}/resume").status_code == 409
    finally:
        server.__exit__()


def test_a_cancel_during_a_pause_is_final(stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_WORKER_STEP_S", "0.5")  # the pause waits for a long step
    server = serve(tmp_path / "data")
    try:
        job = start(server, start_body(dataset(tmp_path), max_steps=400))
        wait_for(lambda: status(server, job)["phase"] == "training")
        assert post(server, f"/v1/fine_tuning/jobs/{job}/pause").status_code == 200
        assert post(server, f"/v1/fine_tuning/jobs/{job}/cancel").status_code == 200
        ended = wait_for(lambda: (s := status(server, job))["phase"] in TERMINAL and s, what="the job to end")
        assert ended["phase"] == "stopped" and not (ended.get("details") or {}).get("paused"), ended
        answer = post(server, f"/v1/fine_tuning/jobs/{job}/resume")
        assert answer.status_code == 409, answer.text
    finally:
        server.__exit__()


def test_a_stop_accepted_during_the_last_step_ends_stopped(
    stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_WORKER_STEP_S", "1.0")
    server = serve(tmp_path / "data")
    try:
        job = start(server, start_body(dataset(tmp_path), max_steps=1))
        wait_for(lambda: status(server, job)["phase"] == "training")
        assert post(server, f"/train/stop/{job}").status_code == 200  # during its one (last) step
        ended = wait_for(lambda: (s := status(server, job))["phase"] in TERMINAL and s, what="the job to end")
        assert ended["phase"] == "stopped", ended
    finally:
        server.__exit__()


# -- the model ---------------------------------------------------------------------


@dataclass
class Expected:
    """What the API accepted for one job: its last accepted command, and what came after."""

    last: str = "start"  # start | stop | pause | resume
    resumes: int = 0
    restarted_since: bool = False  # a server restart after the last accepted command (it stops a running job)
    seen_terminal: bool = False


class Commands(RuleBasedStateMachine):
    """Random start, stop, cancel, pause, resume and restart against a real server."""

    root: Path
    log: Path

    jobs = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        self.data_dir = self.root / uuid.uuid4().hex[:8]
        self.data = dataset(self.root, f"{self.data_dir.name}.jsonl")
        self.server: Optional[LiveServer] = serve(self.data_dir)
        self.expected: dict[str, Expected] = {}

    @property
    def live(self) -> LiveServer:
        assert self.server is not None
        return self.server

    @initialize(target=jobs)
    def first(self) -> str:
        return self.start()

    @rule(target=jobs)
    def start(self) -> str:
        job = start(self.live, start_body(self.data, max_steps=8))
        self.expected[job] = Expected()
        return job

    def _command(self, path: str, job: str, what: str) -> None:
        answer = post(self.live, path)
        assert answer.status_code in (200, 409), f"{path}: {answer.status_code} {answer.text}"
        if answer.status_code == 200:
            expected = self.expected[job]
            expected.last, expected.restarted_since = what, False
            if what == "resume":
                expected.resumes += 1
                expected.seen_terminal = False

    @rule(job=jobs, command=st.sampled_from(sorted(COMMANDS)))
    def command(self, job: str, command: str) -> None:
        path, what = COMMANDS[command]
        self._command(path.format(job), job, what)

    @rule(seconds=st.sampled_from([0.05, 0.2, 0.6]))
    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    @rule()
    def restart(self) -> None:
        self.live.__exit__()
        self.server = serve(self.data_dir)
        for expected in self.expected.values():
            expected.restarted_since = True

    @invariant()
    def no_terminal_job_trains_again(self) -> None:
        """A job seen ended is never seen running again, except after an accepted resume."""
        if self.server is None:
            return
        for job, expected in self.expected.items():
            phase = status(self.live, job)["phase"]
            if phase in TERMINAL:
                expected.seen_terminal = True
            else:
                assert not expected.seen_terminal, f"job {job} ended, then was {phase} again without a resume"
            assert starts(self.log, job) <= 1 + expected.resumes, f"job {job} was started again without a resume"

    def teardown(self) -> None:
        if self.server is None:
            return
        try:
            ends = {}
            for job in self.expected:
                ends[job] = wait_for(
                    lambda j=job: (s := status(self.live, j))["phase"] in TERMINAL and s, timeout=60, what=f"{job} to end"
                )
            for job, expected in self.expected.items():
                end = ends[job]
                paused = bool((end.get("details") or {}).get("paused"))
                where = f"job {job}: accepted {expected}, ended {end['phase']} paused={paused}: {end['message']}"
                if expected.last == "stop":
                    assert end["phase"] == "stopped" and not paused, where
                elif expected.last == "pause":
                    assert end["phase"] == "stopped" and paused, where
                elif expected.restarted_since:  # a restart stops what runs (and keeps what is queued)
                    assert end["phase"] in ("completed", "stopped"), where
                else:
                    assert end["phase"] == "completed", where
                assert starts(self.log, job) <= 1 + expected.resumes, where
        finally:
            self.live.__exit__()
            self.server = None


@pytest.mark.slow
def test_commands_as_a_state_machine(stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_WORKER_STEP_S", "0.1")
    Commands.root = tmp_path
    Commands.log = stand_in
    run_state_machine_as_test(Commands, settings=settings(max_examples=25, stateful_step_count=12, deadline=None))
