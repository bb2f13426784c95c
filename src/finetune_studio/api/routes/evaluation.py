"""The evaluation routes (docs/API.md, Evaluation): start, status, stream, stop, jobs, results, samples.

An evaluation is a job of kind `eval` (jobs/phases.py): queued in slots of its own
(`max_concurrent_evals`), run by its own child (`python -m finetune_studio.evaluation.child`),
streamed with the same events, ids and replay as a training job. Its child reaches the
models through this server's /v1 over loopback, so what it compares is exactly what chat
serves; its results are kept in SQLite once it completes (supervisor/eval_results.py).

What can be checked before anything is queued is checked here, each refusal naming the
field at fault: every model must be one this server serves (404), every file must exist,
be readable, be no larger than `max_dataset_bytes` and not be empty (400), every path must
lie under the allowed folders (403), a judge's key must come from a variable the operator
lists, and an exposed server's judge may only be reached at a host it allows (403).
`check_suites` is also what `POST /train/start` asks of `eval_after`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Optional

from fastapi import APIRouter, Query, Response, status
from fastapi.responses import JSONResponse

from finetune_studio.api.accounts import AuthorizedRoute
from finetune_studio.api.deps import ParamInt, Responses, StudioDep
from finetune_studio.api.job_stream import (
    add_status_and_stream,
)
from finetune_studio.api.served_models import resolve_model
from finetune_studio.config import Settings, roots_named, within
from finetune_studio.errors import JobNotFound, ModelNotFound, PathNotAllowed, QueueFull, StartRefused, StudioError
from finetune_studio.jobs.accounts import seen_owner
from finetune_studio.jobs.store import JobRecord, JobStore
from finetune_studio.outbound import name_problem
from finetune_studio.schemas import (
    MAX_EVAL_SAMPLE_PAGE,
    EvalJobResponse,
    EvalList,
    EvalProgress,
    EvalResults,
    EvalSamplePage,
    EvalSampleRow,
    EvalStartRequest,
    EvalStatus,
    EvalSuite,
    HeldoutSuite,
    JudgeSuite,
    LmEvalSuite,
)

router = APIRouter(prefix="/eval", tags=["evaluation"], route_class=AuthorizedRoute)

SERVER_PREFIX = "FINETUNE_STUDIO_"

_NOT_FOUND: Responses = {status.HTTP_404_NOT_FOUND: {"description": "No evaluation has this id"}}
_REFUSED: Responses = {
    status.HTTP_400_BAD_REQUEST: {"model": EvalJobResponse, "description": "A file missing, unreadable, empty or too large; a judge's key not allowed"},
    status.HTTP_403_FORBIDDEN: {"model": EvalJobResponse, "description": "A path outside the allowed folders, or a judge's host an exposed server does not allow"},
    status.HTTP_404_NOT_FOUND: {"model": EvalJobResponse, "description": "A model this server does not serve (`field` names which)"},
    status.HTTP_429_TOO_MANY_REQUESTS: {"model": EvalJobResponse, "description": "The evaluation queue is full"},
}


class UnknownModel(StartRefused):
    status_code = 404


# -- admission -------------------------------------------------------------------


def check_models(store: JobStore, models: Sequence[str], field: str = "models") -> None:
    """Every model must be one this server serves now (`resolve_model`, the chat route's rule)."""
    for index, model in enumerate(models):
        try:
            resolve_model(store, model)
        except ModelNotFound as exc:
            raise UnknownModel(f"{field}[{index}]: {exc}", field=f"{field}[{index}]") from None


def check_suites(suites: Sequence[EvalSuite], settings: Settings, store: JobStore, prefix: str = "suites") -> None:
    """What can be known of each suite before it runs: its files, folders and judge (see the module's docstring)."""
    roots = settings.path_roots()
    for index, suite in enumerate(suites):
        at = f"{prefix}[{index}]"
        if isinstance(suite, HeldoutSuite):
            for number, name in enumerate(suite.data):
                check_file(f"{at}.data[{number}]", name, settings.max_dataset_bytes, roots)
        elif isinstance(suite, LmEvalSuite):
            if suite.tasks_dir is not None:
                path = _inside(f"{at}.tasks_dir", suite.tasks_dir, roots)
                if not path.is_dir():
                    raise StartRefused(
                        f"{at}.tasks_dir: {suite.tasks_dir} is not a folder; name the folder that holds the tasks' YAML files",
                        field=f"{at}.tasks_dir",
                    )
        elif isinstance(suite, JudgeSuite):
            check_file(f"{at}.prompts", suite.prompts, settings.max_dataset_bytes, roots)
            check_judge(suite, settings, store, at)


def check_judge(suite: JudgeSuite, settings: Settings, store: JobStore, at: str) -> None:
    judge = suite.judge
    name = judge.api_key_env
    if name is not None:
        field = f"{at}.judge.api_key_env"
        if name.upper().startswith(SERVER_PREFIX):
            raise StartRefused(f"{field}: {name} is one of the server's own settings, which no judge may read", field=field)
        if name not in settings.judge_key_envs:
            allowed = ", ".join(settings.judge_key_envs) or "none"
            raise StartRefused(
                f"{field}: {name} is not one of the variables this server lets a judge take its key from ({allowed});"
                " the operator lists them in FINETUNE_STUDIO_JUDGE_KEY_ENVS",
                field=field,
            )
        if not os.environ.get(name):
            raise StartRefused(
                f"{field}: the server's environment has no {name} (or it is empty); set it where the server runs and"
                " restart the server",
                field=field,
            )
    if judge.base_url is None:
        if name is not None:
            raise StartRefused(
                f"{at}.judge.api_key_env: a key is for an external judge; set judge.base_url too, or leave the key out to"
                " judge with a model this server serves",
                field=f"{at}.judge.api_key_env",
            )
        try:
            resolve_model(store, judge.model)
        except ModelNotFound as exc:
            raise UnknownModel(
                f"{at}.judge.model: {exc} (an external judge needs judge.base_url)", field=f"{at}.judge.model"
            ) from None
        return
    # The server's one outbound rule (outbound.py), as webhooks obey it; the judge's child reaches the host.
    problem = name_problem(
        judge.base_url, allowed=settings.judge_allowed_hosts, exposed=not settings.is_loopback(), what="a judge",
        setting="FINETUNE_STUDIO_JUDGE_ALLOWED_HOSTS",
    )
    if problem:
        raise PathNotAllowed(f"{at}.judge.base_url: {problem}", field=f"{at}.judge.base_url")


def _inside(field: str, name: str, roots: Optional[list[Path]]) -> Path:
    if "\x00" in name:
        raise StartRefused(f"{field}: {name!r} is not a valid path", field=field)
    try:
        path = Path(os.path.expanduser(name)).resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        raise StartRefused(f"{field}: {name!r} is not a valid path ({exc})", field=field) from None
    if roots is not None and not within(path, roots):
        raise PathNotAllowed(
            f"{field}: {name!r} is outside the folders this server accepts paths from; paths must lie under"
            f" {roots_named(roots)} (the operator sets them with FINETUNE_STUDIO_ALLOWED_ROOTS)",
            field=field,
        )
    return path


def check_file(field: str, name: str, max_bytes: int, roots: Optional[list[Path]]) -> None:
    """A data file an evaluation reads: inside the roots, there, a file, readable, not empty, not too large."""
    path = _inside(field, name, roots)
    try:
        info = path.stat()
        if not path.is_file():
            raise StartRefused(f"{field}: {name} is not a file", field=field)
        with open(path, "rb"):
            pass
    except FileNotFoundError:
        raise StartRefused(f"{field}: the file {name} does not exist; check the path", field=field) from None
    except OSError as exc:
        raise StartRefused(f"{field}: the file {name} cannot be read ({exc.strerror})", field=field) from None
    if info.st_size == 0:
        raise StartRefused(f"{field}: the file {name} is empty; name a file with at least one row", field=field)
    if info.st_size > max_bytes:
        raise StartRefused(
            f"{field}: the file {name} is {info.st_size:,} bytes, over this server's limit of {max_bytes:,} per file"
            " (FINETUNE_STUDIO_MAX_DATASET_BYTES)",
            field=field,
        )


def model_resolver(store: JobStore) -> Callable[[list[str]], list[dict[str, Any]]]:
    """What the supervisor asks as an evaluation starts: each model as its child reaches it (the id it
    names at /v1, and where the tokenizer that renders its chat template is), or ModelNotFound."""

    def resolve(models: list[str]) -> list[dict[str, Any]]:
        resolved = []
        for model in models:
            ref = resolve_model(store, model)
            base = ref["base"]
            adapter = ref.get("adapter")
            tokenizer = dict(base)
            if ref.get("backend", "transformers") == "transformers" and adapter and (Path(adapter) / "tokenizer_config.json").is_file():
                tokenizer = {"kind": "folder", "location": adapter}  # training saved the tokenizer with the adapter
            resolved.append({"id": model, "tokenizer": tokenizer, "trust_remote_code": bool(ref.get("trust_remote_code"))})
        return resolved

    return resolve


# -- routes ----------------------------------------------------------------------


def _refused(exc: StartRefused) -> JSONResponse:
    body = EvalJobResponse(eval_id="", status="error", message="The evaluation was not started", error=str(exc), field=exc.field)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=exc.status_code)


