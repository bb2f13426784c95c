"""The training routes of DESIGN.md section 2: start, status, progress, stream, stop, jobs."""

from __future__ import annotations

from typing import Annotated, Any, Optional, Union

from fastapi import APIRouter, Header, Query, Request, Response, status
from fastapi.responses import JSONResponse, StreamingResponse

from finetune_studio.api.admission import check_start
from finetune_studio.api.deps import JobDep, StudioDep, studio_of
from finetune_studio.api.streaming import BoundedEventStream
from finetune_studio.errors import PastLastEvent
from finetune_studio.schemas import (
    QUEUED_WARNINGS,
    SECRET_FIELDS,
    WITHHELD_SECRETS,
    JobList,
    TrainingJobResponse,
    TrainingProgress,
    TrainingStartRequest,
    TrainingStatus,
)

router = APIRouter(prefix="/train", tags=["train"])
# Documented answers of a route, as FastAPI's `responses` takes them.
Responses = dict[Union[int, str], dict[str, Any]]

_REFUSED: Responses = {
    status.HTTP_400_BAD_REQUEST: {"model": TrainingJobResponse, "description": "The server cannot take this request"},
    status.HTTP_403_FORBIDDEN: {"model": TrainingJobResponse, "description": "A path lies outside the allowed folders"},
    status.HTTP_413_CONTENT_TOO_LARGE: {"description": "The request body is over the server's limit"},
    status.HTTP_429_TOO_MANY_REQUESTS: {"model": TrainingJobResponse, "description": "The queue is full"},
}
_NOT_FOUND: Responses = {status.HTTP_404_NOT_FOUND: {"description": "No job has this id"}}
# Event ids are SQLite integers: a larger cursor is refused (422) rather than overflowing.
_MAX_EVENT_ID = 2**63 - 1


@router.post("/start", responses=_REFUSED)
async def start_training(request: TrainingStartRequest, studio: StudioDep) -> TrainingJobResponse:
    """Queue a training job. It runs when the jobs before it have finished."""
    service, supervisor = studio.service, studio.supervisor
    queued = len(supervisor.queue_positions())
    check_start(request, studio.settings, queued=queued)
    stored = request.redacted()
    secrets = {name: value for name in SECRET_FIELDS if (value := getattr(request, name))}
    stored[WITHHELD_SECRETS] = sorted(secrets)
    warning = request.ignored_fields_warning()
    stored[QUEUED_WARNINGS] = [warning] if warning else []
    details: dict[str, Any] = {"model_name": request.model_name, "project_name": request.project_name}
    if warning:
        details["warnings"] = [warning]
    job = service.create_job(stored, message="Queued", details=details)
    supervisor.submit(job.id, secrets)
    return TrainingJobResponse(job_id=job.id, status="queued", message=f"Job {job.id} queued at position {queued + 1}")


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
_STREAM: Responses = {
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


_PAST_END: Responses = {
    status.HTTP_416_RANGE_NOT_SATISFIABLE: {
        "description": "Last-Event-ID is past the job's last event; the message names the last event id"
    }
}
_FULL: Responses = {
    status.HTTP_503_SERVICE_UNAVAILABLE: {
        "description": "The job has as many open streams as the server allows (max_streams_per_job); see Retry-After"
    }
}
_STREAM_RETRY_SECONDS = 5


@router.get(
    "/stream/{job_id}", response_class=StreamingResponse, responses={**_STREAM, **_NOT_FOUND, **_PAST_END, **_FULL}
)
async def training_stream(
    job: JobDep,
    studio: StudioDep,
    last_event_id_header: Annotated[Optional[int], Header(alias="Last-Event-ID", ge=0, le=_MAX_EVENT_ID)] = None,
    last_event_id: Annotated[Optional[int], Query(ge=0, le=_MAX_EVENT_ID, description="Resume after this event id")] = None,
) -> Response:
    """Every status and progress event of the job as Server-Sent Events
    (`event: status|progress`, `data: <JSON>`, `id: <event id>`).

    Replays the events after `Last-Event-ID` (header or query), follows live, and
    closes after the terminal status; a comment line comes every 15 s while nothing
    happens. A `Last-Event-ID` past the job's last event is a 416 that names the last
    event id. Each event is encoded once for all clients, and each client gets all
    the events it is behind on in one write (up to 64 KiB). A client that stops
    reading is dropped after `stream_stall_seconds` (it reconnects with
    Last-Event-ID); a job holds at most `max_streams_per_job` streams (503 beyond).
    """
    after = max(last_event_id_header or 0, last_event_id or 0)
    if after > job.last_event_id:
        # Event ids only grow, one at a time: a cursor past the last one was never
        # given out by this server (another server's, or a replaced data dir). Said at
        # once, rather than keep-alives until the job ends and nothing ever arrives.
        raise PastLastEvent(job.id, after, job.last_event_id)
    service, limit = studio.service, studio.settings.max_streams_per_job
    if not service.open_reader(job.id, limit):
        return JSONResponse(
            {
                "detail": f"job {job.id} has {limit} open streams, this server's limit per job; try again shortly"
                f" (or poll GET /train/status/{job.id}). The operator sets the limit with"
                " FINETUNE_STUDIO_MAX_STREAMS_PER_JOB"
            },
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(_STREAM_RETRY_SECONDS)},
        )
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return BoundedEventStream(
        service.stream(job.id, after),
        stall_seconds=studio.settings.stream_stall_seconds,
        on_close=lambda: service.close_reader(job.id),
        headers=headers,
    )


@router.post("/stop/{job_id}", responses={**_NOT_FOUND, status.HTTP_409_CONFLICT: {"description": "The job has finished"}})
async def stop_training(job: JobDep, studio: StudioDep) -> TrainingStatus:
    """Stop a job: a queued one at once; a running one after its current step, saving what it trained."""
    return await studio.supervisor.stop_job(job.id)


@router.get("/jobs")
async def list_jobs(studio: StudioDep) -> JobList:
    """Every job's current status, newest first."""
    positions = studio.supervisor.queue_positions()
    # A training job's summary so far is read here (one query); a finished job's is stored.
    data = [
        studio.service.status_of(job, positions.get(job.id), with_summary=True) for job in studio.service.store.list_jobs()
    ]
    return JobList(data=data, count=len(data))
