"""The export routes (docs/API.md, Export): start, status, stream, stop, jobs, download.

An export is a job of kind `export` (jobs/phases.py): it is queued, run in its own
child (`python -m finetune_studio.export.child`, from its own pool of slots), and
streamed with the same events, ids and replay as a training job. Its files live in
`<data dir>/exports/<export id>/`; only those a completed export lists in
`details.files` can be downloaded, so a half-written file never is.
"""

from __future__ import annotations

import base64
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Optional

from fastapi import APIRouter, Query, Response, status
from fastapi.responses import FileResponse, JSONResponse

from finetune_studio import llama_build
from finetune_studio.api.accounts import AuthorizedRoute
from finetune_studio.api.deps import ExportDep, Responses, StudioDep
from finetune_studio.api.job_stream import (
    add_status_and_stream,
)
from finetune_studio.api.ranges import FileDownload
from finetune_studio.errors import JobNotFound
from finetune_studio.export.tools import tools_problem
from finetune_studio.jobs.accounts import seen_owner
from finetune_studio.jobs.phases import has_result
from finetune_studio.jobs.store import JobRecord
from finetune_studio.schemas import (
    ErrorCode,
    ExportFile,
    ExportJobResponse,
    ExportList,
    ExportProgress,
    ExportStartRequest,
    ExportStatus,
)
from finetune_studio.wire import GGUF_INSTALL, JobFolder

router = APIRouter(prefix="/export", tags=["export"], route_class=AuthorizedRoute)

_NOT_FOUND: Responses = {status.HTTP_404_NOT_FOUND: {"description": "No export has this id"}}
_REFUSED: Responses = {
    status.HTTP_400_BAD_REQUEST: {
        "model": ExportJobResponse,
        "description": "The export cannot run here (llama.cpp's tools missing, and no build of them under way:"
        " `export_tools_missing`; a format the job's result cannot take)",
    },
    status.HTTP_404_NOT_FOUND: {"model": ExportJobResponse, "description": "No training job has this id"},
    status.HTTP_409_CONFLICT: {"model": ExportJobResponse, "description": "The training job has no result to export (yet)"},
    status.HTTP_429_TOO_MANY_REQUESTS: {"model": ExportJobResponse, "description": "The export queue is full"},
}


def gguf_tools_problem() -> Optional[str]:
    """Why a GGUF export cannot run on this machine (llama.cpp's tools are missing), or None.

    Looked up without loading llama.cpp (`export.tools` reads package metadata and
    files only); the export child loads it, and says what it lacks if this was not enough.
    """
    problem = tools_problem()
    if problem is None:
        return None
    return (
        f"GGUF exports use llama.cpp's own converter and quantizer, which this server cannot find: {problem}"
        f" ({GGUF_INSTALL} builds llama.cpp once, which takes a few minutes; then restart the server.)"
        " A merged_16bit export needs none of it"
    )


def _refused(code: int, text: str, error_code: Optional[ErrorCode] = None) -> JSONResponse:
    body = ExportJobResponse(
        export_id="", status="error", message="The export was not started", error=text, error_code=error_code
    )
    return JSONResponse(body.model_dump(exclude_none=True), status_code=code)


def _result_problem(job: JobRecord) -> Optional[str]:
    """Why the training job has nothing to export, or None when it has an adapter or model."""
    saved = JobFolder(Path(job.output_dir)).outputs()
    if has_result(job.phase, saved):
        if not saved:
            return f"job {job.id} completed, but its result ({job.output_dir}/adapter or /model) is no longer on disk"
        if not JobFolder(Path(job.output_dir)).job_file.is_file():
            return f"job {job.id} has no {JobFolder(Path(job.output_dir)).job_file} (what it trained from): it cannot be exported"
        return None
    also = " (a job stopped after it saved its adapter or model can be exported too)"
    if job.phase == "stopped":
        return f"job {job.id} was stopped before it saved an adapter or model: there is nothing to export"
    if job.phase == "error":
        return f"job {job.id} ended in error and saved no result to export; only a completed job can be exported{also}"
    return (
        f"job {job.id} is {job.phase}: only a completed job can be exported{also}; watch GET /train/status/{job.id}"
        " and start the export once it has completed"
    )


