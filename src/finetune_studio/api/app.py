"""create_app(settings): the FastAPI application, its life cycle and error mapping."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Optional

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from finetune_studio import __version__
from finetune_studio.api.deps import require_token
from finetune_studio.api.routes import health, train
from finetune_studio.config import Settings
from finetune_studio.errors import StartRefused, StudioError
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobStore
from finetune_studio.worker.launcher import LocalProcessLauncher, WorkerLauncher
from finetune_studio.worker.supervisor import Supervisor

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
log = logging.getLogger("finetune_studio")


def create_app(settings: Settings, launcher: Optional[WorkerLauncher] = None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.jobs_dir.mkdir(parents=True, exist_ok=True)
        store = JobStore(settings.db_path)
        service = JobService(store, settings.jobs_dir)
        supervisor = Supervisor(service, launcher or LocalProcessLauncher(settings.worker_python), settings)
        app.state.settings = settings
        app.state.service = service
        app.state.supervisor = supervisor
        await supervisor.start()
        try:
            yield
        finally:
            await supervisor.shutdown()
            store.close()

    app = FastAPI(
        title="finetune-studio",
        version=__version__,
        summary="Fine-tune language models: queue jobs, stream every step.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.include_router(health.router)
    app.include_router(train.router, dependencies=[Depends(require_token)])

    @app.exception_handler(StudioError)
    async def studio_error(request: Request, exc: StudioError) -> JSONResponse:
        if isinstance(exc, StartRefused):
            body = {"job_id": "", "status": "error", "message": "The job was not started", "error": str(exc)}
            return JSONResponse(body, status_code=exc.status_code)
        return JSONResponse({"detail": str(exc)}, status_code=exc.status_code)

    if WEB_DIR.is_dir():
        # The UI's files hold no data; its API calls carry the token.
        app.mount("/", StaticFiles(directory=WEB_DIR, html=True), name="web")
    return app
