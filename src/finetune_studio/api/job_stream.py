"""One job's event stream and polled status as HTTP answers, for every kind of job
(/train, /export and /eval: status and stream, added to each router by `add_status_and_stream`).

The events, their ids and their replay live in `JobService.stream`; this module
turns a stream request into the answer: a cursor from `Last-Event-ID` (header or
query), a 416 for a cursor past the job's last event, a 503 when the job has as
many streams open as the server allows, else a `BoundedEventStream`. A status
poll (`status_answer`) is answered from the stored JSON.
"""

from __future__ import annotations

from typing import Annotated, Optional

from fastapi import APIRouter, Header, Path, Query, Request, Response, status
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from finetune_studio.api.deps import ParamInt, Responses, Studio, StudioDep, studio_of
from finetune_studio.api.streaming import BoundedEventStream
from finetune_studio.bounds import MAX_SQL_INTEGER
from finetune_studio.errors import PastLastEvent
from finetune_studio.jobs.phases import JobKind
from finetune_studio.jobs.store import JobRecord

# Event ids are SQLite integers: a larger cursor is refused (422) rather than overflowing.
MAX_EVENT_ID = MAX_SQL_INTEGER
STREAM_RETRY_SECONDS = 5
# A stream route's two cursors, the header a reconnecting EventSource sends and the query a
# client that cannot set headers uses; `open_event_stream` resumes after the larger.
LastEventIdHeader = Annotated[Optional[ParamInt], Header(alias="Last-Event-ID", ge=0, le=MAX_EVENT_ID)]
LastEventIdQuery = Annotated[Optional[ParamInt], Query(ge=0, le=MAX_EVENT_ID, description="Resume after this event id")]

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


def stream_responses(description: str, not_found: Responses) -> Responses:
    """A stream route's documented answers: its items (`description` says what each
    event's data is), then `not_found`, a cursor past the end (416) and a full job (503)."""
    return {**_stream_items(description), **not_found, **_PAST_END, **_FULL}


def _stream_items(description: str) -> Responses:
    """The stream's items, for the OpenAPI document (the route returns its own
    EventSourceResponse of pre-encoded bytes, so FastAPI cannot derive them)."""
    return {
        status.HTTP_200_OK: {
            "description": description,
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


def open_event_stream(
    job: JobRecord, studio: Studio, header_cursor: Optional[int], query_cursor: Optional[int], status_path: str
) -> Response:
    """The job's events after the larger of the two cursors, live until its terminal
    status; `status_path` is where a refused client may poll instead."""
    after = max(header_cursor or 0, query_cursor or 0)
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
                f" (or poll GET {status_path}). The operator sets the limit with"
                " FINETUNE_STUDIO_MAX_STREAMS_PER_JOB"
            },
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(STREAM_RETRY_SECONDS)},
        )
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return BoundedEventStream(
        service.stream(job.id, after),
        stall_seconds=studio.settings.stream_stall_seconds,
        on_close=lambda: service.close_reader(job.id),
        headers=headers,
    )


def status_answer(studio: Studio, job_id: str, kind: JobKind) -> Response:
    """The job's current status, for polling; a job of another kind is not found."""
    # The pollers' hot path: no dependency to solve, and the status JSON as stored
    # (it was validated when written); only a queued job's answer is built, to add
    # its place in the queue.
    service = studio.service
    phase, status_json = service.store.status_json(job_id, kind=kind)
    if phase == "idle":
        job = service.store.get_job(job_id)
        position = studio.supervisor.queue_positions(kind).get(job_id)
        if kind == "export":
            status_json = service.export_status_of(job, position).model_dump_json()
        elif kind == "eval":
            status_json = service.eval_status_of(job, position).model_dump_json()
        else:
            status_json = service.status_of(job, position).model_dump_json()
    elif kind == "train" and phase == "completed" and '"eval_id"' in status_json:
        # eval_after's evaluation is joined when read (jobs/evaluations.py).
        status_json = service.status_of(service.store.get_job(job_id)).model_dump_json()
    return Response(status_json, media_type="application/json")


def add_status_and_stream(
    router: APIRouter, kind: JobKind, id_name: str, noun: str, models: tuple[type[BaseModel], type[BaseModel]],
    not_found: Responses, stream_doc: str,
) -> None:
    """A kind's two routes on its router, as every kind has them: `GET {prefix}/status/{id}`
    (`status_answer`, the pollers' path) and `GET {prefix}/stream/{id}` (`open_event_stream`).
    `id_name` names the path parameter, `noun` the object in the status route's doc, `models`
    its status and progress, and the operations are `<name>_status` and `<name>_stream`,
    `<name>` the status model's name less "Status"."""
    status_path = f"{router.prefix}/status"
    name = models[0].__name__.removesuffix("Status").lower()

    async def read_status(request: Request, job_id: str = Path(alias=id_name)) -> Response:
        return status_answer(studio_of(request), job_id, kind)

    async def read_stream(
        studio: StudioDep,
        job_id: str = Path(alias=id_name),
        last_event_id_header: LastEventIdHeader = None,
        last_event_id: LastEventIdQuery = None,
    ) -> Response:
        job = studio.service.store.get_job(job_id, kind=kind)  # another kind's id is not found
        return open_event_stream(job, studio, last_event_id_header, last_event_id, f"{status_path}/{job.id}")

    router.add_api_route(
        f"/status/{{{id_name}}}", read_status, methods=["GET"], name=f"{name}_status",
        description=f"The {noun}'s current phase (for polling).", response_model=models[0], responses=not_found,
    )
    events = " and ".join(f"`{event}` ({_a(model.__name__)})" for event, model in zip(("status", "progress"), models, strict=True))
    router.add_api_route(
        f"/stream/{{{id_name}}}", read_stream, methods=["GET"], name=f"{name}_stream", description=stream_doc,
        response_class=StreamingResponse, responses=stream_responses(f"Server-Sent Events: {events}", not_found),
    )


def _a(name: str) -> str:
    return f"an {name}" if name[0] in "AEIOU" else f"a {name}"