@router.post("/start", responses=_REFUSED)
async def start_eval(request: EvalStartRequest, studio: StudioDep) -> Response:
    """Queue an evaluation of one or more models on one or more suites. It runs in its own slot."""
    store = studio.service.store
    queued = len(studio.supervisor.queue_positions("eval"))
    try:
        if queued >= studio.settings.max_queued_jobs:
            raise QueueFull(
                f"{queued} evaluations are waiting, this server's limit (FINETUNE_STUDIO_MAX_QUEUED_JOBS); try again"
                " once some have run"
            )
        check_models(store, request.models)
        check_suites(request.suites, studio.settings, store)
    except StartRefused as exc:
        return _refused(exc)
    names = request.suite_names()
    stored: dict[str, Any] = {**request.model_dump(mode="json"), "suite_names": names}
    details = {"models": request.models, "suites": names, "label": request.label}
    evaluation = studio.service.create_job(stored, message="Queued", details=details, kind="eval")
    studio.supervisor.submit(evaluation.id, {})
    message = (
        f"Evaluation {evaluation.id} of {', '.join(request.models)} on {', '.join(names)} queued at position {queued + 1}"
    )
    return JSONResponse(EvalJobResponse(eval_id=evaluation.id, status="queued", message=message).model_dump(exclude_none=True))


