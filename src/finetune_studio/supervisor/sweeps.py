"""SweepManager: runs hyperparameter sweeps (POST /sweeps) as ordinary training jobs, Optuna choosing.

A sweep keeps up to `max_parallel` trials queued or running at once; each is a training job
admitted like any other (the route hands in `queue_trial`, the admission path of POST
/train/start), tagged `details.sweep: {sweep_id, trial}`, and the supervisor runs it within
`max_concurrent_jobs` (on a Ray server, on the cluster). The manager follows its trials'
events (a listener of JobService): an evaluation (`eval_loss`; each logged `loss` when the
objective is `train_loss`) is reported to Optuna and a trial the pruner stops is stopped
through `Supervisor.prune_job` (it saves, and ends `stopped` with `details.pruned`); a
trial's end is told to Optuna (its objective: the last `eval_loss`, the mean of the last
10 losses, or a metric of its `eval_after` evaluation, read once that evaluation ends) and
the next one is asked for. A failed trial counts towards `trials`; `max_failed_trials` of
them end the sweep `error`.

Optuna (supervisor/sweep_study.py) is imported on the first sweep, and every call to it
runs in one worker thread, never on the event loop. Decisions about one sweep are taken one
at a time (its lock), so no trial's end is counted twice.

Restart (`start`): every unfinished sweep's study is loaded again from sweeps.db. A trial
whose job the restart ended (`error` with `server_restarted`, or `stopped` by recovery) is
told FAIL and its values queued again (`enqueue_trial`), without counting; a trial whose
job ended while no server watched is told its end now; a queued trial's job runs in turn.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import statistics
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, TypeVar

from finetune_studio.errors import InvalidTransition, Refused, StorageFailed, SweepRefused
from finetune_studio.jobs.phases import is_terminal
from finetune_studio.jobs.service import JobService, new_job_id
from finetune_studio.jobs.store import StoredEvent
from finetune_studio.jobs.sweeps import OPEN_TRIAL_STATES, OWNER, SweepRecord, SweepTable, TrialRecord
from finetune_studio.schemas import (
    TRAIN_LOSS_WINDOW,
    TRAINING_OBJECTIVES,
    SweepBest,
    SweepCreate,
    SweepStatus,
    SweepTrial,
)
from finetune_studio.supervisor.supervisor import Supervisor

if TYPE_CHECKING:  # pragma: no cover - types only
    from finetune_studio.supervisor.sweep_study import Study

log = logging.getLogger("finetune_studio.sweeps")

# Queue one trial: (the training request with the trial's values, the job's `sweep` tag, the sweep's
# maker {name, admin} or None) -> its job id.
QueueTrial = Callable[[dict[str, Any], dict[str, Any], Optional[dict[str, Any]]], str]
Result = TypeVar("Result")
# How often an idle sweep stream sends a keep-alive comment.
KEEPALIVE_SECONDS = 15.0
KEEPALIVE = b": keep-alive\n\n"
# The error codes with which restart recovery ends a job it found running (supervisor/recovery.py).
RESTARTED = "server_restarted"


class SweepManager:
    def __init__(self, service: JobService, supervisor: Supervisor, sweeps_db: Path, queue_trial: QueueTrial) -> None:
        self.service = service
        self.supervisor = supervisor
        self.table: SweepTable = service.store.sweeps
        self.sweeps_db = sweeps_db
        self.queue_trial = queue_trial
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._studies: dict[str, Study] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._changed: dict[str, asyncio.Event] = {}
        # Trial jobs (and eval_after evaluations of trials) followed: job id -> (sweep id, trial number).
        self._trial_of: dict[str, tuple[str, int]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping: set[str] = set()
        self._secrets: dict[str, dict[str, str]] = {}
        self._closing = False
        self._importances: dict[str, tuple[int, dict[str, float]]] = {}
        # Seconds spent in ask and tell, and in the manager's own steps (for the overhead benchmark).
        self.optuna_seconds = 0.0
        service.listeners.append(self._on_event)

    # -- life cycle ---------------------------------------------------------

    async def start(self) -> None:
        """Pick up the sweeps a previous server left unfinished (after the supervisor's recovery)."""
        for sweep in self.table.list_sweeps(limit=10_000, unfinished_only=True):
            self._spawn(self._recover(sweep.id), f"recover sweep {sweep.id}")

    async def shutdown(self) -> None:
        """Before the supervisor stops the running children: their trials are marked interrupted, so
        that the next server queues their values again rather than counting the shutdown's stop."""
        self._closing = True
        for sweep in self.table.list_sweeps(limit=10_000, unfinished_only=True):
            for trial in self.table.trials(sweep.id):
                if trial.state in OPEN_TRIAL_STATES and trial.job_id:
                    try:
                        self._write_trial(sweep.id, trial.number, "interrupted", interrupted=True)
                    except StorageFailed:
                        log.warning("trial %s of sweep %s could not be marked interrupted", trial.number, sweep.id)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001, S110 - the server is going away
                pass
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)

    # -- commands -----------------------------------------------------------

    async def create(
        self, spec: SweepCreate, base_request: dict[str, Any], planned: int, secrets: Optional[dict[str, str]] = None,
        owner: Optional[dict[str, Any]] = None,
    ) -> SweepRecord:
        """Create the sweep's study (Optuna refusing the space: SweepRefused) and its row; its first trials follow.
        `base_request` is stored (redacted); `secrets` are held in memory only, for its trials (a restart loses them)."""
        from finetune_studio.supervisor.sweep_study import StudyProblem, open_study

        sweep_id = "sw_" + new_job_id()
        try:
            study = await self._in_thread(lambda: open_study(self.sweeps_db, sweep_id, spec))
        except StudyProblem as exc:
            raise SweepRefused(str(exc), field=exc.field) from exc
        self._studies[sweep_id] = study
        if secrets:
            self._secrets[sweep_id] = secrets
        stored = {**spec.model_dump(), "request": base_request, "trials_planned": planned, OWNER: owner}
        self.table.create(sweep_id, stored, _status(sweep_id, "queued", f"Queued: {planned} trials"))
        self._spawn(self._advance(sweep_id), f"sweep {sweep_id}")
        return self.table.get(sweep_id)

    async def stop(self, sweep_id: str) -> SweepStatus:
        """Stop the sweep: no trial is asked for any more, and its running trials stop (saving what they trained)."""
        sweep = self.table.get(sweep_id)
        if is_terminal(sweep.status):
            return self.status(sweep_id)
        async with self._lock(sweep_id):
            self._stopping.add(sweep_id)
            self._set_status(sweep_id, "stopped", "Stopped: no more trials; its running trials stop and save")
            await self._stop_open(sweep_id)
        return self.status(sweep_id)

    # -- reads --------------------------------------------------------------

    def status(self, sweep_id: str) -> SweepStatus:
        sweep = self.table.get(sweep_id)
        trials = self.table.trials(sweep_id)
        spec = sweep.spec
        objective = spec["objective"]
        complete = [t for t in trials if t.state == "complete" and t.value is not None]
        best: Optional[SweepBest] = None
        if complete:
            pick = min if objective["direction"] == "minimize" else max
            top = pick(complete, key=lambda t: float(t.value or 0.0))
            best = SweepBest(number=top.number, job_id=top.job_id, params=top.params, value=float(top.value or 0.0))
        cached = self._importances.get(sweep_id)
        return SweepStatus(
            sweep_id=sweep.id,
            status=sweep.status,  # type: ignore[arg-type]
            message=str(sweep.status_json.get("message", "")),
            error=sweep.status_json.get("error"),
            label=spec.get("label"),
            objective=objective,
            trials_planned=int(spec["trials_planned"]),
            counted=sum(1 for t in trials if t.counted),
            failed=sum(1 for t in trials if t.counted and t.state == "failed"),
            trials=[SweepTrial.model_validate(t.public()) for t in trials],
            best=best,
            importances=cached[1] if cached else {},
            created_at=sweep.created_at,
        )

    async def importances(self, sweep_id: str) -> None:
        """Bring the sweep's cached importances up to date (Optuna, in the worker thread), when trials completed since."""
        complete = sum(1 for t in self.table.trials(sweep_id) if t.state == "complete")
        cached = self._importances.get(sweep_id)
        if complete < 2 or (cached is not None and cached[0] == complete):
            return
        study = await self._study(sweep_id)
        self._importances[sweep_id] = (complete, await self._in_thread(study.importances))

    async def stream(self, sweep_id: str, after_id: int = 0) -> AsyncIterator[bytes]:
        """The sweep's events past `after_id` as SSE bytes, live, ending after its terminal status."""
        cursor = after_id
        while True:
            changed = self._changed.setdefault(sweep_id, asyncio.Event())
            events = self.table.events_after(sweep_id, cursor)
            if events:
                chunk = b"".join(b"event: %s\ndata: %s\nid: %d\n\n" % (kind.encode(), data.encode(), eid)
                                 for eid, kind, data in events)
                cursor = events[-1][0]
                yield chunk
                if events[-1][1] == "status" and json.loads(events[-1][2])["status"] in ("completed", "stopped", "error"):
                    if not self.table.events_after(sweep_id, cursor, limit=1):
                        return
                continue
            if is_terminal(self.table.get(sweep_id).status):
                return
            try:
                await asyncio.wait_for(changed.wait(), KEEPALIVE_SECONDS)
            except asyncio.TimeoutError:
                yield KEEPALIVE

    # -- following the trials -----------------------------------------------

    def _on_event(self, event: StoredEvent) -> None:
        """Every job event (JobService's listener): those of followed trials start a step of their sweep."""
        followed = self._trial_of.get(event.job_id)
        if followed is None or self._closing:
            return
        sweep_id, number = followed
        payload = json.loads(event.data)
        if event.kind == "progress":
            self._spawn(self._progress(sweep_id, number, payload), f"sweep {sweep_id} report")
        elif event.kind == "status":
            phase = str(payload["phase"])
            if is_terminal(phase):
                self._spawn(self._ended(sweep_id, number, event.job_id, phase, payload), f"sweep {sweep_id} trial end")
            elif phase != "idle":
                self._spawn(self._running(sweep_id, number), f"sweep {sweep_id} trial start")

    async def _running(self, sweep_id: str, number: int) -> None:
        async with self._lock(sweep_id):
            trial = self.table.trial(sweep_id, number)
            if trial.state == "queued":
                self._write_trial(sweep_id, number, "running", state="running")
            if self.table.get(sweep_id).status == "queued":
                self._set_status(sweep_id, "running", "Running")

    async def _progress(self, sweep_id: str, number: int, progress: dict[str, Any]) -> None:
        sweep = self.table.get(sweep_id)
        metric = sweep.spec["objective"]["metric"]
        pruning = _pruner_type(sweep.spec) != "none"
        value = progress.get("eval_loss") if metric == "eval_loss" else progress.get("loss") if metric == "train_loss" else None
        if value is None or (metric == "train_loss" and not pruning):
            return  # only evaluations are reported in the stream; training losses only to a pruner
        step = int(progress["step"])
        prune = False
        if pruning:
            study = await self._study(sweep_id)
            prune = await self._in_thread(lambda: study.report(number, float(value), step))
        async with self._lock(sweep_id):
            trial = self.table.trial(sweep_id, number)
            if trial.state not in OPEN_TRIAL_STATES or trial.prune_at is not None:
                return
            if metric == "eval_loss":
                self._write_trial(sweep_id, number, "reported", report={"step": step, metric: value})
            if prune:
                self._write_trial(sweep_id, number, "pruning", prune_at=step, report={"step": step, metric: value})
                await self.supervisor.prune_job(trial.job_id, step)

    async def _ended(self, sweep_id: str, number: int, job_id: str, phase: str, status: dict[str, Any]) -> None:
        """A followed job ended: a trial's, or its eval_after evaluation's."""
        async with self._lock(sweep_id):
            trial = self.table.trial(sweep_id, number)
            if trial.state not in OPEN_TRIAL_STATES:
                return  # told already (an end seen twice: a restart's recovery and the listener)
            if job_id != trial.job_id:  # its evaluation ended: the objective is one of its metrics
                self._trial_of.pop(job_id, None)
                await self._tell_evaluated(sweep_id, trial, job_id, phase)
            else:
                await self._tell_ended(sweep_id, trial, phase, status)
        await self._advance(sweep_id)

    async def _tell_ended(self, sweep_id: str, trial: TrialRecord, phase: str, status: dict[str, Any]) -> None:
        details = status.get("details") or {}
        steps = (details.get("summary") or {}).get("steps")
        metric = self.table.get(sweep_id).spec["objective"]["metric"]
        if phase == "completed":
            if metric not in TRAINING_OBJECTIVES:
                eval_id = details.get("eval_id")
                if eval_id:  # its score comes when its evaluation ends
                    self._trial_of[str(eval_id)] = (sweep_id, trial.number)
                    evaluation = self.service.store.get_job(str(eval_id))
                    if is_terminal(evaluation.phase):
                        await self._tell_evaluated(sweep_id, trial, evaluation.id, evaluation.phase)
                    return
                await self._tell(sweep_id, trial, "failed", None, steps, f"its eval_after evaluation was not queued ({metric})")
                return
            value = self._objective(trial.job_id, metric)
            if value is None:
                await self._tell(sweep_id, trial, "failed", None, steps, f"it reported no {metric}")
            else:
                await self._tell(sweep_id, trial, "complete", value, steps)
        elif phase == "stopped" and (trial.prune_at is not None or details.get("pruned")):
            await self._tell(sweep_id, trial, "pruned", None, steps)
        elif details.get("error_code") == RESTARTED or (trial.interrupted and phase in ("stopped", "error")):
            await self._requeue(sweep_id, trial)
        else:
            counted = sweep_id not in self._stopping and not is_terminal(self.table.get(sweep_id).status)
            await self._tell(sweep_id, trial, "failed", None, steps, counted=counted)

    async def _tell_evaluated(self, sweep_id: str, trial: TrialRecord, eval_id: str, phase: str) -> None:
        metric = self.table.get(sweep_id).spec["objective"]["metric"]
        value = None
        if phase == "completed":
            results = self.service.store.eval_results(eval_id) or {}
            for row in results.get("metrics", []):
                if row.get("name") == metric:
                    value = (row.get("values") or {}).get(trial.job_id)
        if value is None:
            await self._tell(sweep_id, trial, "failed", None, None, f"its evaluation {eval_id} ended {phase} without {metric}")
        else:
            await self._tell(sweep_id, trial, "complete", float(value), None)

    def _objective(self, job_id: str, metric: str) -> Optional[float]:
        points = self.service.store.progress_points(job_id)
        if metric == "eval_loss":
            evaluated = [point[2] for point in points if point[2] is not None]
            return evaluated[-1] if evaluated else None
        losses = [point[1] for point in points if point[1] is not None]
        return statistics.fmean(losses[-TRAIN_LOSS_WINDOW:]) if losses else None

    async def _tell(
        self, sweep_id: str, trial: TrialRecord, state: str, value: Optional[float], steps: Optional[int],
        why: Optional[str] = None, counted: bool = True,
    ) -> None:
        study = await self._study(sweep_id)
        await self._in_thread(lambda: study.tell(trial.number, state, value))
        event = {"complete": "finished", "pruned": "pruned", "failed": "failed"}[state]
        self._write_trial(sweep_id, trial.number, event, state=state, value=value, steps=steps, counted=counted,
                          report={"why": why} if why else None)
        self._trial_of.pop(trial.job_id, None)

    async def _requeue(self, sweep_id: str, trial: TrialRecord) -> None:
        """A trial the restart interrupted: FAIL for Optuna, its values asked again next, not counted."""
        study = await self._study(sweep_id)

        def fail_and_enqueue() -> None:
            study.tell(trial.number, "failed")
            study.enqueue(trial.params)

        await self._in_thread(fail_and_enqueue)
        self._write_trial(sweep_id, trial.number, "requeued", state="failed", counted=False, requeued=True)
        self._trial_of.pop(trial.job_id, None)

    # -- the sweep's course -------------------------------------------------

    async def _advance(self, sweep_id: str) -> None:
        """Queue trials while there is room (`max_parallel`, `trials`), or end the sweep."""
        async with self._lock(sweep_id):
            sweep = self.table.get(sweep_id)
            if is_terminal(sweep.status):
                return
            spec = sweep.spec
            trials = self.table.trials(sweep_id)
            counted = sum(1 for t in trials if t.counted)
            failed = sum(1 for t in trials if t.counted and t.state == "failed")
            running = [t for t in trials if t.state in OPEN_TRIAL_STATES]
            if failed >= int(spec["max_failed_trials"]):
                last = next((t for t in reversed(trials) if t.counted and t.state == "failed"), None)
                self._set_status(
                    sweep_id, "error", "Sweep failed",
                    error=f"{failed} trials failed (max_failed_trials {spec['max_failed_trials']})"
                    + (f"; the last, trial {last.number}, is job {last.job_id}: see its status" if last else ""),
                )
                await self._stop_open(sweep_id)
                return
            planned = int(spec["trials_planned"])
            while len(running) < int(spec["max_parallel"]) and counted + len(running) < planned:
                trial = await self._queue_next(sweep_id, sweep)
                if trial is None:
                    break
                running.append(trial)
                if trial.state == "failed":  # refused by admission: counted as failed
                    await self._release_and_readvance(sweep_id)
                    return
            if not running and counted >= planned:
                self._set_status(sweep_id, "completed", f"Completed: {counted} trials")
                self._spawn(self.importances(sweep_id), f"sweep {sweep_id} importances")

    async def _release_and_readvance(self, sweep_id: str) -> None:
        self._spawn(self._advance(sweep_id), f"sweep {sweep_id}")

    async def _queue_next(self, sweep_id: str, sweep: SweepRecord) -> Optional[TrialRecord]:
        study = await self._study(sweep_id)
        number, params = await self._in_thread(study.ask)
        request = {**sweep.spec["request"], **self._secrets.get(sweep_id, {}), **params}
        tag = {"sweep_id": sweep_id, "trial": number}
        try:
            job_id = self.queue_trial(request, tag, sweep.spec.get(OWNER))
        except Exception as exc:  # refused (Refused, StorageFailed) or broken: the trial fails, counted, and the sweep goes on
            if not isinstance(exc, (Refused, StorageFailed)):
                log.exception("queueing trial %d of sweep %s failed", number, sweep_id)
            await self._in_thread(lambda: study.tell(number, "failed"))
            self.table.add_trial(sweep_id, number, "", params)
            self._write_trial(sweep_id, number, "failed", state="failed", counted=True,
                              report={"why": f"the trial's job was not queued: {exc}"})
            return self.table.trial(sweep_id, number)
        self._trial_of[job_id] = (sweep_id, number)
        self._notify_after(self.table.add_trial(sweep_id, number, job_id, params), sweep_id)
        return self.table.trial(sweep_id, number)

    async def _stop_open(self, sweep_id: str) -> None:
        for trial in self.table.trials(sweep_id):
            if trial.state in OPEN_TRIAL_STATES and trial.job_id:
                job = self.service.store.get_job(trial.job_id)
                if not is_terminal(job.phase):
                    try:
                        await self.supervisor.stop_job(trial.job_id)
                    except InvalidTransition:
                        pass

    async def _recover(self, sweep_id: str) -> None:
        sweep = self.table.get(sweep_id)
        for trial in self.table.trials(sweep_id):
            if trial.state not in OPEN_TRIAL_STATES or not trial.job_id:
                continue
            job = self.service.store.get_job(trial.job_id)
            self._trial_of[trial.job_id] = (sweep_id, trial.number)
            if trial.prune_at is not None:
                self.supervisor.pruned[trial.job_id] = trial.prune_at
            if is_terminal(job.phase):
                await self._ended(sweep_id, trial.number, job.id, job.phase, job.status)
        if sweep.status == "stopped":
            return
        await self._advance(sweep_id)

    # -- helpers ------------------------------------------------------------

    def _set_status(self, sweep_id: str, status: str, message: str, error: Optional[str] = None) -> None:
        self._notify_after(self.table.set_status(sweep_id, _status(sweep_id, status, message, error)), sweep_id)

    def _write_trial(self, sweep_id: str, number: int, event: str, **changes: Any) -> None:
        self._notify_after(self.table.update_trial(sweep_id, number, event, **changes), sweep_id)

    def _notify_after(self, _written: Any, sweep_id: str) -> None:
        changed = self._changed.pop(sweep_id, None)
        if changed is not None:
            changed.set()

    def _lock(self, sweep_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sweep_id, asyncio.Lock())

    async def _study(self, sweep_id: str) -> Study:
        study = self._studies.get(sweep_id)
        if study is None:
            from finetune_studio.supervisor.sweep_study import open_study

            spec = SweepCreate.model_validate(
                {key: value for key, value in self.table.get(sweep_id).spec.items() if key not in ("trials_planned", OWNER)}
            )
            study = self._studies[sweep_id] = await self._in_thread(lambda: open_study(self.sweeps_db, sweep_id, spec))
        return study

    async def _in_thread(self, work: Callable[[], Result]) -> Result:
        """Run Optuna's blocking work in the one worker thread (its SQLite storage, its samplers)."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="optuna")
        began = time.perf_counter()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, work)
        finally:
            self.optuna_seconds += time.perf_counter() - began

    def _spawn(self, work: Any, name: str) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(self._guarded(work, name), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, work: Any, name: str) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception:  # a sweep's step must never take the server down
            log.exception("%s failed", name)


def _status(sweep_id: str, status: str, message: str, error: Optional[str] = None) -> dict[str, Any]:
    return {"sweep_id": sweep_id, "status": status, "message": message, "error": error,
            "details": {"time": round(time.time(), 6)}}


def _pruner_type(spec: dict[str, Any]) -> str:
    pruner = spec.get("pruner") or "none"
    return str(pruner if isinstance(pruner, str) else pruner.get("type", "none"))

