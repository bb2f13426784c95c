"""The training routes (docs/API.md, Training jobs): start, status, progress, stream, stop, jobs;
and one job's request (GET), rename (PATCH) and delete (DELETE) under /train/jobs/{id}."""

from __future__ import annotations

import asyncio
from typing import Any, Optional, Union

from fastapi import APIRouter, Response, status
from pydantic import BaseModel, ConfigDict, Field

from finetune_studio.api.accounts import AuthorizedRoute
from finetune_studio.api.admission import check_start
from finetune_studio.api.deps import JobDep, Responses, Studio, StudioDep
from finetune_studio.api.job_stream import (
    add_status_and_stream,
)
from finetune_studio.api.routes.evaluation import check_suites
from finetune_studio.errors import JobNotFinished, JobNotFound, QueueFull, StartRefused, StorageFailed
from finetune_studio.jobs.accounts import acting_owner, seen_owner
from finetune_studio.jobs.phases import is_terminal
from finetune_studio.jobs.store import JobRecord
from finetune_studio.paths import is_local
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

router = APIRouter(prefix="/train", tags=["train"], route_class=AuthorizedRoute)

_REFUSED: Responses = {
    status.HTTP_400_BAD_REQUEST: {"model": TrainingJobResponse, "description": "The server cannot take this request"},
    status.HTTP_403_FORBIDDEN: {"model": TrainingJobResponse, "description": "A path lies outside the allowed folders"},
    status.HTTP_413_CONTENT_TOO_LARGE: {"description": "The request body is over the server's limit"},
    status.HTTP_429_TOO_MANY_REQUESTS: {"model": TrainingJobResponse, "description": "The queue is full"},
}
_NOT_FOUND: Responses = {status.HTTP_404_NOT_FOUND: {"description": "No job has this id"}}


@router.post("/start", responses=_REFUSED)
async def start_training(request: TrainingStartRequest, studio: StudioDep) -> TrainingJobResponse:
    """Queue a training job. It runs when the jobs before it have finished."""
    queued = len(studio.supervisor.queue_positions())
    job = queue_training(studio, request)
    return TrainingJobResponse(job_id=job.id, status="queued", message=f"Job {job.id} queued at position {queued + 1}")


def queue_training(studio: Studio, request: TrainingStartRequest, extra: Optional[dict[str, Any]] = None) -> JobRecord:
    """Admit a training request and queue it: the one way a training job is created
    (POST /train/start; POST /v1/fine_tuning/jobs, which keeps OpenAI's own fields in
    `extra`, stored beside the request's)."""
    service, supervisor = studio.service, studio.supervisor
    check_start(request, studio.settings, queued=len(supervisor.queue_positions()))
    check_owner_limits(studio, request)
    if request.eval_after:  # the evaluation it queues when it completes: its files and judge, checked now
        check_suites(request.eval_after, studio.settings, service.store, prefix="eval_after")
    stored = request.redacted()
    secrets = {name: value for name in SECRET_FIELDS if (value := getattr(request, name))}
    stored[WITHHELD_SECRETS] = sorted(secrets)
    warning = request.ignored_fields_warning()
    stored[QUEUED_WARNINGS] = [warning] if warning else []
    stored.update(extra or {})
    details: dict[str, Any] = {"model_name": request.model_name, "project_name": request.project_name}
    if warning:
        details["warnings"] = [warning]
    job = service.create_job(stored, message="Queued", details=details)
    supervisor.submit(job.id, secrets)
    return job


def check_owner_limits(studio: Studio, request: TrainingStartRequest) -> None:
    """With accounts on: a user's queued jobs stay within max_queued_jobs_per_user, and a job
    resumes only from a checkpoint of a job its user may see (by id; paths obey the roots)."""
    owner = acting_owner()
    if owner is None:
        return
    limit = studio.settings.max_queued_jobs_per_user
    mine = sum(1 for _, queued_by in studio.service.store.queued_jobs("train") if queued_by == owner)
    if mine >= limit:
        raise QueueFull(f"you have {mine} jobs waiting, the limit per user is {limit} (max_queued_jobs_per_user); try again later")
    resume = request.resume_from_checkpoint
    if resume and not is_local(resume):
        try:
            studio.service.store.get_visible(resume, kind="train")
        except JobNotFound as exc:
            raise StartRefused(f"resume_from_checkpoint: {exc}", field="resume_from_checkpoint") from None


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


