"""The supervisor: runs queued jobs in worker processes and decides how each ends.

It lives in the API server's event loop. It takes queued jobs first in, first out,
each kind from its own pool of slots (training: `max_concurrent_jobs`; exports:
`max_concurrent_exports`, so an export never waits behind a long training run),
launches each through its kind's `WorkerLauncher`,
turns the worker's messages into phase changes and progress (through JobService,
the one writer), and, when the worker exits without having reported an end, writes
that end itself from the exit status: `stopped` if a stop was asked for, otherwise
`error` with `worker_died` and the signal or exit code.

Stop: a queued job is stopped at once. A running one is asked to stop (it finishes
its step, saves, and reports `stopped`); after `stop_grace_seconds` it gets SIGTERM,
and after `kill_grace_seconds` more, SIGKILL.

A worker that reports its end but does not exit gets the same escalation, so a
finished job never holds its slot (or its GPU memory) for long.

Pause is a stop that leaves the job resumable: it ends `stopped` with
`details.paused` (the child saved a checkpoint at its step); `resume_job` queues the
same job again with `resume_from_checkpoint` set to that checkpoint.

An export that ends any way but `completed` leaves no file behind: whatever its
child had not removed itself (a child killed mid-write) is removed here
(`recovery.remove_export_files`), so a half-written file is never served.

A GGUF export admitted while llama.cpp was being built in the background
(`llama_build.py`; the route marks its request) is not started, and holds no slot,
until the tools are there: it stays `idle`, saying how far the build is, and ends
`error` with `export_tools_missing` if the build ends without them (`_tools_ready`).

Restart: on start-up, `recovery.recover_jobs` ends every job that was running when
the server went away (see there). Queued jobs stay queued and run in turn.

Writes that fail (a full disk, a read-only file system, a locked database): starting
a child and recording it go together. When the worker's pid cannot be recorded, the
child is killed and reaped before anything else happens, and the job's end
(`error` with `disk_full` or `storage_unavailable`) is held in memory by JobService
(`hold_end`: every read shows it) until a write gets through; the job is not
launched again meanwhile. Each failed start doubles the scheduler's pause before the
next one (START_BACKOFF_SECONDS up to MAX_BACKOFF_SECONDS), and a slot is free only
once its child has exited, so a store that keeps failing can never start more
children than there are slots. A status from a running child that cannot be written
ends that child the same way; a progress step that cannot be written is dropped.

Commands act on the job as it is now: a stop or pause of a job queued again by a
resume (whose previous run is still exiting) ends it at once, as for any queued job;
a stop (OpenAI's cancel) overrides a pause still being carried out, so the job ends
`stopped` without `paused`; a stop accepted during the last step ends `stopped`
even though the child reports `completed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypeVar

from finetune_studio import failures, llama_build
from finetune_studio.config import Settings
from finetune_studio.errors import InvalidTransition, JobAlreadyFinished, ModelNotFound, NotPausable, StorageFailed
from finetune_studio.failures import storage_fault
from finetune_studio.jobs.phases import KINDS, is_terminal
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobRecord
from finetune_studio.schemas import (
    BASE_MODEL_PREFIX,
    OPENAI_JOB,
    QUEUED_WARNINGS,
    SWEEP_TRIAL,
    WITHHELD_SECRETS,
    EvalStatus,
    ExportStatus,
    TrainingStatus,
    suite_names,
)
from finetune_studio.supervisor import eval_results
from finetune_studio.supervisor.launcher import (
    EVAL_MODULE,
    EXPORT_MODULE,
    LocalProcessLauncher,
    WorkerExit,
    WorkerHandle,
    WorkerLauncher,
    log_tail,
)
from finetune_studio.supervisor.recovery import recover_jobs, remove_export_files
from finetune_studio.wire import JobFolder, WorkerSpec

log = logging.getLogger("finetune_studio.supervisor")



# The status a stop answers with, of either kind.
_Status = TypeVar("_Status", TrainingStatus, ExportStatus, EvalStatus)
# What each kind's worker is called in messages.
_WORKER_NAME = {"train": "the training process", "export": "the export process", "eval": "the evaluation process"}
_FAILED = {"train": "Training failed", "export": "Export failed", "eval": "Evaluation failed"}
# An evaluation's models as its child reaches them: model ids -> one {id, tokenizer, trust_remote_code}
# each, or ModelNotFound (api/routes/evaluation.py's, which create_app hands over).
ResolveModels = Callable[[list[str]], list[dict[str, Any]]]
# The scheduler's pause after a failed start, doubled by each failure in a row.
START_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 60.0
# How often a GGUF export waiting for llama.cpp's build looks at it again.
TOOLS_POLL_SECONDS = 5.0


@dataclass
class ActiveJob:
    job_id: str
    request: dict[str, Any]
    kind: str = "train"
    owner: Optional[str] = None  # the user whose job it is (jobs/accounts.py): the fair queue counts their runs
    handle: Optional[WorkerHandle] = None
    stop_requested: bool = False
    pause_requested: bool = False  # the stop asked for is a pause: it ends `stopped` with details.paused
    # Resumed while its paused worker was still exiting: the job is queued again, and
    # this run must not write its end (the next run starts once this one is gone).
    superseded: bool = False
    task: Optional[asyncio.Task[None]] = None
    escalation: Optional[asyncio.Task[None]] = None
    notes: list[str] = field(default_factory=list)


class Supervisor:
    def __init__(
        self,
        service: JobService,
        launcher: WorkerLauncher,
        settings: Settings,
        *,
        export_launcher: Optional[WorkerLauncher] = None,
        export_tools_problem: Optional[Callable[[], Optional[str]]] = None,
        eval_launcher: Optional[WorkerLauncher] = None,
        eval_models: Optional[ResolveModels] = None,
    ) -> None:
        """`launcher` starts training jobs; `export_launcher` exports (default: a local
        `python -m finetune_studio.export.child`). `export_tools_problem` says what GGUF
        exports lack (None: nothing), for those admitted while llama.cpp's build was under
        way, which wait for it (`_tools_ready`); without it they start at once. `eval_launcher`
        starts evaluations (default: a local `python -m finetune_studio.evaluation.child`), whose
        models `eval_models` resolves as each starts (without it, each id is passed on as it is)."""
        self.service = service
        self.launcher = launcher
        self.settings = settings
        self.launchers: dict[str, WorkerLauncher] = {
            "train": launcher,
            "export": export_launcher or LocalProcessLauncher(settings.worker_python, module=EXPORT_MODULE),
            "eval": eval_launcher or LocalProcessLauncher(settings.worker_python, module=EVAL_MODULE),
        }
        self.slots: dict[str, int] = {
            "train": settings.max_concurrent_jobs,
            "export": settings.max_concurrent_exports,
            "eval": settings.max_concurrent_evals,
        }
        self._eval_models = eval_models
        # Trials a sweep's pruner stopped: job id -> the step it was pruned at (their `stopped` says so).
        self.pruned: dict[str, int] = {}
        self._export_tools_problem = export_tools_problem
        self._active: dict[str, ActiveJob] = {}
        # The secrets (hf_token, wandb_token) of queued jobs, held in memory only:
        # the rest of a request is read back from the store when the job starts. A
        # job queued before a restart runs without its tokens, and says so.
        self._secrets: dict[str, dict[str, str]] = {}
        # Round-robin across owners (fair_order): per kind, when each owner's latest job started (a rising count).
        self._starts = 0
        self._last_started: dict[str, dict[Optional[str], int]] = {kind: {} for kind in KINDS}
        self._wake = asyncio.Event()
        self._loop_task: Optional[asyncio.Task[None]] = None
        self._closing = False
        # Failed starts in a row, and the loop time before which nothing starts.
        self._start_failures = 0
        self._not_before = 0.0
        self._timer: Optional[asyncio.TimerHandle] = None
        self._tools_timer: Optional[asyncio.TimerHandle] = None  # the next look at llama.cpp's build
        self._retrying: Optional[asyncio.Task[None]] = None  # writes the held ends once the store takes them
        service.store.health.listeners.append(self._keep_retrying)

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
        for timer in (self._timer, self._tools_timer):
            if timer is not None:
                timer.cancel()
        for task in (self._loop_task, self._retrying):
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
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

    def queue_positions(self, kind: str = "train") -> dict[str, int]:
        """The place of each queued job of `kind` in its own queue, from 1: how many jobs start before it, plus one."""
        return {job_id: index + 1 for index, job_id in enumerate(self._fair_queue(kind))}

    def _fair_queue(self, kind: str) -> list[str]:
        """The queued jobs of `kind` not running, in the order they start (`fair_order`)."""
        waiting = [(job_id, owner) for job_id, owner in self.service.store.queued_jobs(kind) if job_id not in self._active]
        return fair_order(waiting, self._last_started[kind])

    def active(self) -> list[tuple[str, str, Optional[int]]]:
        """(kind, id, child pid or None) of each job running now."""
        return [
            (job.kind, job.job_id, job.handle.pid if job.handle is not None else None) for job in self._active.values()
        ]

    async def _schedule_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._start_what_fits()

    def _start_what_fits(self) -> None:
        if self._closing:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self._not_before:  # backing off after failed starts
            if self._timer is None:
                self._timer = loop.call_at(self._not_before, self._backoff_over)
            return
        for kind in KINDS:
            # A run holds its slot until its child has exited (see `_run`), superseded runs included.
            running = sum(1 for job in self._active.values() if job.kind == kind)
            for job_id in self._fair_queue(kind):
                if running >= self.slots[kind]:
                    break
                if job_id in self._active or self.service.is_held(job_id):
                    continue
                job = self.service.store.get_job(job_id)
                if kind == "export" and job.request.get(llama_build.WAITS_FOR_BUILD) and not self._tools_ready(job):
                    continue  # it holds no slot while it waits (later exports may pass it)
                active = self._prepare(job)
                self._active[job_id] = active
                self._starts += 1
                self._last_started[kind][job.owner] = self._starts  # its owner's turn was taken (fair_order)
                running += 1
                active.task = asyncio.create_task(self._run(active), name=f"{kind}-{job_id}")

    def _backoff_over(self) -> None:
        self._timer = None
        self._wake.set()

    def _tools_ready(self, job: JobRecord) -> bool:
        """Whether a GGUF export admitted during llama.cpp's build (the route said so in its
        request) can start: once the tools are there. Until then it stays queued, its
        `idle` message saying how far the build is, looked at every TOOLS_POLL_SECONDS;
        when the build ends without them, it ends `error` with `export_tools_missing`."""
        if self._export_tools_problem is None:
            return True
        wait = llama_build.tools_wait(self._export_tools_problem)
        if wait.state == "ready":
            return True
        try:
            if wait.state == "missing":
                self._end_if_unfinished(job.id, "error", "export_tools_missing", wait.message)
                return False
            if job.status.get("message") != wait.message:
                details = {"output_dir": job.output_dir, **wait.build.details()}
                self.service.transition(job.id, "idle", wait.message, details=details)
        except InvalidTransition:
            return False  # stopped meanwhile
        except StorageFailed as exc:
            log.warning("export %s waits for llama.cpp's build; its status was not written: %s", job.id, exc)
        if self._tools_timer is None:
            self._tools_timer = asyncio.get_running_loop().call_later(TOOLS_POLL_SECONDS, self._tools_poll_due)
        return False

    def _tools_poll_due(self) -> None:
        self._tools_timer = None
        self._wake.set()

    def _start_failed(self) -> None:
        """A start failed: wait before the next, twice as long as after the last failure."""
        self._start_failures += 1
        delay = min(MAX_BACKOFF_SECONDS, START_BACKOFF_SECONDS * 2 ** (self._start_failures - 1))
        self._not_before = asyncio.get_running_loop().time() + delay
        log.warning("a job's start failed (%d in a row); the next start waits %.1f s", self._start_failures, delay)

    def _hold(self, job_id: str, text: str, failure: StorageFailed) -> None:
        """End the job in memory (`error` with the storage's error code) until the store takes it."""
        job = self.service.store.get_job(job_id)
        details = {"output_dir": job.output_dir, "error_code": failure.error_code}
        self._hold_end(job_id, "error", _FAILED[job.kind], f"{text[0].upper()}{text[1:]}: {failure}", details, failure)

    def _hold_end(
        self, job_id: str, phase: str, text: str, error: Any, details: Any, failure: StorageFailed
    ) -> None:
        log.error("job %s could not be written (%s); its end is held until a write succeeds", job_id, failure)
        self.service.hold_end(
            job_id, phase, text, error=None if error is None else str(error), details=dict(details or {})
        )
        self._keep_retrying()

    def _keep_retrying(self) -> None:
        """A write failed: retry (the held ends, else a probe) until one gets through."""
        if self._closing or (self._retrying is not None and not self._retrying.done()):
            return
        with contextlib.suppress(RuntimeError):  # no running loop: a store used outside the server
            self._retrying = asyncio.get_running_loop().create_task(self._retry_writes(), name="retry writes")

    async def _retry_writes(self) -> None:
        """Write the held ends as soon as the store takes them (backing off), then run the queue again."""
        delay = START_BACKOFF_SECONDS
        while True:
            await asyncio.sleep(delay)
            if self.service.write_held() and (self.service.store.health.fault is None or self.service.store.probe_write()):
                log.info("the store takes writes again; every held job end is written")
                self._wake.set()
                return
            delay = min(MAX_BACKOFF_SECONDS, delay * 2)

    def _prepare(self, job: JobRecord) -> ActiveJob:
        """The request a queued job's worker gets: as stored, with its secrets put back."""
        if job.kind in ("export", "eval"):
            # Stored complete by the route (source_dir and quantizations included); it holds no secret.
            # An evaluation's credentials and resolved models are added as it launches (`_eval_spec`).
            return ActiveJob(job.id, dict(job.request), kind=job.kind, owner=job.owner)
        request = {k: v for k, v in job.request.items() if k not in (WITHHELD_SECRETS, QUEUED_WARNINGS, OPENAI_JOB, SWEEP_TRIAL)}
        secrets = self._secrets.pop(job.id, {})
        request.update(secrets)
        notes = [str(note) for note in job.request.get(QUEUED_WARNINGS, [])]
        lost = [name for name in job.request.get(WITHHELD_SECRETS, []) if name not in secrets]
        if lost:
            notes.append(f"this job was queued before a server restart and runs without {' and '.join(lost)}")
        return ActiveJob(job.id, request, owner=job.owner, notes=notes)

    # -- one job ------------------------------------------------------------

    async def _run(self, active: ActiveJob) -> None:
        job_id = active.job_id
        try:
            await self._drive(active)
        except StorageFailed as exc:  # a write that ended or recorded this run failed
            if not active.superseded:
                self._hold(job_id, "the server could not record this job's state", exc)
        except Exception:  # the supervisor must outlive any one job's failure
            log.exception("supervising job %s failed", job_id)
            if not active.superseded:
                try:
                    self._end_if_unfinished(job_id, "error", "internal_error", "the server failed while supervising this job")
                except StorageFailed as exc:
                    self._hold(job_id, "the server failed while supervising this job", exc)
        finally:
            if active.escalation:
                active.escalation.cancel()
            # However this run ended, its child is gone before its slot is free.
            await _reap(active.handle)
            self._active.pop(job_id, None)
            with contextlib.suppress(Exception):
                self.service.set_worker(job_id, None)
            if active.kind == "export":
                with contextlib.suppress(Exception):
                    self._clean_unfinished_export(job_id)
            self._wake.set()

    def _clean_unfinished_export(self, export_id: str) -> None:
        """Remove what an export that did not complete left in its folder (its log stays)."""
        job = self.service.store.get_job(export_id)
        if job.phase != "completed":
            remove_export_files(Path(job.output_dir))

    async def _drive(self, active: ActiveJob) -> None:
        job_id = active.job_id
        job = self.service.store.get_job(job_id)
        if active.kind == "eval":
            problem = self._eval_spec(active)
            if problem is not None:  # a model deleted meanwhile, a judge's key gone: it ends before it starts
                self._end_if_unfinished(job_id, "error", problem[0], problem[1])
                return
        spec = WorkerSpec(job_id=job_id, output_dir=Path(job.output_dir), request=active.request, warnings=active.notes)
        worker = _WORKER_NAME[active.kind]
        try:
            handle = await self.launchers[active.kind].launch(spec)
        except OSError as exc:
            self._start_failed()
            fault = storage_fault(exc)
            if fault is not None and fault.error_code == "disk_full":  # the job's folder or log could not be written
                raise StorageFailed(fault.error_code, f"{worker} could not start: {fault.message}") from exc
            self._end_if_unfinished(job_id, "error", "worker_failed_to_start", f"{worker} could not start: {exc}")
            return
        active.handle = handle
        try:
            # Starting a child and recording it are one step: a child that cannot be
            # recorded is killed (by `_run`, before its slot is free) and never runs.
            self.service.set_worker(job_id, handle.pid)
        except StorageFailed:
            self._start_failed()
            handle.kill()
            raise
        self._start_failures = 0
        if active.stop_requested:  # a stop arrived while we were launching
            await handle.request_stop()
            self._escalate_later(active)

        async for message in handle.messages():
            try:
                if active.kind == "eval" and message.get("type") == "status" and message.get("phase") == "completed":
                    # Its results are kept before the status that says so (or it ends `error`, saying why).
                    message = await eval_results.keep(self.service.store, active.job_id, Path(job.output_dir), message)
                self._apply(active, message)
            except StorageFailed:
                handle.kill()  # a run whose state cannot be kept is ended (and its end held)
                raise
        exit_info = dataclasses.replace(await handle.wait(), process=worker)
        if active.superseded:
            return

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
                f"{reason[0].upper()}{reason[1:]} before the job finished.{_death_advice(exit_info, active.kind)}"
                + (f" Last lines of {handle.log_path}:\n{tail}" if tail else ""),
                extra={"exit_code": exit_info.returncode, "signal": exit_info.signal_name, "log_path": str(handle.log_path)},
            )

    def _apply(self, active: ActiveJob, message: dict[str, Any]) -> None:
        job_id = active.job_id
        kind = message.get("type")
        try:
            if kind == "status":
                phase = str(message["phase"])
                text, details = str(message.get("message", "")), message.get("details")
                if phase == "completed" and active.stop_requested and active.kind == "train":
                    # The stop was accepted during the last step: the job ends as asked, with all it trained.
                    phase, text = "stopped", f"Stopped after its last step ({text})"
                if phase == "stopped" and active.pause_requested:
                    text, details = _paused(details)
                if phase == "stopped" and job_id in self.pruned:
                    text, details = _pruned(details, self.pruned[job_id])
                if (
                    phase == "completed" and active.kind == "train" and active.request.get("eval_after")
                    and self.service.store.get_job(job_id).phase == "training"  # the completing transition will be taken
                ):
                    details = {**(details or {}), "eval_id": self._queue_eval_after(active)}
                try:
                    self.service.transition(job_id, phase, text, error=message.get("error"), details=details)
                except StorageFailed as exc:
                    if not is_terminal(phase):
                        raise  # a run whose state cannot be kept is ended (see _drive)
                    # The child's own end (all it saved) is held as it reported it, and written later.
                    self._hold_end(job_id, phase, text, message.get("error"), details, exc)
                if is_terminal(phase):
                    self._escalate_later(active)  # it has nothing left to do but exit
            elif kind == "progress":
                try:
                    self.service.record_progress(job_id, message["progress"], kind=active.kind)
                except StorageFailed as exc:  # a step's metrics are lost; the run goes on
                    log.warning("a progress event of job %s was not written: %s", job_id, exc)
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
        if phase == "stopped" and job.pause_requested:
            text, details = _paused({**details, "reason": text})
        if phase == "stopped" and job_id in self.pruned:
            text, details = _pruned({**details, "reason": text}, self.pruned[job_id])
        if phase == "error":
            self.service.transition(job_id, "error", _FAILED[job.kind], error=text, details=details)
        else:
            self.service.transition(job_id, phase, text[0].upper() + text[1:], details=details)

    # -- stop ---------------------------------------------------------------

    async def stop_job(self, job_id: str) -> TrainingStatus:
        """Stop a training job (see the module docstring)."""
        return await self._stop_answered(job_id, "train", self.service.status_of,
                                         "the job stops after its current step", " and saves what it trained")

    async def prune_job(self, job_id: str, step: int) -> None:
        """Stop a sweep's trial for its pruner: it saves what it trained and ends `stopped` with
        `details.pruned` and the step it was pruned at (`pruned_at_step`)."""
        self.pruned[job_id] = step
        job = self.service.store.get_job(job_id, kind="train")
        if not is_terminal(job.phase):
            await self._stop(job)

    async def stop_eval(self, eval_id: str) -> EvalStatus:
        """Stop an evaluation: a queued one at once; a running one ends `stopped` (nothing of it is kept)."""
        return await self._stop_answered(eval_id, "eval", self.service.eval_status_of,
                                         "the evaluation stops after the request under way")

    async def _stop_answered(self, job_id: str, kind: str, status_of: Callable[[JobRecord], _Status], what: str,
                             first_only: str = "") -> _Status:
        """Stop the job of `kind` and answer with its status: as it is when it was queued, else
        what the stop will do (`what`, and `first_only` the first time it is asked)."""
        running, already = await self._stop(self.service.store.get_job(job_id, kind=kind))
        status = status_of(self.service.store.get_job(job_id))
        if running:
            status.message = f"A stop was already requested; {what}" if already else f"Stop requested; {what}{first_only}"
            status.details = {**(status.details or {}), "stop_requested": True}
        return status

    # -- evaluations ----------------------------------------------------------

    def _eval_spec(self, active: ActiveJob) -> Optional[tuple[str, str]]:
        """Complete an evaluation's request for its child (never stored): its models as the child
        reaches them, the server's URL and token, and each external judge's API key from the
        server's environment. Returns (error code, text) when it cannot run."""
        request = active.request
        models = [str(model) for model in request.get("models", [])]
        try:
            resolved = self._eval_models(models) if self._eval_models is not None else [{"id": m} for m in models]
        except ModelNotFound as exc:
            return "model_not_found", f"{exc} (was it deleted since the evaluation was queued?)"
        keys: dict[str, str] = {}
        for index, suite in enumerate(request.get("suites", [])):
            name = ((suite.get("judge") or {}).get("api_key_env") if isinstance(suite, dict) else None) or None
            if name is None:
                continue
            if name not in self.settings.judge_key_envs:
                return "config_invalid", (
                    f"suites[{index}].judge.api_key_env: {name} is not one of the variables this server lets judges read"
                    " (FINETUNE_STUDIO_JUDGE_KEY_ENVS); ask the operator to list it, or name another"
                )
            value = os.environ.get(name)
            if not value:
                return "config_invalid", (
                    f"suites[{index}].judge.api_key_env: the server's environment has no {name} (or it is empty);"
                    f" set it where the server runs and restart it, or name another variable"
                )
            keys[str(index)] = value
        token = self.settings.token.get_secret_value() if self.settings.token is not None else None
        request["resolved_models"] = resolved
        request["server"] = {"url": self.settings.loopback_url, "token": token}
        request["judge_keys"] = keys
        return None

    def _queue_eval_after(self, active: ActiveJob) -> Optional[str]:
        """Queue `eval_after`'s evaluation of a completing training job against its base; its id
        goes into the completing status (`details.eval_id`). None when it cannot be queued."""
        job_id = active.job_id
        models = [job_id, f"{BASE_MODEL_PREFIX}{job_id}"]
        suites = list(active.request.get("eval_after") or [])
        names = suite_names([str(suite.get("type")) for suite in suites if isinstance(suite, dict)])
        label = f"eval_after of job {job_id}"
        stored = {"models": models, "suites": suites, "label": label, "suite_names": names, "after_job": job_id}
        details = {"models": models, "suites": names, "label": label, "after_job": job_id}
        try:
            evaluation = self.service.create_job(stored, message="Queued", details=details, kind="eval", owner=active.owner)
        except StorageFailed as exc:
            log.warning("the evaluation of job %s (eval_after) was not queued: %s", job_id, exc)
            return None
        self._wake.set()
        return evaluation.id

    async def stop_export(self, export_id: str) -> ExportStatus:
        """Stop an export: a queued one at once; a running one ends `stopped` with its partial files removed."""
        return await self._stop_answered(export_id, "export", self.service.export_status_of,
                                         "the export stops and removes its unfinished files")

    async def _stop(self, job: JobRecord) -> tuple[bool, bool]:
        """Stop `job`: a queued one ends `stopped` at once; a running one is asked to stop.
        Returns whether it was running, and whether a stop had been asked of it before."""
        if is_terminal(job.phase):
            raise JobAlreadyFinished(f"job {job.id} already ended in {job.phase}; there is nothing to stop")
        active = self._current(job.id)
        if active is None:
            # Queued and not yet picked up (or queued again by a resume while its
            # previous run still exits): it never runs.
            self._secrets.pop(job.id, None)
            self.service.transition(job.id, "stopped", "Stopped before it started", details={"output_dir": job.output_dir})
            return False, False
        already = active.stop_requested and not active.pause_requested
        # A stop is final: it overrides a pause still being carried out (the job ends stopped, not paused).
        await self._request_stop(active, reason="a stop was requested", pause=False)
        return True, already

    async def pause_job(self, job_id: str) -> TrainingStatus:
        """Pause a training job: a stop that saves a checkpoint and ends `stopped` with
        `details.paused`, so that `resume_job` can queue it again. A queued job is
        paused at once (it has nothing to save)."""
        job = self.service.store.get_job(job_id, kind="train")
        if is_terminal(job.phase):
            raise NotPausable(f"job {job_id} has ended ({job.phase}); only a queued or running job can be paused")
        active = self._current(job_id)
        if active is None:
            # Its secrets stay held for when it is resumed.
            self.service.transition(
                job_id, "stopped", "Paused before it started", details={"output_dir": job.output_dir, "paused": True}
            )
        else:
            await self._request_stop(active, reason="a pause was requested", pause=True)
        return self.service.status_of(self.service.store.get_job(job_id))

    def _current(self, job_id: str) -> Optional[ActiveJob]:
        """The job's running run: None while it is queued, and for a superseded run (a
        paused run still exiting after its job was resumed, which commands no longer reach)."""
        active = self._active.get(job_id)
        return None if active is None or active.superseded else active

    def resume_job(self, job_id: str) -> TrainingStatus:
        """Queue a paused job again, the same id, to continue from its last checkpoint."""
        job = self.service.store.get_job(job_id, kind="train")
        if not (job.phase == "stopped" and (job.status.get("details") or {}).get("paused")):
            state = "stopped, not paused" if job.phase == "stopped" else job.phase
            raise NotPausable(f"job {job_id} is {state}; only a paused job can be resumed")
        checkpoint = JobFolder(Path(job.output_dir)).last_checkpoint()
        request = dict(job.request)
        details: dict[str, Any] = {"output_dir": job.output_dir, "resumed": True}
        if checkpoint is not None:
            request["resume_from_checkpoint"] = details["resume_from"] = str(checkpoint)
            message = f"Resumed: queued to continue from {checkpoint.name}"
        else:
            message = "Resumed: queued to start from the beginning (it was paused before it saved a checkpoint)"
        self.service.resume(job_id, request, message, details)
        previous = self._active.get(job_id)
        if previous is not None:
            previous.superseded = True  # its worker is still exiting: the next run waits for it
        self._wake.set()
        return self.service.status_of(self.service.store.get_job(job_id), self.queue_positions().get(job_id))

    async def _request_stop(self, active: ActiveJob, reason: str, pause: Optional[bool] = None) -> None:
        """Ask a running job to stop; `pause` True or False says whether it ends paused
        (the latest request wins), None leaves that as it was."""
        if pause is not None:
            active.pause_requested = pause
            self.service.mark_stop_requested(active.job_id, pause=pause)
        if active.stop_requested:
            return
        active.stop_requested = True
        self.service.mark_stop_requested(active.job_id, pause=active.pause_requested)
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


