"""create_app(settings): the FastAPI application, its life cycle and error mapping."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import mimetypes
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Mount
from starlette.types import Scope

from finetune_studio import __version__
from finetune_studio.api import openai_errors
from finetune_studio.api.accounts import AccountGuard, Accounts, check_authorized
from finetune_studio.api.auth import TokenGuard, under_prefixes
from finetune_studio.api.body_limit import DeclaredBodyLimit, too_large_body, too_large_upload
from finetune_studio.api.deps import Studio
from finetune_studio.api.metrics import registry as metrics_registry
from finetune_studio.api.origin import CrossSiteGuard, LoopbackHostGuard
from finetune_studio.api.request_scoped import check_request_scoped
from finetune_studio.api.routes import (
    auth,
    chat,
    completions,
    datasets,
    evaluation,
    export,
    files,
    fine_tuning,
    health,
    metrics,
    sweeps,
    system,
    train,
    webhooks,
)
from finetune_studio.api.streaming import StudioApp
from finetune_studio.config import Settings, token_problem
from finetune_studio.errors import (
    StartRefused,
    StorageFailed,
    StudioError,
    SweepRefused,
    UnsafeSettings,
    WebhookRefused,
)
from finetune_studio.failures import chain, storage_fault
from finetune_studio.files.store import FileStore
from finetune_studio.jobs.accounts import server_secret
from finetune_studio.jobs.lock import DataDirLock
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobStore
from finetune_studio.schemas import REDACTED_FIELDS
from finetune_studio.supervisor.inference import INFERENCE_MODULE, InferenceManager, UnloadingLauncher
from finetune_studio.supervisor.inspector import INSPECT_MODULE, Inspector
from finetune_studio.supervisor.launcher import EVAL_MODULE, EXPORT_MODULE, LocalProcessLauncher, WorkerLauncher
from finetune_studio.supervisor.ray_launcher import ray_launcher
from finetune_studio.supervisor.supervisor import Supervisor
from finetune_studio.supervisor.sweeps import SweepManager
from finetune_studio.supervisor.webhooks import WebhookDispatcher
from finetune_studio.text import clean_text
from finetune_studio.wire import DataDir

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
# Every API router, each under a prefix of its own: every path under these wants the
# token when one is set, and the web UI's mount leaves them to the API. A new router
# goes here (and nowhere else), so it cannot be left unguarded.
API_ROUTERS = (
    train.router, chat.router, completions.router, system.router, export.router, datasets.router, files.router, fine_tuning.router,
    evaluation.router, webhooks.router, webhooks.events_router, metrics.router, sweeps.router,
)
API_PREFIXES = tuple(router.prefix + "/" for router in API_ROUTERS)
log = logging.getLogger("finetune_studio")
# What a multipart upload's body may hold beyond its file: the boundaries, the part
# headers and the `purpose` field.
UPLOAD_FORM_BYTES = 64 * 1024


def create_app(
    settings: Settings,
    launcher: Optional[WorkerLauncher] = None,
    *,
    export_launcher: Optional[WorkerLauncher] = None,
    eval_launcher: Optional[WorkerLauncher] = None,
    data_dir_lock: Optional[DataDirLock] = None,
    inference_module: str = INFERENCE_MODULE,
    inspect_module: str = INSPECT_MODULE,
) -> FastAPI:
    """The app. It takes its data dir's lock when it starts (DataDirInUse if another
    server has it), unless the caller already holds it and passes it as `data_dir_lock`
    (the CLI does, to refuse before anything else starts); the caller then keeps it.
    Chat runs in `python -m <inference_module>`, dataset inspections in `python -m
    <inspect_module>` (tests name stand-ins); exports in
    what `export_launcher` starts (default: `python -m finetune_studio.export.child`), evaluations
    in what `eval_launcher` starts (default: `python -m finetune_studio.evaluation.child`)."""
    if not settings.is_loopback() and settings.token is None and not settings.accounts:
        # The CLI says this first; this guard holds for any other way of serving the app.
        raise UnsafeSettings(
            f"refusing to serve on {settings.host} without an API token: set FINETUNE_STUDIO_TOKEN, turn accounts on"
            " (FINETUNE_STUDIO_ACCOUNTS=true), or bind 127.0.0.1"
        )
    # With accounts on, every key is checked (api/accounts.py) and /auth is served; the routers of a
    # single-user server are as they were.
    routers = (*API_ROUTERS, auth.router) if settings.accounts else API_ROUTERS
    prefixes = tuple(router.prefix + "/" for router in routers)
    # Settings refuse such a token when they are built; this holds for settings made any other way.
    problem = token_problem(settings.token.get_secret_value()) if settings.token is not None else None
    if problem:
        raise UnsafeSettings(problem)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Before recovery, which would end another live server's jobs as orphans.
        owned = data_dir_lock if data_dir_lock is not None and data_dir_lock.held else None
        lock = owned or DataDirLock.acquire(settings.data_dir, settings.url)
        try:
            settings.jobs_dir.mkdir(parents=True, exist_ok=True)
            store = JobStore(settings.db_path)
            file_store = FileStore(settings.db_path, settings.files_dir)  # after JobStore: its migration 3
            service = JobService(store, settings.jobs_dir, exports_dir=settings.exports_dir, evals_dir=settings.evals_dir)
            inference = InferenceManager(settings, inference_module)
            # With a Ray cluster, each training job's driver child runs it there (supervisor/ray_launcher.py).
            training: WorkerLauncher = launcher or (
                ray_launcher(settings) if settings.ray_address else LocalProcessLauncher(settings.worker_python)
            )
            if settings.unload_chat_for_training:
                training = UnloadingLauncher(training, inference)
            # An export loads the whole model too: the same rule frees the chat's memory first.
            exporting: WorkerLauncher = export_launcher or LocalProcessLauncher(settings.worker_python, module=EXPORT_MODULE)
            if settings.unload_chat_for_training:
                exporting = UnloadingLauncher(exporting, inference)
            # A GGUF export admitted while llama.cpp builds in the background waits for the tools.
            supervisor = Supervisor(
                service, training, settings, export_launcher=exporting,
                export_tools_problem=lambda: export.gguf_tools_problem(),
                # Evaluations use the chat child (over /v1), so nothing is unloaded for them.
                eval_launcher=eval_launcher or LocalProcessLauncher(settings.worker_python, module=EVAL_MODULE),
                eval_models=evaluation.model_resolver(store),
            )
            app.state.studio = studio = Studio(settings, service, supervisor, inference, file_store)
            if settings.accounts:  # the secret is made at the first start with accounts on (mode 0600)
                table = store.accounts(server_secret(DataDir(settings.data_dir).secret))
                app.state.accounts = Accounts(table, settings.token.get_secret_value() if settings.token else None)
            # Sweeps (POST /sweeps): Optuna's study in sweeps.db, imported on the first sweep only.
            sweep_manager = app.state.sweeps = SweepManager(
                service, supervisor, DataDir(settings.data_dir).sweeps_db, sweeps.trial_queue(studio)
            )
            inspector = app.state.inspector = Inspector(settings, inspect_module)  # dataset inspections: children of their own
            # Webhooks go out from the outbox in a task of their own (what a restart finds pending, too).
            dispatcher = app.state.webhooks = WebhookDispatcher(store.webhooks, settings, service.counters)
            await supervisor.start()
            await sweep_manager.start()  # after the supervisor's recovery: it reads how the restart ended trials
            dispatcher.start()
            keepalive = asyncio.create_task(service.keep_streams_alive(), name="stream keep-alive")
            try:
                yield
            finally:
                keepalive.cancel()
                await dispatcher.shutdown()
                await inspector.shutdown()
                await inference.shutdown()
                await sweep_manager.shutdown()
                await supervisor.shutdown()
                file_store.close()
                store.close()
        finally:
            if owned is None:
                lock.release()

    app = StudioApp(
        title="finetune-studio",
        version=__version__,
        summary="Fine-tune language models: queue jobs, stream every step.",
        lifespan=lifespan,
    )
    app.state.metrics = metrics_registry(app.state)
    # /metrics goes without the token (or a key) only when the operator says so (metrics_public).
    public = (metrics.router.prefix + "/",) if settings.metrics_public else ()
    guarded = tuple(prefix for prefix in prefixes if prefix not in public)
    if settings.accounts:
        app.add_middleware(AccountGuard, prefixes=guarded)
    elif settings.token is not None:
        app.add_middleware(TokenGuard, token=settings.token.get_secret_value(), prefixes=guarded)
    # Added after the token guard, so it runs before it: an over-long declared body is refused unread.
    # An upload's body is a file (and its form): it has a limit of its own.
    upload_limit = settings.max_file_bytes + UPLOAD_FORM_BYTES
    app.add_middleware(
        DeclaredBodyLimit,
        max_bytes=settings.max_request_bytes,
        uploads=(files.router.prefix, upload_limit, settings.max_file_bytes),
    )
    # Before the limits and the token, on every path: a page of another site may change
    # nothing (api/origin.py), and on loopback none may rebind its name to this server.
    # Each of these answers in OpenAI's shape where the handlers below do (openai_errors.is_openai_path).
    app.add_middleware(CrossSiteGuard)
    if settings.is_loopback():
        app.add_middleware(LoopbackHostGuard, server_names=settings.server_names)
    app.include_router(health.router)
    # With accounts on, each route asks its scope and the owner of the ids in its path (api/accounts.py
    # AuthorizedRoute, every API router's route class).
    check_authorized((*API_ROUTERS, auth.router))
    for router in routers:
        app.include_router(router, max_body_size=upload_limit if router is files.router else settings.max_request_bytes)
    # Work that lives only for its request (an inspection, a chat answer) goes when its client goes.
    check_request_scoped(API_ROUTERS)

    @app.exception_handler(StudioError)
    async def studio_error(request: Request, exc: StudioError) -> JSONResponse:
        if openai_errors.is_openai_path(request.url.path):
            return openai_errors.studio_error(exc)
        # A message may quote a file name or a request's text: it must encode whatever they hold.
        text = clean_text(str(exc))
        if isinstance(exc, StartRefused):
            body = {"job_id": "", "status": "error", "message": "The job was not started", "error": text}
            if exc.field:  # the request field at fault, for a form to mark
                body["field"] = exc.field
            return JSONResponse(body, status_code=exc.status_code)
        if isinstance(exc, (WebhookRefused, SweepRefused)) and exc.field:
            return JSONResponse({"detail": text, "field": exc.field}, status_code=exc.status_code)
        if isinstance(exc, StorageFailed):  # a full disk (507) or a data dir that cannot be written (503)
            body = {"detail": text, "error_code": exc.error_code}
            return JSONResponse(body, status_code=exc.status_code, headers=openai_errors.retry_headers(exc))
        return JSONResponse({"detail": text}, status_code=exc.status_code)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            # Starlette's Allow names the methods of the first route on the path only; a
            # path whose methods are routes of their own (GET and DELETE /v1/files/{id})
            # must name them all.
            exc = StarletteHTTPException(405, exc.detail, {**(exc.headers or {}), "Allow": allowed_methods(request.url.path)})
        if exc.status_code == 413 and request.url.path.startswith(files.router.prefix):
            return JSONResponse(too_large_upload(settings.max_file_bytes), status_code=413)
        if exc.status_code == 413:  # a body without Content-Length that grew past the limit
            body = too_large_body(settings.max_request_bytes, request.url.path)
            return JSONResponse(body, status_code=413)
        unspooled = spool_failure(exc)
        if unspooled is not None:  # the body was fine, the disk it is spooled to was not
            return await studio_error(request, unspooled)
        if openai_errors.is_openai_path(request.url.path):
            if exc.status_code == 400 and exc.__cause__ is not None:
                return openai_errors.not_json(str(exc.__cause__))
            return openai_errors.http_error(exc.status_code, exc.detail, request.method, request.url.path, exc.headers)
        if exc.status_code == 400 and exc.__cause__ is not None:
            # FastAPI could not read the body at all (not UTF-8, say): a schema error like bad JSON, 422.
            error = {"type": "json_invalid", "loc": ["body", 0], "msg": "JSON decode error", "input": {},
                     "ctx": {"error": f"the body is not JSON text ({exc.__cause__})"}}
            return JSONResponse({"detail": [error]}, status_code=422)
        return await http_exception_handler(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        if openai_errors.is_openai_path(request.url.path):
            return openai_errors.validation_error(exc.errors())  # OpenAI's 400, echoing no input
        # FastAPI echoes each wrong input; a request's tokens must never come back.
        return JSONResponse({"detail": jsonable_encoder(scrub_errors(exc.errors()))}, status_code=422)

    if WEB_DIR.is_dir():
        # ES modules must be served as JavaScript; some systems map .js to text/plain.
        mimetypes.add_type("text/javascript", ".js")
        # The UI's files hold no data; its API calls carry the token.
        app.router.routes.append(UiMount("/", app=StaticFiles(directory=WEB_DIR, html=True), name="web", prefixes=prefixes))
    return app


def spool_failure(exc: StarletteHTTPException) -> Optional[StorageFailed]:
    """The StorageFailed of a body FastAPI could not read because its spooled copy could
    not be written (an upload's form goes to the temporary folder past 1 MiB): a full
    disk there is a 507 that says so, not a 400 about the body; None for anything else."""
    cause = exc.__cause__
    if exc.status_code != 400 or cause is None or not any(isinstance(link, OSError) for link in chain(cause)):
        return None
    fault = storage_fault(cause)
    if fault is None:
        return None
    folder = tempfile.gettempdir()
    detail = str(cause).strip().splitlines()[0][:200] if str(cause).strip() else type(cause).__name__
    what = "The disk is full" if fault.error_code == "disk_full" else "The server's temporary folder cannot be written"
    return StorageFailed(
        fault.error_code,
        f"{what} ({detail}): the upload could not be spooled to the server's temporary folder ({folder}). Free space"
        " on the disk that holds it, or start the server with TMPDIR naming a folder on a larger one",
    )


def allowed_methods(path: str) -> str:
    """Every method the API's routes take on `path`, for a 405's Allow header."""
    methods: set[str] = set()
    for router in (health.router, *API_ROUTERS):
        for route in router.routes:
            if isinstance(route, APIRoute) and route.path_regex.match(path):
                methods |= route.methods or set()
    return ", ".join(sorted(methods))


class UiMount(Mount):
    """The web UI's files at /. A mount matches every method of every path under it, so
    it would answer a wrong method on an API path (`OPTIONS /train/start`) with the
    static files' 405 (`Allow: GET, HEAD`); the API's own paths are left to the API."""

    def __init__(self, path: str, app: Any, name: str, prefixes: tuple[str, ...] = API_PREFIXES) -> None:
        super().__init__(path, app=app, name=name)
        self.prefixes = prefixes

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        path = scope.get("path", "")
        if scope["type"] == "http" and (under_prefixes(path, self.prefixes) or path == "/health"):
            return Match.NONE, {}
        return super().matches(scope)


_REDACTED = "<redacted>"


def scrub_errors(errors: Sequence[Any]) -> list[Any]:
    """Validation errors safe to answer: secrets replaced, raw bodies dropped, numbers JSON can carry."""
    clean = []
    for error in errors:
        error = dict(error)
        # Every text answered must encode: a location or message may quote a field's name.
        error["loc"] = _scrub(list(error.get("loc") or ()))
        if "msg" in error:
            error["msg"] = clean_text(str(error["msg"]))
        if "input" in error:
            loc = error.get("loc") or ()
            if any(part in REDACTED_FIELDS for part in loc):
                error["input"] = _REDACTED
            elif isinstance(error["input"], (str, bytes)) and len(loc) <= 1:
                error["input"] = _REDACTED  # the raw body itself (not JSON): it may hold anything
            else:
                error["input"] = _scrub(error["input"])
        if "ctx" in error:
            error["ctx"] = _scrub(dict(error["ctx"]))
        clean.append(error)
    return clean


def _scrub(value: Any) -> Any:
    if isinstance(value, dict):
        return {_scrub(key): _REDACTED if key in REDACTED_FIELDS else _scrub(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrub(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, str):
        return clean_text(value)
    if value is None or isinstance(value, (int, float)):
        return value
    return clean_text(str(value))  # an exception in ctx, say
