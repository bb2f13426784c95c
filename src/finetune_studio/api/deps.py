"""Dependency aliases for the routes: the service, the supervisor, the settings, the job.

Every dependency is `async def`, so it runs on the event loop like the routes: the
SQLite store is used from that one thread only (a plain `def` would run in a
thread pool, next to the loop's own use of the connection).
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from finetune_studio.config import Settings
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobRecord
from finetune_studio.worker.supervisor import Supervisor


async def _settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


async def _service(request: Request) -> JobService:
    return request.app.state.service  # type: ignore[no-any-return]


async def _supervisor(request: Request) -> Supervisor:
    return request.app.state.supervisor  # type: ignore[no-any-return]


SettingsDep = Annotated[Settings, Depends(_settings)]
ServiceDep = Annotated[JobService, Depends(_service)]
SupervisorDep = Annotated[Supervisor, Depends(_supervisor)]


async def _job(job_id: str, service: ServiceDep) -> JobRecord:
    return service.store.get_job(job_id)  # JobNotFound -> 404


JobDep = Annotated[JobRecord, Depends(_job)]


async def require_token(request: Request, settings: SettingsDep) -> None:
    """When a token is configured, every API route wants `Authorization: Bearer <token>`."""
    if settings.token is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    expected = settings.token.get_secret_value().encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong API token: send Authorization: Bearer <FINETUNE_STUDIO_TOKEN>",
            headers={"WWW-Authenticate": "Bearer"},
        )
