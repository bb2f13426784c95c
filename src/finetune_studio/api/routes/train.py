"""The training routes of DESIGN.md section 2: start, status, progress, stream, stop, jobs."""

from __future__ import annotations

from typing import Annotated, Optional, Union

from fastapi import APIRouter, Header, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from fastapi.sse import EventSourceResponse

from finetune_studio.api.admission import check_start
from finetune_studio.api.deps import JobDep, StudioDep, studio_of
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
async def start_training(request: TrainingStartRequest, studio: StudioDep) -> TrainingJobResponse:
    """Queue a training job. It runs when the jobs before it have finished."""
    service, supervisor = studio.service, studio.supervisor
    queued = len(supervisor.queue_positions())
    check_start(request, studio.settings, queued=queued)
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


@router.get("/status/{job_id}", response_model=TrainingStatus, responses=_NOT_FOUND)
async def training_status(job_id: str, request: Request) -> Response:
    """The job's current phase (for polling)."""
    # The pollers' hot path: no dependency to solve, and the status JSON as stored
    # (it was validated when written); only a queued job's answer is built, to add
    # its place in the queue.
    studio = studio_of(request)
    phase, status_json = studio.service.store.status_json(job_id)
    if phase == "idle":
        job = studio.service.store.get_job(job_id)
        status_json = studio.service.status_of(job, studio.supervisor.queue_positions().get(job_id)).model_dump_json()
    return Response(status_json, media_type="application/json")


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


# The stream's items, for the OpenAPI document (the route returns its own
# EventSourceResponse of pre-encoded bytes, so FastAPI cannot derive them).
_STREAM = {
    status.HTTP_200_OK: {
        "description": "Server-Sent Events: `status` (a TrainingStatus) and `progress` (a TrainingProgress)",
        "content": {
            "text/event-stream": {
                "itemSchema": {
                    "type": "object",
                    "required": ["event", "data", "id"],
                    "properties": {
                        "event": {"type": "string", "enum": ["status", "progress"]},
                        "data": {"type": "string", "contentMediaType": "application/json"},
                        "id": {"type": "string", "description": "the event id, for Last-Event-ID"},
                    },
                }
            }
        },
    }
}


@router.get("/stream/{job_id}", response_class=StreamingResponse, responses={**_STREAM, **_NOT_FOUND})
async def training_stream(
    job: JobDep,
    studio: StudioDep,
    last_event_id_header: Annotated[Optional[int], Header(alias="Last-Event-ID", ge=0, le=_MAX_EVENT_ID)] = None,
    last_event_id: Annotated[Optional[int], Query(ge=0, le=_MAX_EVENT_ID, description="Resume after this event id")] = None,
) -> EventSourceResponse:
    """Every status and progress event of the job as Server-Sent Events
    (`event: status|progress`, `data: <JSON>`, `id: <event id>`).

    Replays the events after `Last-Event-ID` (header or query), follows live, and
    closes after the terminal status; a comment line comes every 15 s while nothing
    happens. Each event is encoded once for all clients, and each client gets all
    the events it is behind on in one write.
    """
    after = max(last_event_id_header or 0, last_event_id or 0)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return EventSourceResponse(studio.service.stream(job.id, after), headers=headers)


@router.post("/stop/{job_id}", responses={**_NOT_FOUND, status.HTTP_409_CONFLICT: {"description": "The job has finished"}})
async def stop_training(job: JobDep, studio: StudioDep) -> TrainingStatus:
    """Stop a job: a queued one at once; a running one after its current step, saving what it trained."""
    return await studio.supervisor.stop_job(job.id)


@router.get("/jobs")
async def list_jobs(studio: StudioDep) -> JobList:
    """Every job's current status, newest first."""
    positions = studio.supervisor.queue_positions()
    data = [studio.service.status_of(job, positions.get(job.id)) for job in studio.service.store.list_jobs()]
    return JobList(data=data, count=len(data))
