"""The routes' dependencies: the studio (settings, job service, supervisor, inference, files) and the job;
and `Responses`, the type of a route's documented answers.

Both are `async def`, so they run on the event loop like the routes: the SQLite
store is used from that one thread only (a plain `def` would run in a thread pool,
next to the loop's own use of the connection). Each route takes the one `Studio`
rather than three separate dependencies: FastAPI spends tens of microseconds per
dependency per request. The polling route, the hottest, takes the `Request` and
calls `studio_of` itself, which costs nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Union

from fastapi import Depends, Query, Request
from pydantic import BeforeValidator

from finetune_studio.bounds import MAX_PAGE_ITEMS
from finetune_studio.config import Settings
from finetune_studio.files.store import FileStore
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobRecord
from finetune_studio.supervisor.inference import InferenceManager
from finetune_studio.supervisor.supervisor import Supervisor

# Documented answers of a route, as FastAPI's `responses` takes them.
Responses = dict[Union[int, str], dict[str, Any]]
# An integer as a query, header or path parameter's text must spell it: decimal digits, a minus
# before them at most (the range then refuses it), no leading zero. Pydantic's lax parsing would
# also take " 1", "+1", "1_000", "1.0" and "01", which the published schema (type integer) forbids.
DECIMAL_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")


def _decimal_integer(value: Any) -> Any:
    if isinstance(value, str) and not DECIMAL_INTEGER.fullmatch(value):
        raise ValueError("must be an integer in decimal digits, such as 20 (no plus sign, spaces, point, underscore or leading zero)")
    return value


# Every integer parameter of a route is one of these, never a bare `int`.
ParamInt = Annotated[int, BeforeValidator(_decimal_integer)]
# A list route's page size (`limit: PageLimit = 20`): one bound for every list (bounds.py).
PageLimit = Annotated[ParamInt, Query(ge=1, le=MAX_PAGE_ITEMS, description=f"How many items a page holds (1 to {MAX_PAGE_ITEMS})")]


@dataclass(frozen=True)
class Studio:
    """What the routes work with, made once by the app's lifespan."""

    settings: Settings
    service: JobService
    supervisor: Supervisor
    inference: InferenceManager
    files: FileStore  # the one file store: /v1/files and the page's uploads


def studio_of(request: Request) -> Studio:
    return request.app.state.studio  # type: ignore[no-any-return]


async def _studio(request: Request) -> Studio:
    return studio_of(request)


StudioDep = Annotated[Studio, Depends(_studio)]


async def _job(job_id: str, studio: StudioDep) -> JobRecord:
    return studio.service.store.get_job(job_id, kind="train")  # JobNotFound -> 404 (an export's id too)


JobDep = Annotated[JobRecord, Depends(_job)]


async def _export(export_id: str, studio: StudioDep) -> JobRecord:
    return studio.service.store.get_job(export_id, kind="export")  # a training job's id is no export: 404


ExportDep = Annotated[JobRecord, Depends(_export)]