def fair_order(queued: list[tuple[str, Optional[str]]], last_started: dict[Optional[str], int]) -> list[str]:
    """The order queued jobs start in: round-robin across owners, first in first out within one.

    `queued` is (id, owner) first in first out; `last_started` says when (a rising count) each
    owner's latest job started. The next job is the first queued job of the owner whose latest
    start is the oldest (an owner with none first; ties go to the earlier queued job). So one
    user's batch takes turns with another's single job; with one owner (a single-user server)
    the order is the queue's."""
    heads: dict[Optional[str], list[tuple[int, str]]] = {}
    for index, (job_id, owner) in enumerate(queued):
        heads.setdefault(owner, []).append((index, job_id))
    started = dict(last_started)
    tick = max(started.values(), default=0)
    order: list[str] = []
    pending = {owner: iter(jobs) for owner, jobs in heads.items()}
    nexts = {owner: next(jobs) for owner, jobs in pending.items()}
    while nexts:
        owner = min(nexts, key=lambda who: (started.get(who, -1), nexts[who][0]))
        order.append(nexts[owner][1])
        tick += 1
        started[owner] = tick
        following = next(pending[owner], None)
        if following is None:
            del nexts[owner]
        else:
            nexts[owner] = following
    return order


async def _reap(handle: Optional[WorkerHandle]) -> None:
    """Make sure a run's child is gone: killed if it still runs, and waited for."""
    if handle is None:
        return
    try:
        await asyncio.wait_for(asyncio.shield(handle.wait()), 0.05)
    except asyncio.TimeoutError:
        handle.kill()
        with contextlib.suppress(Exception):
            await handle.wait()
    except Exception:  # noqa: BLE001 - nothing left to reap
        log.debug("reaping a worker failed", exc_info=True)


def _paused(details: Optional[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The message and details of a paused job's `stopped` status (from the child's, or the supervisor's)."""
    details = {**(details or {}), "paused": True}
    steps = details.get("steps")
    checkpoint = details.get("last_checkpoint")
    where = f" after step {steps}" if steps is not None else ""
    then = f"; resume continues from {Path(str(checkpoint)).name}" if checkpoint else ""
    return f"Paused{where}{then}", details


def _pruned(details: Optional[dict[str, Any]], step: int) -> tuple[str, dict[str, Any]]:
    """The message and details of a trial its sweep's pruner stopped."""
    details = {**(details or {}), "pruned": True, "pruned_at_step": step}
    return f"Pruned by its sweep at step {step}; it saved what it trained", details


def _death_advice(exit_info: WorkerExit, kind: str = "train") -> str:
    if exit_info.signal_name != "SIGKILL":
        return ""
    if kind == "eval":  # it holds no model: the models run in the chat process
        return " If no one killed it, the system most likely ran out of memory (the kernel's OOM killer)."
    advice = failures.advice("out_of_memory", "train" if kind == "train" else "export")
    return f" If no one killed it, the system most likely ran out of memory (the kernel's OOM killer). {advice}"


