"""OpenAI's Files API over the one file store (docs/API.md, Files): POST /v1/files
(multipart: `file`, `purpose`), GET /v1/files, GET /v1/files/{id}, GET
/v1/files/{id}/content, DELETE /v1/files/{id}.

An upload reaches the route already spooled by Starlette's multipart parser (to a
temporary file past 1 MiB, written off the event loop); `receive_upload` copies it
into the store, checks it and renames it into place in a worker thread, so a large
file never holds the loop. The page's uploads call `receive_upload` too (purpose
`studio`).
"""

from __future__ import annotations

import asyncio
from pathlib import PurePath
from typing import Annotated, Literal, Optional

from fastapi import APIRouter, File, Form, Request, UploadFile, status
from fastapi.responses import FileResponse
from starlette.datastructures import FormData

from finetune_studio.api.accounts import AuthorizedRoute
from finetune_studio.api.deps import PageLimit, Responses, Studio, StudioDep
from finetune_studio.api.ranges import FileDownload
from finetune_studio.bounds import MAX_PAGE_ITEMS
from finetune_studio.errors import InvalidFile
from finetune_studio.files.checks import PURPOSES
from finetune_studio.files.store import StoredFile
from finetune_studio.jobs.accounts import seen_owner
from finetune_studio.openai_wire import ErrorResponse, FileDeleted, FileList, FileObject

router = APIRouter(prefix="/v1/files", tags=["openai"], route_class=AuthorizedRoute)
_ERRORS: Responses = {
    status.HTTP_400_BAD_REQUEST: {"model": ErrorResponse, "description": "The file does not fit its purpose; the message names its bad lines"},
    status.HTTP_404_NOT_FOUND: {"model": ErrorResponse, "description": "No file has this id"},
    status.HTTP_413_CONTENT_TOO_LARGE: {"model": ErrorResponse, "description": "The file is over max_file_bytes"},
}
_STORAGE: Responses = {
    status.HTTP_503_SERVICE_UNAVAILABLE: {"model": ErrorResponse, "description": "The data directory cannot be written"},
    507: {"model": ErrorResponse, "description": "The disk is full: the message says what to free (x-should-retry: false)"},
}
# The longest name a file is kept under (a file name's limit on Linux), and the longest
# suffix kept whole when a name is cut to it.
MAX_FILENAME_CHARS = 255
MAX_SUFFIX_CHARS = 16


async def receive_upload(studio: Studio, upload: UploadFile, purpose: str) -> StoredFile:
    """Store an upload for `purpose` (`fine-tune` or `studio`), checked: the Python API
    for any route that takes a file. InvalidFile (400) names what is wrong; a file over
    the limit is FileTooLarge (413); a write the data dir cannot take is StorageFailed
    (507 for a full disk), and leaves nothing of the file behind."""
    if purpose not in PURPOSES:
        raise InvalidFile(
            f"purpose {purpose!r} is not one this server keeps files for: use \"fine-tune\" (OpenAI's chat or"
            " preference JSONL, for /v1/fine_tuning/jobs) or \"studio\" (a dataset file the studio reads)",
            param="purpose",
        )
    filename = stored_filename(upload.filename)
    files = studio.files
    # The file store writes the data dir: its failures count for /health as the job store's do.
    with studio.service.store.health.writing():
        ingested = await asyncio.to_thread(files.ingest, upload.file, filename, purpose, studio.settings.max_file_bytes)
        return files.record(ingested)


def stored_filename(given: Optional[str]) -> str:
    """The name an upload is kept under: no folder separators, at most MAX_FILENAME_CHARS
    characters. A longer name loses the end of its stem, never its suffix (which says
    what the file is: `.jsonl`), so the suffix is checked as it was sent."""
    name = (given or "upload.jsonl").replace("/", "_").replace("\\", "_")
    if len(name) <= MAX_FILENAME_CHARS:
        return name
    suffix = PurePath(name).suffix
    if len(suffix) > MAX_SUFFIX_CHARS:  # no suffix the studio knows: cut like any other text
        suffix = ""
    return name[: MAX_FILENAME_CHARS - len(suffix)] + suffix


def refuse_repeated_fields(form: FormData, fields: tuple[str, ...]) -> None:
    """A form with two parts of one name (two `file` parts): which one was meant cannot be
    known, so neither is taken (a multipart parser keeps the last one, silently)."""
    for field in fields:
        count = len(form.getlist(field))
        if count > 1:
            raise InvalidFile(
                f"the form has {count} {field!r} parts; an upload takes one {field!r} (send one file per request)",
                param=field,
            )


def file_object(stored: StoredFile) -> FileObject:
    return FileObject(
        id=stored.id, bytes=stored.bytes, created_at=int(stored.created_at), filename=stored.filename, purpose=stored.purpose,
        path=str(stored.path) if stored.purpose == "studio" else None,  # the page names it in local_datasets
    )


@router.post("", responses={**_ERRORS, **_STORAGE})
async def upload_file(
    request: Request,
    studio: StudioDep,
    file: Annotated[UploadFile, File(description="The file: JSONL in OpenAI's chat or preference format for fine-tune")],
    purpose: Annotated[str, Form(description='"fine-tune" (OpenAI\'s formats, checked line by line) or "studio"')],
) -> FileObject:
    """Upload a file. A `fine-tune` file is checked at once: a bad line is a 400 naming it."""
    try:
        refuse_repeated_fields(await request.form(), ("file", "purpose"))  # the form FastAPI parsed, cached
        return file_object(await receive_upload(studio, file, purpose))
    finally:
        await file.close()


@router.get("", responses=_ERRORS)
async def list_files(
    studio: StudioDep,
    purpose: Optional[str] = None,
    after: Optional[str] = None,
    limit: PageLimit = MAX_PAGE_ITEMS,
    order: Literal["asc", "desc"] = "desc",
) -> FileList:
    """The stored files, newest first (or oldest first with `order=asc`), `limit` a page, after the file `after`."""
    page, more = studio.files.list(purpose=purpose, after=after, limit=limit, newest_first=order == "desc", owner=seen_owner())
    data = [file_object(stored) for stored in page]
    return FileList(data=data, has_more=more, first_id=data[0].id if data else None, last_id=data[-1].id if data else None)


@router.get("/{file_id}", responses=_ERRORS)
async def retrieve_file(file_id: str, studio: StudioDep) -> FileObject:
    return file_object(studio.files.get(file_id))


@router.get("/{file_id}/content", response_class=FileResponse, responses=_ERRORS)
async def file_content(file_id: str, studio: StudioDep) -> FileResponse:
    """The file's bytes, as uploaded (HTTP Range honoured; a malformed Range is ignored, as HTTP says)."""
    stored = studio.files.get(file_id)
    return FileDownload(stored.path, filename=stored.filename, media_type="application/octet-stream")


@router.delete("/{file_id}", responses={**_ERRORS, **_STORAGE})
async def delete_file(file_id: str, studio: StudioDep) -> FileDeleted:
    """Remove the file. A job already queued with it fails when it starts, saying the file is gone."""
    with studio.service.store.health.writing():
        return FileDeleted(id=studio.files.delete(file_id).id)