_STREAM_DOC = (
    "Every status and progress event of the job as Server-Sent Events"
    " (`event: status|progress`, `data: <JSON>`, `id: <event id>`).\n\n"
    "Replays the events after `Last-Event-ID` (header or query), follows live, and"
    " closes after the terminal status; a comment line comes every 15 s while nothing"
    " happens. A `Last-Event-ID` past the job's last event is a 416 that names the last"
    " event id. Each event is encoded once for all clients, and each client gets all"
    " the events it is behind on in one write (up to 64 KiB). A client that stops"
    " reading is dropped after `stream_stall_seconds` (it reconnects with"
    " Last-Event-ID); a job holds at most `max_streams_per_job` streams (503 beyond)."
)
add_status_and_stream(router, "train", "job_id", "job", (TrainingStatus, TrainingProgress), _NOT_FOUND, _STREAM_DOC)


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
        studio.service.status_of(job, positions.get(job.id), with_summary=True, with_names=True)
        for job in studio.service.store.list_jobs(owner=seen_owner())
    ]
    return JobList(data=data, count=len(data))


class JobDetail(BaseModel):
    """One training job: its current status and the request it was started with."""

    job_id: str
    status: TrainingStatus
    request: dict[str, Any] = Field(
        description="The request as stored: every field of TrainingStartRequest, secrets left out."
    )
    withheld_secrets: list[str] = Field(description="Secrets the request carried, never stored: send them again.")


class JobPatch(BaseModel):
    """What may change in a job once it is queued: its label."""

    model_config = ConfigDict(extra="forbid")

    project_name: Optional[str] = Field(max_length=200, description="The job's label; null or \"\" removes it.")


_TRAIN_JOB: Responses = {**_NOT_FOUND}
_NOT_FINISHED: Responses = {status.HTTP_409_CONFLICT: {"description": "The job is queued or running: stop it first"}}


def _detail(job: JobRecord, studio: Studio) -> JobDetail:
    request = {k: v for k, v in job.request.items() if k not in (WITHHELD_SECRETS, QUEUED_WARNINGS)}
    position = studio.supervisor.queue_positions().get(job.id)
    return JobDetail(
        job_id=job.id,
        status=studio.service.status_of(job, position, with_names=True),
        request=request,
        withheld_secrets=list(job.request.get(WITHHELD_SECRETS) or []),
    )


@router.get("/jobs/{job_id}", responses=_TRAIN_JOB)
async def get_job(job_id: str, studio: StudioDep) -> JobDetail:
    """A training job's status and its full request (to show its settings, or run it again)."""
    return _detail(studio.service.store.get_job(job_id, kind="train"), studio)


@router.patch("/jobs/{job_id}", responses=_TRAIN_JOB)
async def patch_job(job_id: str, patch: JobPatch, studio: StudioDep) -> JobDetail:
    """Rename a job (`project_name`), in any phase."""
    label = patch.project_name.strip() if patch.project_name else None
    return _detail(studio.service.rename(job_id, label), studio)


@router.delete(
    "/jobs/{job_id}", status_code=status.HTTP_204_NO_CONTENT, responses={**_TRAIN_JOB, **_NOT_FINISHED}
)
async def delete_job(job_id: str, studio: StudioDep) -> Response:
    """Delete a finished job: its events, its folder (checkpoints, adapter, logs), its
    exports and their files; chat lets go of its model. 409 while it, or an export of it,
    is queued or running."""
    refuse_while_exporting(studio, studio.service.store.get_job(job_id, kind="train"))
    folders = studio.service.delete_job(job_id)
    # The chat child may hold this job's adapter: it lets go of its models (a later chat loads them again).
    await studio.inference.unload()
    problems = await asyncio.to_thread(studio.service.remove_folders, folders)
    if problems:  # the rows are gone; the files that stay say why (a read-only file system, say): 503, not a bug
        raise StorageFailed(
            "storage_unavailable",
            f"job {job_id} was deleted, but some of its files could not be removed: {'; '.join(problems)}."
            " Remove them by hand once the file system takes writes again",
        )
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def refuse_while_exporting(studio: Studio, job: JobRecord) -> None:
    """A finished job whose export is queued or running cannot be deleted yet: the
    export reads the job's folder. The 409 names the job, and the export that holds it."""
    for export in studio.service.store.list_jobs(kind="export", exported_job=job.id):
        if not is_terminal(export.phase):
            state = "queued" if export.phase == "idle" else f"running ({export.phase})"
            raise JobNotFinished(
                f"job {job.id} cannot be deleted while its export {export.id} is {state}: the export reads the"
                f" job's folder. Stop the export (POST /export/stop/{export.id}) or wait until it has finished,"
                " then delete the job"
            )