@router.post("/start", responses=_REFUSED)
async def start_export(request: ExportStartRequest, studio: StudioDep) -> Response:
    """Queue an export of a training job's result. It runs in its own slot, beside training."""
    try:
        job = studio.service.store.get_visible(request.job_id, kind="train")
    except JobNotFound:
        return _refused(status.HTTP_404_NOT_FOUND, f"no training job with id {request.job_id!r} (GET /train/jobs lists them)")
    problem = _result_problem(job)
    if problem:
        return _refused(status.HTTP_409_CONFLICT, problem)
    has_adapter = "adapter_dir" in JobFolder(Path(job.output_dir)).outputs()
    if request.format == "lora_gguf" and not has_adapter:
        return _refused(
            status.HTTP_400_BAD_REQUEST,
            f"job {job.id} was a full fine-tuning: it has no adapter to export as lora_gguf. Export its model with"
            " format gguf or merged_16bit",
            "config_invalid",
        )
    # While llama.cpp's build runs in the background (scripts/demo.sh starts it), a GGUF
    # export is taken and waits queued for it (the supervisor holds it: llama_build.py).
    build: Optional[llama_build.LlamaBuild] = None
    if request.format in ("gguf", "lora_gguf"):
        missing = gguf_tools_problem()
        if missing:
            build = llama_build.probe()
            if not build.running:
                return _refused(status.HTTP_400_BAD_REQUEST, missing + build.note(), "export_tools_missing")
    queued = len(studio.supervisor.queue_positions("export"))
    if queued >= studio.settings.max_queued_jobs:
        return _refused(
            status.HTTP_429_TOO_MANY_REQUESTS,
            f"{queued} exports are waiting, this server's limit (FINETUNE_STUDIO_MAX_QUEUED_JOBS); try again once some have run",
        )
    quantizations = request.quantizations()
    # Stored whole: it is what the export child gets (wire.WorkerSpec.request), and holds no secret.
    stored: dict[str, Any] = {**request.model_dump(), "source_dir": job.output_dir, "quantizations": quantizations}
    details: dict[str, Any] = {"format": request.format, "quantizations": quantizations}
    message = "Queued"
    if build is not None:
        stored[llama_build.WAITS_FOR_BUILD] = True
        details.update(build.details())
        message = build.waiting_message()
    export = studio.service.create_job(stored, message=message, details=details, kind="export")
    studio.supervisor.submit(export.id, {})
    what = request.format + (f" ({', '.join(quantizations)})" if quantizations else "")
    answer = f"Export {export.id} of job {job.id} as {what} queued at position {queued + 1}"
    if build is not None:
        answer += f"; it waits for llama.cpp's build in the background to finish{f' (log: {build.log})' if build.log else ''}"
    return JSONResponse(
        ExportJobResponse(export_id=export.id, status="queued", message=answer).model_dump(exclude_none=True)
    )


add_status_and_stream(
    router, "export", "export_id", "export", (ExportStatus, ExportProgress), _NOT_FOUND,
    "Every status and progress event of the export as Server-Sent Events, exactly as GET /train/stream/{id} sends a"
    " training job's: replay after `Last-Event-ID`, live until the terminal status, keep-alive comments while nothing"
    " happens.",
)


@router.post("/stop/{export_id}", responses={**_NOT_FOUND, status.HTTP_409_CONFLICT: {"description": "The export has finished"}})
async def stop_export(export: ExportDep, studio: StudioDep) -> ExportStatus:
    """Stop an export: a queued one at once; a running one ends `stopped`, its unfinished files removed."""
    return await studio.supervisor.stop_export(export.id)


@router.get("/jobs")
async def list_exports(
    studio: StudioDep,
    job_id: Annotated[Optional[str], Query(description="Only the exports of this training job")] = None,
) -> ExportList:
    """Every export's current status, newest first."""
    positions = studio.supervisor.queue_positions("export")
    exports = studio.service.store.list_jobs(kind="export", exported_job=job_id, owner=seen_owner())
    data = [studio.service.export_status_of(job, positions.get(job.id)) for job in exports]
    return ExportList(data=data, count=len(data))


_DOWNLOAD: Responses = {
    status.HTTP_200_OK: {"description": "The file", "content": {"application/octet-stream": {}}},
    status.HTTP_206_PARTIAL_CONTENT: {"description": "The bytes the Range header asked for"},
    status.HTTP_404_NOT_FOUND: {"description": "No such export, or no such file in it"},
    status.HTTP_409_CONFLICT: {"description": "The export has not completed"},
    status.HTTP_416_RANGE_NOT_SATISFIABLE: {"description": "The Range lies beyond the file's end"},
}


def _listed_file(export: JobRecord, name: str) -> Optional[ExportFile]:
    for entry in (export.status.get("details") or {}).get("files") or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return ExportFile.model_validate(entry)
    return None


@router.get("/download/{export_id}/{name:path}", response_class=FileResponse, responses=_DOWNLOAD)
async def download_export_file(export: ExportDep, name: str) -> Response:
    """A file of a completed export, by its name in `details.files`. HTTP Range is
    honoured (206 with Content-Range; 416 past the end; a malformed Range is ignored,
    as HTTP says: 200 with the whole file), so a large download resumes;
    `Repr-Digest` carries the file's SHA-256."""
    if export.phase != "completed":
        return JSONResponse(
            {"detail": f"export {export.id} is {export.phase}: its files can be downloaded once it has completed"},
            status_code=status.HTTP_409_CONFLICT,
        )
    listed = _listed_file(export, name)
    parts = PurePosixPath(name).parts
    if listed is None or name.startswith("/") or ".." in parts:
        names = [entry.get("name") for entry in (export.status.get("details") or {}).get("files") or [] if isinstance(entry, dict)]
        return JSONResponse(
            {"detail": f"export {export.id} has no file {name!r}; its files: {', '.join(map(str, names)) or 'none'}"},
            status_code=status.HTTP_404_NOT_FOUND,
        )
    folder = Path(export.output_dir).resolve()
    path = (folder / name).resolve()
    if not path.is_relative_to(folder) or not path.is_file():
        return JSONResponse(
            {"detail": f"the file {name!r} of export {export.id} is no longer on disk ({folder}); export again"},
            status_code=status.HTTP_404_NOT_FOUND,
        )
    headers = {}
    try:
        headers["Repr-Digest"] = f"sha-256=:{base64.b64encode(bytes.fromhex(listed.sha256)).decode()}:"
    except ValueError:
        pass  # a child that listed no proper digest: the file is still served
    return FileDownload(path, filename=PurePosixPath(name).name, media_type="application/octet-stream", headers=headers)
