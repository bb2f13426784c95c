"""OpenAI's fine-tuning jobs API (docs/API.md, Fine-tuning jobs) over the server's training jobs:
create, list, retrieve, cancel, pause, resume, events, checkpoints.

A job created here is queued through the same admission and queue as
`POST /train/start` (`train.queue_training`), so `/train/*`, the page and the CLI
see it; every training job, however it was started, is listed here. The mapping
between the two faces lives in api/openai_jobs.py.
"""

from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, status

from finetune_studio.api.accounts import AuthorizedRoute
from finetune_studio.api.deps import JobDep, PageLimit, Responses, StudioDep
from finetune_studio.api.openai_jobs import job_checkpoints, job_events, job_object, training_request
from finetune_studio.api.routes.train import queue_training
from finetune_studio.errors import InvalidChatRequest
from finetune_studio.jobs.accounts import seen_owner
from finetune_studio.openai_wire import (
    ErrorResponse,
    FineTuningJob,
    FineTuningJobCheckpointList,
    FineTuningJobEventList,
    FineTuningJobList,
    FineTuningJobRequest,
)
from finetune_studio.schemas import OPENAI_JOB

router = APIRouter(prefix="/v1/fine_tuning", tags=["openai"], route_class=AuthorizedRoute)
_ERRORS: Responses = {
    status.HTTP_400_BAD_REQUEST: {"model": ErrorResponse, "description": "A bad parameter; `error.param` names it"},
    status.HTTP_404_NOT_FOUND: {"model": ErrorResponse, "description": "No job has this id"},
    status.HTTP_409_CONFLICT: {"model": ErrorResponse, "description": "The job is not in a state that allows this"},
}


@router.post("/jobs", responses=_ERRORS)
async def create_job(body: FineTuningJobRequest, studio: StudioDep) -> FineTuningJob:
    """Create a fine-tuning job from uploaded files. `model` is a local model folder, a .gguf file or a hub id."""
    request, extra = training_request(body, studio.files)
    job = queue_training(studio, request, {OPENAI_JOB: extra})
    return job_object(job)


@router.get("/jobs", responses=_ERRORS)
async def list_jobs(studio: StudioDep, after: Optional[str] = None, limit: PageLimit = 20) -> FineTuningJobList:
    """Every training job, newest first; `after` a job id, `has_more` whether older ones follow."""
    jobs = studio.service.store.list_jobs(owner=seen_owner())
    if after is not None:
        index = next((i for i, job in enumerate(jobs) if job.id == after), None)
        if index is None:
            raise InvalidChatRequest(f"after: no fine-tuning job with id {after!r}", param="after")
        jobs = jobs[index + 1 :]
    return FineTuningJobList(data=[job_object(job) for job in jobs[:limit]], has_more=len(jobs) > limit)


@router.get("/jobs/{job_id}", responses=_ERRORS)
async def retrieve_job(job: JobDep) -> FineTuningJob:
    return job_object(job)


@router.post("/jobs/{job_id}/cancel", responses=_ERRORS)
async def cancel_job(job: JobDep, studio: StudioDep) -> FineTuningJob:
    """Cancel: a queued job at once; a running one after its current step (it ends `cancelled`)."""
    await studio.supervisor.stop_job(job.id)
    return job_object(studio.service.store.get_job(job.id))


@router.post("/jobs/{job_id}/pause", responses=_ERRORS)
async def pause_job(job: JobDep, studio: StudioDep) -> FineTuningJob:
    """Pause: the job finishes its step, saves a checkpoint and frees the machine (`paused`)."""
    await studio.supervisor.pause_job(job.id)
    return job_object(studio.service.store.get_job(job.id))


@router.post("/jobs/{job_id}/resume", responses=_ERRORS)
async def resume_job(job: JobDep, studio: StudioDep) -> FineTuningJob:
    """Resume a paused job: the same job queues again and continues from its checkpoint."""
    studio.supervisor.resume_job(job.id)
    return job_object(studio.service.store.get_job(job.id))


@router.get("/jobs/{job_id}/events", responses=_ERRORS)
async def list_events(job: JobDep, studio: StudioDep, after: Optional[str] = None, limit: PageLimit = 20) -> FineTuningJobEventList:
    """The job's events, newest first: messages from its status changes, `metrics` from its steps."""
    events, more = job_events(studio.service.store, job, after, limit)
    return FineTuningJobEventList(data=events, has_more=more)


@router.get("/jobs/{job_id}/checkpoints", responses=_ERRORS)
async def list_checkpoints(
    job: JobDep, studio: StudioDep, after: Optional[str] = None, limit: PageLimit = 10
) -> FineTuningJobCheckpointList:
    """The checkpoint at each epoch's end (the final one included) and one a pause saved, newest first; each is a chat model."""
    checkpoints, more = job_checkpoints(studio.service.store, job, after, limit)
    return FineTuningJobCheckpointList(
        data=checkpoints,
        has_more=more,
        first_id=checkpoints[0].id if checkpoints else None,
        last_id=checkpoints[-1].id if checkpoints else None,
    )