async def _eval(eval_id: str, studio: StudioDep) -> JobRecord:
    return studio.service.store.get_job(eval_id, kind="eval")  # another kind's id is no evaluation: 404


add_status_and_stream(
    router, "eval", "eval_id", "evaluation", (EvalStatus, EvalProgress), _NOT_FOUND,
    "Every status and progress event of the evaluation, exactly as GET /train/stream/{id} sends a job's.",
)


@router.post("/stop/{eval_id}", responses={**_NOT_FOUND, status.HTTP_409_CONFLICT: {"description": "The evaluation has finished"}})
async def stop_eval(eval_id: str, studio: StudioDep) -> EvalStatus:
    """Stop an evaluation: a queued one at once; a running one after the request under way."""
    evaluation = await _eval(eval_id, studio)
    return await studio.supervisor.stop_eval(evaluation.id)


@router.get("/jobs")
async def list_evals(studio: StudioDep) -> EvalList:
    """Every evaluation's current status, newest first."""
    positions = studio.supervisor.queue_positions("eval")
    data = [studio.service.eval_status_of(job, positions.get(job.id)) for job in studio.service.store.list_jobs(kind="eval", owner=seen_owner())]
    return EvalList(data=data, count=len(data))


_RESULTS: Responses = {**_NOT_FOUND, status.HTTP_409_CONFLICT: {"description": "The evaluation has not completed"}}


class NotCompleted(StudioError):
    status_code = 409


def _results(studio: StudioDep, evaluation: JobRecord) -> dict[str, Any]:
    if evaluation.phase != "completed":
        raise NotCompleted(
            f"evaluation {evaluation.id} is {evaluation.phase}: its results exist once it has completed"
            f" (GET /eval/status/{evaluation.id})"
        )
    results = studio.service.store.eval_results(evaluation.id)
    if results is None:
        raise JobNotFound(evaluation.id)
    return results


@router.get("/results/{eval_id}", responses=_RESULTS)
async def eval_results(eval_id: str, studio: StudioDep) -> EvalResults:
    """The results table: every metric of every suite, for every model, each value with its 95%
    interval, and its difference from the first model with the difference's own interval."""
    return EvalResults.model_validate(_results(studio, await _eval(eval_id, studio)))


@router.get("/results/{eval_id}/samples", responses=_RESULTS)
async def eval_samples(
    eval_id: str,
    studio: StudioDep,
    suite: Annotated[Optional[str], Query(max_length=200, description="Only this suite's samples")] = None,
    offset: Annotated[ParamInt, Query(ge=0, le=2**31, description="Rows to skip")] = 0,
    limit: Annotated[ParamInt, Query(ge=1, le=MAX_EVAL_SAMPLE_PAGE, description=f"Rows a page holds (1 to {MAX_EVAL_SAMPLE_PAGE})")] = 100,
) -> EvalSamplePage:
    """Per-sample rows: each sample's prompt, reference, every model's answer and scores (and the judge's verdicts)."""
    evaluation = await _eval(eval_id, studio)
    _results(studio, evaluation)
    rows, total = studio.service.store.eval_samples(evaluation.id, suite, offset, limit)
    return EvalSamplePage(data=[EvalSampleRow.model_validate(row) for row in rows], total=total, offset=offset, limit=limit)
