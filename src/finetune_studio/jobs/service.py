"""JobService: the one place that writes job state, and the event fan-out.

Every status change and every progress step goes through here: it is persisted by
the store (one transaction) and then wakes every stream reader of that job. Readers
never get events pushed into per-client queues; each keeps a cursor (the last event
id it sent) and reads what is past it, so a slow client costs nothing to the others
and reconnecting with `Last-Event-ID` is the same code path as following live.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Optional

from finetune_studio.errors import StudioError
from finetune_studio.jobs.phases import RUNNING
from finetune_studio.jobs.store import JobRecord, JobStore, StoredEvent
from finetune_studio.schemas import TrainingProgress, TrainingStatus


def new_job_id() -> str:
    return secrets.token_hex(6)


def make_status(
    job_id: str,
    phase: str,
    message: str,
    *,
    error: Optional[str] = None,
    details: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """A TrainingStatus payload, validated against the seed's model."""
    status = TrainingStatus(
        job_id=job_id,
        phase=phase,  # type: ignore[arg-type]
        is_training_running=phase == "training",
        message=message,
        error=error,
        details=details,
    )
    return status.model_dump()


class JobService:
    def __init__(self, store: JobStore, jobs_dir: Path) -> None:
        self.store = store
        self.jobs_dir = jobs_dir
        # One asyncio.Event per job with waiting readers; set and dropped on publish.
        self._signals: dict[str, asyncio.Event] = {}

    # -- writes -------------------------------------------------------------

    def create_job(self, request: dict[str, Any], message: str, details: dict[str, Any]) -> JobRecord:
        job_id = new_job_id()
        # The output folder is the server's choice alone (never a path from the
        # request): the data dir's jobs/<random hex id>.
        output_dir = self.jobs_dir / job_id
        if output_dir.resolve().parent != self.jobs_dir.resolve():
            raise StudioError(f"refusing an output folder outside {self.jobs_dir}: {output_dir}")
        status = make_status(job_id, "idle", message, details={"output_dir": str(output_dir), **details})
        event = self.store.create_job(job_id, request, str(output_dir), status)
        self._publish(event)
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
        event = self.store.transition(job_id, make_status(job_id, phase, message, error=error, details=details))
        self._publish(event)
        return event

    def record_progress(self, job_id: str, progress: dict[str, Any]) -> Optional[StoredEvent]:
        payload = TrainingProgress.model_validate(progress).model_dump(exclude_none=True)
        event = self.store.append_progress(job_id, payload)
        if event is not None:
            self._publish(event)
        return event

    def _publish(self, event: StoredEvent) -> None:
        signal = self._signals.pop(event.job_id, None)
        if signal is not None:
            signal.set()

    # -- reads --------------------------------------------------------------

    def status_of(self, job: JobRecord, queue_position: Optional[int] = None) -> TrainingStatus:
        status = TrainingStatus.model_validate(job.status)
        if queue_position is not None and job.phase == "idle":
            details = dict(status.details or {})
            details["queue_position"] = queue_position
            status.details = details
        return status

    async def follow(self, job_id: str, after_id: int = 0) -> AsyncIterator[StoredEvent]:
        """Every event of a job with id > after_id, live, ending after the terminal status."""
        cursor = after_id
        while True:
            events = self.store.events_after(job_id, cursor)
            for event in events:
                yield event
                cursor = event.id
                if event.is_terminal_status:
                    return
            if events:
                continue
            # Nothing new. No await lies between the read above and taking the
            # signal here, so no event can slip past unnoticed.
            if self.store.get_job(job_id).phase not in RUNNING | {"idle"}:
                return  # finished and fully read (terminal event id <= after_id)
            signal = self._signals.setdefault(job_id, asyncio.Event())
            await signal.wait()
