"""The supervisor: runs queued jobs in worker processes and decides how each ends.

It lives in the API server's event loop. It takes queued jobs first in, first out
(up to `max_concurrent_jobs` at once), launches each through a `WorkerLauncher`,
turns the worker's messages into phase changes and progress (through JobService,
the one writer), and, when the worker exits without having reported an end, writes
that end itself from the exit status: `stopped` if a stop was asked for, otherwise
`error` with `worker_died` and the signal or exit code.

Stop: a queued job is stopped at once. A running one is asked to stop (it finishes
its step, saves, and reports `stopped`); after `stop_grace_seconds` it gets SIGTERM,
and after `kill_grace_seconds` more, SIGKILL.

A worker that reports its end but does not exit gets the same escalation, so a
finished job never holds its slot (or its GPU memory) for long.

Restart: on start-up, `recovery.recover_jobs` ends every job that was running when
the server went away (see there). Queued jobs stay queued and run in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from finetune_studio.config import Settings
from finetune_studio.errors import InvalidTransition, JobAlreadyFinished
from finetune_studio.jobs.phases import is_terminal
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobRecord
from finetune_studio.schemas import QUEUED_WARNINGS, WITHHELD_SECRETS, TrainingStatus
from finetune_studio.supervisor.launcher import (
    WorkerExit,
    WorkerHandle,
    WorkerLauncher,
    log_tail,
)
from finetune_studio.supervisor.recovery import recover_jobs
from finetune_studio.wire import OUT_OF_MEMORY_ADVICE, WorkerSpec

log = logging.getLogger("finetune_studio.supervisor")



@dataclass
class ActiveJob:
    job_id: str
    request: dict[str, Any]
    handle: Optional[WorkerHandle] = None
    stop_requested: bool = False
    task: Optional[asyncio.Task[None]] = None
    escalation: Optional[asyncio.Task[None]] = None
    notes: list[str] = field(default_factory=list)


class Supervisor:
    def __init__(self, service: JobService, launcher: WorkerLauncher, settings: Settings) -> None:
        self.service = service
        self.launcher = launcher
        self.settings = settings
        self._active: dict[str, ActiveJob] = {}
        # The secrets (hf_token, wandb_token) of queued jobs, held in memory only:
        # the rest of a request is read back from the store when the job starts. A
        # job queued before a restart runs without its tokens, and says so.
        self._secrets: dict[str, dict[str, str]] = {}
        self._wake = asyncio.Event()
        self._loop_task: Optional[asyncio.Task[None]] = None
        self._closing = False

    # -- life cycle ---------------------------------------------------------

    async def start(self) -> None:
        self.recover()
        self._loop_task = asyncio.create_task(self._schedule_forever(), name="supervisor")
        self._wake.set()

    def recover(self) -> None:
        recover_jobs(self.service)

    async def shutdown(self) -> None:
        """Stop running jobs cooperatively (they save), then make sure no worker outlives us."""
        self._closing = True
        if self._loop_task:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        active = list(self._active.values())
        for job in active:
            await self._request_stop(job, reason="the server is shutting down")
        tasks = [job.task for job in active if job.task]
        if tasks:
            grace = self.settings.stop_grace_seconds + self.settings.kill_grace_seconds + 5
            await asyncio.wait(tasks, timeout=grace)

    # -- queue --------------------------------------------------------------

    def submit(self, job_id: str, secrets: dict[str, str]) -> None:
        """A job was queued: remember its secrets (if any) and look for room to run it."""
        if secrets:
            self._secrets[job_id] = secrets
        self._wake.set()

    def queue_positions(self) -> dict[str, int]:
        waiting = [j for j in self.service.store.queued_job_ids() if j not in self._active]
        return {job_id: index + 1 for index, job_id in enumerate(waiting)}

    async def _schedule_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._start_what_fits()

    def _start_what_fits(self) -> None:
        if self._closing:
            return
        for job_id in self.service.store.queued_job_ids():
            if len(self._active) >= self.settings.max_concurrent_jobs:
                return
            if job_id in self._active:
                continue
            active = self._prepare(self.service.store.get_job(job_id))
            self._active[job_id] = active
            active.task = asyncio.create_task(self._run(active), name=f"job-{job_id}")

    def _prepare(self, job: JobRecord) -> ActiveJob:
        """The request a queued job's worker gets: as stored, with its secrets put back."""
        request = {k: v for k, v in job.request.items() if k not in (WITHHELD_SECRETS, QUEUED_WARNINGS)}
        secrets = self._secrets.pop(job.id, {})
        request.update(secrets)
        notes = [str(note) for note in job.request.get(QUEUED_WARNINGS, [])]
        lost = [name for name in job.request.get(WITHHELD_SECRETS, []) if name not in secrets]
        if lost:
            notes.append(f"this job was queued before a server restart and runs without {' and '.join(lost)}")
        return ActiveJob(job.id, request, notes=notes)

    # -- one job ------------------------------------------------------------

    async def _run(self, active: ActiveJob) -> None:
        job_id = active.job_id
        try:
            await self._drive(active)
        except Exception:  # the supervisor must outlive any one job's failure
            log.exception("supervising job %s failed", job_id)
            self._end_if_unfinished(job_id, "error", "internal_error", "the server failed while supervising this job")
        finally:
            if active.escalation:
                active.escalation.cancel()
            self._active.pop(job_id, None)
            with contextlib.suppress(Exception):
                self.service.set_worker(job_id, None)
            self._wake.set()

    async def _drive(self, active: ActiveJob) -> None:
        job_id = active.job_id
        job = self.service.store.get_job(job_id)
        spec = WorkerSpec(job_id=job_id, output_dir=Path(job.output_dir), request=active.request, warnings=active.notes)
        try:
            handle = await self.launcher.launch(spec)
        except OSError as exc:
            self._end_if_unfinished(job_id, "error", "worker_failed_to_start", f"the training process could not start: {exc}")
            return
        active.handle = handle
        if handle.pid:
            self.service.set_worker(job_id, handle.pid)
        if active.stop_requested:  # a stop arrived while we were launching
            await handle.request_stop()
            self._escalate_later(active)

        async for message in handle.messages():
            self._apply(active, message)
        exit_info = await handle.wait()

        if active.stop_requested:
            self._end_if_unfinished(
                job_id, "stopped", None, f"stopped: {exit_info.describe()} after it did not stop within the grace period"
            )
        else:
            reason = exit_info.describe()
            tail = log_tail(handle.log_path)
            self._end_if_unfinished(
                job_id,
                "error",
                "worker_died",
                f"{reason[0].upper()}{reason[1:]} before the job finished.{_death_advice(exit_info)}"
                + (f" Last lines of {handle.log_path}:\n{tail}" if tail else ""),
                extra={"exit_code": exit_info.returncode, "signal": exit_info.signal_name, "log_path": str(handle.log_path)},
            )

    def _apply(self, active: ActiveJob, message: dict[str, Any]) -> None:
        job_id = active.job_id
        kind = message.get("type")
        try:
            if kind == "status":
                self.service.transition(
                    job_id,
                    str(message["phase"]),
                    str(message.get("message", "")),
                    error=message.get("error"),
                    details=message.get("details"),
                )
                if is_terminal(str(message["phase"])):
                    self._escalate_later(active)  # it has nothing left to do but exit
            elif kind == "progress":
                self.service.record_progress(job_id, message["progress"])
        except InvalidTransition as exc:
            log.warning("ignored a phase change from the worker of %s: %s", job_id, exc)
        except (KeyError, ValueError, TypeError) as exc:
            log.warning("ignored a malformed message from the worker of %s: %s", job_id, exc)

    def _end_if_unfinished(
        self,
        job_id: str,
        phase: str,
        error_code: Optional[str],
        text: str,
        extra: Optional[dict[str, Any]] = None,
    ) -> None:
        job = self.service.store.get_job(job_id)
        if is_terminal(job.phase):
            return
        details: dict[str, Any] = {"output_dir": job.output_dir, **(extra or {})}
        if error_code:
            details["error_code"] = error_code
        if phase == "error":
            self.service.transition(job_id, "error", "Training failed", error=text, details=details)
        else:
            self.service.transition(job_id, phase, text[0].upper() + text[1:], details=details)

    # -- stop ---------------------------------------------------------------

    async def stop_job(self, job_id: str) -> TrainingStatus:
        job = self.service.store.get_job(job_id)
        if is_terminal(job.phase):
            raise JobAlreadyFinished(f"job {job_id} already ended in {job.phase}; there is nothing to stop")
        active = self._active.get(job_id)
        if active is None:
            # Queued and not yet picked up: it never runs.
            self._secrets.pop(job_id, None)
            self.service.transition(
                job_id, "stopped", "Stopped before it started", details={"output_dir": job.output_dir}
            )
            return self.service.status_of(self.service.store.get_job(job_id))
        already = active.stop_requested
        await self._request_stop(active, reason="a stop was requested")
        status = self.service.status_of(self.service.store.get_job(job_id))
        status.message = (
            "A stop was already requested; the job stops after its current step"
            if already
            else "Stop requested; the job stops after its current step and saves what it trained"
        )
        details = dict(status.details or {})
        details["stop_requested"] = True
        status.details = details
        return status

    async def _request_stop(self, active: ActiveJob, reason: str) -> None:
        if active.stop_requested:
            return
        active.stop_requested = True
        self.service.mark_stop_requested(active.job_id)
        log.info("stopping job %s: %s", active.job_id, reason)
        if active.handle is not None:
            await active.handle.request_stop()
            self._escalate_later(active)

    def _escalate_later(self, active: ActiveJob) -> None:
        if active.escalation is None and active.handle is not None:
            task = self._escalate(active.job_id, active.handle)
            active.escalation = asyncio.create_task(task, name=f"escalate-{active.job_id}")

    async def _escalate(self, job_id: str, handle: WorkerHandle) -> None:
        await asyncio.sleep(self.settings.stop_grace_seconds)
        log.warning("job %s did not exit within %.0f s; sending SIGTERM", job_id, self.settings.stop_grace_seconds)
        handle.terminate()
        await asyncio.sleep(self.settings.kill_grace_seconds)
        log.warning("job %s did not exit after SIGTERM; sending SIGKILL", job_id)
        handle.kill()


def _death_advice(exit_info: WorkerExit) -> str:
    if exit_info.signal_name != "SIGKILL":
        return ""
    return f" If no one killed it, the system most likely ran out of memory (the kernel's OOM killer). {OUT_OF_MEMORY_ADVICE}"
