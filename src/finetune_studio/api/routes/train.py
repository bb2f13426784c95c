"""The training routes of DESIGN.md section 2: start, status, progress, stream, stop, jobs."""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import Annotated, Optional, Union

from fastapi import APIRouter, Header, Query, Response, status
from fastapi.sse import EventSourceResponse, ServerSentEvent

from finetune_studio.api.admission import check_start
from finetune_studio.api.deps import JobDep, ServiceDep, SettingsDep, SupervisorDep
from finetune_studio.schemas import (
    SECRET_FIELDS,
    JobList,
    TrainingJobResponse,
    TrainingProgress,
    TrainingStartRequest,
    TrainingStatus,
)

router = APIRouter(prefix="/train", tags=["train"])

_REFUSED = {
    status.HTTP_400_BAD_REQUEST: {"model": TrainingJobResponse, "description": "The server cannot take this request"},
    status.HTTP_403_FORBIDDEN: {"model": TrainingJobResponse, "description": "A path lies outside the allowed folders"},
    status.HTTP_413_CONTENT_TOO_LARGE: {"description": "The request body is over the server's limit"},
    status.HTTP_429_TOO_MANY_REQUESTS: {"model": TrainingJobResponse, "description": "The queue is full"},
}
_NOT_FOUND = {status.HTTP_404_NOT_FOUND: {"description": "No job has this id"}}
# Event ids are SQLite integers: a larger cursor is refused (422) rather than overflowing.
_MAX_EVENT_ID = 2**63 - 1


@router.post("/start", responses=_REFUSED)
async def start_training(
    request: TrainingStartRequest, service: ServiceDep, supervisor: SupervisorDep, settings: SettingsDep
) -> TrainingJobResponse:
    """Queue a training job. It runs when the jobs before it have finished."""
    queued = len(supervisor.queue_positions())
    check_start(request, settings, queued=queued)
    stored = request.redacted()
    stored["withheld_secrets"] = [name for name in SECRET_FIELDS if getattr(request, name)]
    position = queued + 1
    job = service.create_job(
        stored,
        message=f"Queued (position {position})",
        details={"model_name": request.model_name, "project_name": request.project_name},
    )
    supervisor.submit(job.id, request.model_dump())
    return TrainingJobResponse(job_id=job.id, status="queued", message=f"Job {job.id} queued at position {position}")


@router.get("/status/{job_id}", responses=_NOT_FOUND)
async def training_status(job: JobDep, service: ServiceDep, supervisor: SupervisorDep) -> TrainingStatus:
    """The job's current phase (for polling)."""
    return service.status_of(job, supervisor.queue_positions().get(job.id))


@router.get(
    "/progress/{job_id}",
    response_model=TrainingProgress,
    responses={**_NOT_FOUND, status.HTTP_204_NO_CONTENT: {"description": "No step has finished yet"}},
)
async def training_progress(job: JobDep) -> Union[TrainingProgress, Response]:
    """The latest step's metrics; 204 while no step has finished."""
    if job.progress is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return TrainingProgress.model_validate(job.progress)


@router.get("/stream/{job_id}", response_class=EventSourceResponse, responses=_NOT_FOUND)
async def training_stream(
    job: JobDep,
    service: ServiceDep,
    last_event_id_header: Annotated[Optional[int], Header(alias="Last-Event-ID", ge=0, le=_MAX_EVENT_ID)] = None,
    last_event_id: Annotated[Optional[int], Query(ge=0, le=_MAX_EVENT_ID, description="Resume after this event id")] = None,
) -> AsyncIterable[ServerSentEvent]:
    """Every status and progress event of the job as Server-Sent Events.

    Replays the events after `Last-Event-ID` (header or query), follows live, and
    closes after the terminal status.
    """
    after = max(last_event_id_header or 0, last_event_id or 0)
    async for event in service.follow(job.id, after):
        yield ServerSentEvent(raw_data=event.data, event=event.kind, id=str(event.id))


@router.post("/stop/{job_id}", responses={**_NOT_FOUND, status.HTTP_409_CONFLICT: {"description": "The job has finished"}})
async def stop_training(job: JobDep, supervisor: SupervisorDep) -> TrainingStatus:
    """Stop a job: a queued one at once; a running one after its current step, saving what it trained."""
    return await supervisor.stop_job(job.id)


@router.get("/jobs")
async def list_jobs(service: ServiceDep, supervisor: SupervisorDep) -> JobList:
    """Every job's current status, newest first."""
    positions = supervisor.queue_positions()
    data = [service.status_of(job, positions.get(job.id)) for job in service.store.list_jobs()]
    return JobList(data=data, count=len(data))
