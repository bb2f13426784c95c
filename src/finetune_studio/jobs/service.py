"""JobService: the one place that writes job state, and the event fan-out.

Every status change and every progress step goes through here: it is persisted by
the store (one transaction), encoded once as SSE bytes into the job's `EventFeed`,
and then wakes every stream reader of that job. Readers never get events pushed
into per-client queues; each keeps a cursor (the last event id it sent) and takes
everything past it in one chunk, from the feed when the feed reaches back that far
and from the database otherwise. So a slow client costs nothing to the others, and
reconnecting with `Last-Event-ID` is the same code path as following live.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Optional, Union, cast

from finetune_studio.bounds import bound_status
from finetune_studio.errors import InvalidTransition, JobNotFound, StorageFailed, StudioError
from finetune_studio.jobs.counters import Counters
from finetune_studio.jobs.evaluations import eval_join
from finetune_studio.jobs.feed import CHUNK_BYTES, FRAME_OVERHEAD, KEEPALIVE, EventFeed, sse_frame
from finetune_studio.jobs.phases import EVAL_RUNNING, EXPORT_RUNNING, PHASES_OF, TERMINAL
from finetune_studio.jobs.store import JobRecord, JobStore, StoredEvent
from finetune_studio.jobs.summary import summarize
from finetune_studio.schemas import (
    SWEEP_TRIAL,
    EvalPhase,
    EvalProgress,
    EvalStatus,
    ExportPhase,
    ExportProgress,
    ExportStatus,
    Phase,
    TrainingProgress,
    TrainingStatus,
)
from finetune_studio.wire import DataDir


def new_job_id() -> str:
    return secrets.token_hex(6)


def make_status(
    job_id: str,
    phase: str,
    message: str,
    *,
    error: Optional[str] = None,
    details: Optional[dict[str, Any]] = None,
    kind: str = "train",
    exported_job: str = "",
) -> dict[str, Any]:
    """A TrainingStatus payload (an ExportStatus for an export, of the training job
    `exported_job`), validated against its model, stamped with its time
    (`details.time`, seconds since the epoch) so that a replay shows how long each
    phase took, and bounded (`finetune_studio.bounds`): a child's message is
    untrusted, and a status is copied into the stream and every polling answer."""
    phases = PHASES_OF[kind]
    if phase not in phases:
        raise InvalidTransition(f"job {job_id} cannot go to {phase!r}: not a phase (phases: {', '.join(phases)})")
    message, error, details = bound_status(message, error, details)
    said: dict[str, Any] = {"message": message, "error": error, "details": {**(details or {}), "time": round(time.time(), 6)}}
    if kind == "eval":
        return EvalStatus(eval_id=job_id, phase=cast(EvalPhase, phase), is_running=phase in EVAL_RUNNING, **said).model_dump()
    if kind == "export":
        return ExportStatus(export_id=job_id, job_id=exported_job, phase=cast(ExportPhase, phase),
                            is_running=phase in EXPORT_RUNNING, **said).model_dump()
    return TrainingStatus(job_id=job_id, phase=cast(Phase, phase), is_training_running=phase == "training", **said).model_dump()


def _show_queue_position(
    status: Union[TrainingStatus, ExportStatus, EvalStatus], job: JobRecord, queue_position: Optional[int]
) -> None:
    """A queued job's status says its place in its queue: in the message and in
    `details.queue_position` (the same number). An export waiting for llama.cpp's
    build keeps its message, which says how far the build is."""
    if queue_position is not None and status.phase == "idle":
        if not (status.details or {}).get("waiting_for"):
            status.message = f"Queued (position {queue_position})"
        status.details = {**(status.details or {}), "queue_position": queue_position}


# Events a feed keeps in memory per unfinished job (about 300 bytes each).
FEED_CAPACITY = 4096
# Events per database read when a reader is behind its job's feed (a page also
# ends at CHUNK_BYTES).
REPLAY_PAGE = 5000


class JobService:
    def __init__(
        self,
        store: JobStore,
        jobs_dir: Path,
        keepalive_seconds: float = 15.0,
        exports_dir: Optional[Path] = None,
        evals_dir: Optional[Path] = None,
    ) -> None:
        self.store = store
        self.jobs_dir = jobs_dir
        # An export's files live in <data dir>/exports/<export id>/, beside jobs/; an evaluation's in evals/<id>/.
        self.exports_dir = exports_dir or DataDir.of_jobs(jobs_dir).exports
        self.evals_dir = evals_dir or DataDir.of_jobs(jobs_dir).evals
        self.keepalive_seconds = keepalive_seconds
        # The feeds of unfinished jobs that have had an event or a reader since the
        # server started; a finished job's feed is dropped (its readers keep theirs).
        self._feeds: dict[str, EventFeed] = {}
        # Open streams per job (see `open_reader`).
        self._readers: dict[str, int] = {}
        # The studio's own counters for /metrics (jobs/counters.py): bumped here and by the routes.
        self.counters = Counters()
        # Ends that could not be written (the store failed): job id -> the arguments of
        # its `transition`; the store shows their statuses meanwhile (JobStore.hold).
        self._held: dict[str, tuple[str, str, Optional[str], dict[str, Any]]] = {}
        # Called with every event once it is written (the sweeps follow their trials: supervisor/sweeps.py);
        # on the loop, so each must be quick and must not raise.
        self.listeners: list[Callable[[StoredEvent], None]] = []

    # -- writes -------------------------------------------------------------

    def create_job(
        self, request: dict[str, Any], message: str, details: dict[str, Any], kind: str = "train",
        owner: Optional[str] = None,
    ) -> JobRecord:
        """Queue a job of `kind`; an export's request names the training job it exports (`job_id`).
        Its owner is `owner`, else the current request's user (jobs/accounts.py)."""
        job_id = new_job_id()
        # The output folder is the server's choice alone (never a path from the
        # request): the data dir's jobs/<random hex id> (exports/<id> for an export).
        parent = {"export": self.exports_dir, "eval": self.evals_dir}.get(kind, self.jobs_dir)
        output_dir = parent / job_id
        if output_dir.resolve().parent != parent.resolve():
            raise StudioError(f"refusing an output folder outside {parent}: {output_dir}")
        if request.get(SWEEP_TRIAL):
            details = {SWEEP_TRIAL: request[SWEEP_TRIAL], **details}
        status = make_status(
            job_id, "idle", message, details={"output_dir": str(output_dir), **details}, kind=kind,
            exported_job=str(request.get("job_id", "")),
        )
        event = self.store.create_job(job_id, request, str(output_dir), status, kind=kind, owner=owner)
        self._publish(event, terminal=False)
        return self.store.get_job(job_id)

    def transition(
        self,
        job_id: str,
        phase: str,
        message: str,
        *,
        error: Optional[str] = None,
        details: Optional[dict[str, Any]] = None,
    ) -> StoredEvent:
        job = self.store.get_job(job_id)
        if job.kind == "export":
            # Every status of an export says what it exports, whatever its child reports.
            what: dict[str, Any] = {key: job.request[key] for key in ("format", "quantizations") if key in job.request}
            details = {**what, **(details or {})}
        elif job.request.get(SWEEP_TRIAL):  # a sweep's trial says so in every status (supervisor/sweeps.py)
            details = {SWEEP_TRIAL: job.request[SWEEP_TRIAL], **(details or {})}
        status = make_status(
            job_id, phase, message, error=error, details=details, kind=job.kind,
            exported_job=str(job.request.get("job_id", "")),
        )
        if phase in TERMINAL and job.kind == "train":
            # Added after the child's details were bounded: its size is fixed (summary.py).
            status["details"]["summary"] = self.summary(job_id, job.request, ended=status["details"]["time"])
        event = self.store.transition(job_id, status)
        self._publish(event, terminal=phase in TERMINAL)
        return event

    def hold_end(
        self, job_id: str, phase: str, message: str, *, error: Optional[str], details: dict[str, Any]
    ) -> None:
        """Keep in memory an end the store could not take (`StorageFailed`): every read
        of the job shows it from now on (JobStore.hold), it is no longer queued, and
        `write_held` writes it once the store takes writes."""
        job = self.store.get_job(job_id)
        status = make_status(
            job_id, phase, message, error=error, details=details, kind=job.kind,
            exported_job=str(job.request.get("job_id", "")),
        )
        self._held[job_id] = (phase, message, error, details)
        self.store.hold(job_id, status)

    def is_held(self, job_id: str) -> bool:
        return job_id in self._held

    def held_ids(self) -> list[str]:
        """The jobs whose end is held in memory, not yet written."""
        return list(self._held)

    def write_held(self) -> bool:
        """Write every held end; True when none is left. A held end the job's phase no
        longer allows (it was stopped since) is dropped."""
        for job_id, (phase, message, error, details) in list(self._held.items()):
            try:
                self.transition(job_id, phase, message, error=error, details=details)
            except StorageFailed:
                return False
            except (InvalidTransition, JobNotFound):
                self.store.hold(job_id, None)
            self._held.pop(job_id, None)
        return True

    def summary(self, job_id: str, request: dict[str, Any], ended: float) -> dict[str, Any]:
        """The run summary (`details.summary`) from the job's events, up to `ended`."""
        return summarize(self.store.progress_points(job_id), request, self.store.queued_at(job_id), ended)

    def record_progress(self, job_id: str, progress: dict[str, Any], kind: str = "train") -> Optional[StoredEvent]:
        """One step of a job of `kind` (a TrainingProgress; an ExportProgress for an export)."""
        if kind == "export":
            payload = ExportProgress.model_validate(progress).model_dump(exclude_none=True)
        elif kind == "eval":
            payload = EvalProgress.model_validate(progress).model_dump(exclude_none=True)
        else:
            # Unset metrics are left out, and so is `loss_finite` while it is true; `loss`
            # is always there (null when the step's loss was not finite).
            payload = TrainingProgress.model_validate(progress).model_dump(exclude_defaults=True)
        event = self.store.append_progress(job_id, payload)
        if event is not None:
            self._publish(event, terminal=False)
        return event

    def set_worker(self, job_id: str, pid: Optional[int]) -> None:
        """Record the pid of the job's running worker (None once it is gone), so that
        a restarted server can find an orphan."""
        self.store.set_worker_pid(job_id, pid)

    def mark_stop_requested(self, job_id: str, pause: bool = False) -> None:
        """Record that a stop (with `pause`, a pause) was asked for: it outlives the
        server, so a job whose server dies while it stops still ends `stopped`, paused
        if a pause was asked (supervisor/recovery.py)."""
        self.store.set_stop_requested(job_id, pause=pause)

    def resume(self, job_id: str, request: dict[str, Any], message: str, details: dict[str, Any]) -> StoredEvent:
        """Queue a paused job again (`stopped` -> `idle`, jobs/phases.py), to run with
        `request` (which names the checkpoint it continues from); its event ids go on."""
        status = make_status(job_id, "idle", message, details=details)
        event = self.store.transition(job_id, status, request=request)
        self._publish(event, terminal=False)
        return event

    def rename(self, job_id: str, project_name: Optional[str]) -> JobRecord:
        """Set a training job's label (`project_name`; None or "" removes it)."""
        self.store.get_job(job_id, kind="train")  # JobNotFound for an export's id too
        self.store.set_project_name(job_id, project_name or None)
        return self.store.get_job(job_id)

    def delete_job(self, job_id: str) -> list[Path]:
        """Forget a finished training job and its exports (rows and events, in one
        transaction; JobNotFinished when any of them is queued or running) and return
        their folders, for `remove_folders`."""
        job = self.store.get_job(job_id, kind="train")
        exports = self.store.list_jobs(kind="export", exported_job=job_id)
        self.store.delete_jobs([job.id, *(export.id for export in exports)])
        for gone in (job, *exports):
            self._feeds.pop(gone.id, None)
        # Only folders the server made (jobs/<id>, exports/<id>) are ever removed.
        parents = {self.jobs_dir.resolve(), self.exports_dir.resolve()}
        return [Path(gone.output_dir) for gone in (job, *exports) if Path(gone.output_dir).resolve().parent in parents]

    @staticmethod
    def remove_folders(folders: list[Path]) -> list[str]:
        """Delete the folders of deleted jobs; returns what could not be removed, in words."""
        problems = []
        for folder in folders:
            try:
                shutil.rmtree(folder)
            except FileNotFoundError:
                continue  # a job that never started made no folder
            except OSError as exc:
                problems.append(f"{folder}: {exc.strerror or exc}")
        return problems

    def _publish(self, event: StoredEvent, terminal: bool) -> None:
        feed = self._feeds.get(event.job_id)
        if feed is None:
            feed = self._feeds[event.job_id] = EventFeed(event.id, FEED_CAPACITY)
        feed.append(event, sse_frame(event), terminal)
        if terminal:
            del self._feeds[event.job_id]
        for listener in self.listeners:
            listener(event)

    async def keep_streams_alive(self) -> None:
        """Wake every reader each `keepalive_seconds`; an idle stream then sends a comment,
        so proxies keep it open and a client that went away is noticed."""
        while True:
            await asyncio.sleep(self.keepalive_seconds)
            for feed in list(self._feeds.values()):
                feed.wake()

    # -- reads --------------------------------------------------------------

    def open_reader(self, job_id: str, limit: int) -> bool:
        """Count a new stream of the job, unless it has `limit` open already (False)."""
        count = self._readers.get(job_id, 0)
        if count >= limit:
            return False
        self._readers[job_id] = count + 1
        return True

    def readers(self, job_id: str) -> int:
        """The job's open streams."""
        return self._readers.get(job_id, 0)

    def open_streams(self) -> int:
        """Every job's open streams together."""
        return sum(self._readers.values())

    def close_reader(self, job_id: str) -> None:
        count = self._readers.get(job_id, 0) - 1
        if count > 0:
            self._readers[job_id] = count
        else:
            self._readers.pop(job_id, None)

    def status_of(
        self, job: JobRecord, queue_position: Optional[int] = None, with_summary: bool = False, with_names: bool = False
    ) -> TrainingStatus:
        """The job's current status; a queued job's place in the queue is known only
        now (`details.queue_position`, and the message says the same number). A
        finished job's status carries its run summary; `with_summary` adds the
        summary so far to a training job's (one query over its progress events);
        `with_names` adds the request's `model_name` and `project_name` (the current
        label, which a rename changes), which later statuses do not carry."""
        status = TrainingStatus.model_validate(job.status)
        if with_names:
            names = {key: job.request.get(key) for key in ("model_name", "project_name")}
            status.details = {**(status.details or {}), **names}
        _show_queue_position(status, job, queue_position)
        if with_summary and job.phase == "training":
            summary = self.summary(job.id, job.request, ended=time.time())
            status.details = {**(status.details or {}), "summary": summary}
        if (status.details or {}).get("eval_id"):
            # eval_after's evaluation, joined when read (its job's stream is closed): its summary and the guard.
            status.details = eval_join(self.store, job, dict(status.details or {}))
        return status

    def eval_status_of(self, job: JobRecord, queue_position: Optional[int] = None) -> EvalStatus:
        """An evaluation's current status; a queued one's place among the queued evaluations."""
        status = EvalStatus.model_validate(job.status)
        _show_queue_position(status, job, queue_position)
        return status

    def export_status_of(self, job: JobRecord, queue_position: Optional[int] = None) -> ExportStatus:
        """An export's current status; a queued one's place among the queued exports."""
        status = ExportStatus.model_validate(job.status)
        _show_queue_position(status, job, queue_position)
        return status

    async def stream(self, job_id: str, after_id: int = 0) -> AsyncIterator[bytes]:
        """Every event of a job with id > after_id as SSE bytes, live, ending after the
        terminal status. Each chunk holds every event the reader was behind on, up
        to CHUNK_BYTES (so a reader far behind takes several)."""
        cursor = after_id
        feed: Optional[EventFeed] = None
        while True:
            if feed is None or not feed.covers(cursor):
                feed = self._feeds.get(job_id)
            if feed is not None and feed.covers(cursor):
                first = cursor + 1
                chunk, cursor = feed.frames_after(cursor, CHUNK_BYTES)
                if chunk:
                    written = feed.appended_at(first)
                    yield chunk
                    # Once the client's transport took it: how long its oldest event waited (live chunks only).
                    self.counters.observe_latency(time.monotonic() - written)
                    if feed.finished and cursor == feed.last_id:
                        return
                    continue
                if feed.finished:
                    return  # the terminal event was at or before after_id
            else:
                events = self.store.events_after(
                    job_id, cursor, limit=REPLAY_PAGE, max_bytes=CHUNK_BYTES, row_overhead=FRAME_OVERHEAD
                )
                if events:
                    chunk = b"".join(sse_frame(event) for event in events)
                    cursor, ended = events[-1].id, events[-1].is_terminal_status
                    if ended and self.store.get_job(job_id).last_event_id > cursor:
                        ended = False  # a paused job that was resumed since: its events go on
                    events.clear()  # not held while the client reads the chunk
                    yield chunk
                    if ended:
                        return
                    continue
                # Caught up with the database, and no feed reaches back here: the job
                # is finished, or has had no event since the server started.
                job = self.store.get_job(job_id)
                if job.phase in TERMINAL:
                    return  # finished and fully read (terminal event id <= after_id)
                feed = self._feeds.setdefault(job_id, EventFeed(job.last_event_id + 1, FEED_CAPACITY))
            # Nothing new. No await lies between the read above and this wait, so no
            # event can slip past unnoticed.
            await feed.wait()
            if feed.last_id <= cursor and not feed.finished:
                yield KEEPALIVE  # woken with nothing new: the keep-alive tick
