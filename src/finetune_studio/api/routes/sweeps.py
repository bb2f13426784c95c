"""The sweep routes (docs/API.md, Sweeps): create, list, one sweep, its stream, stop.

A sweep is checked whole when it is created: its request as POST /train/start checks one,
and again at every `low`, every `high` and every choice of its space, so a space that can
make an invalid request is refused now, naming the field, and never surfaces as failed
trials later. The sweep itself runs in supervisor/sweeps.py.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Optional

from fastapi import APIRouter, Depends, Request, Response, status
from pydantic import ValidationError

from finetune_studio.api.accounts import AuthorizedRoute
from finetune_studio.api.admission import check_start
from finetune_studio.api.deps import PageLimit, Responses, Studio, StudioDep
from finetune_studio.api.job_stream import LastEventIdHeader, LastEventIdQuery
from finetune_studio.api.routes.evaluation import check_suites
from finetune_studio.api.routes.train import queue_training
from finetune_studio.api.streaming import BoundedEventStream
from finetune_studio.errors import PastLastEvent, StartRefused, SweepNotFound, SweepRefused
from finetune_studio.jobs.accounts import ACTING, Principal, seen_owner, sees
from finetune_studio.schemas import (
    SECRET_FIELDS,
    SWEEP_TRIAL,
    TRAINING_OBJECTIVES,
    SweepCreate,
    SweepCreated,
    SweepList,
    SweepStatus,
    TrainingStartRequest,
    suite_names,
)
from finetune_studio.supervisor.sweeps import SweepManager

router = APIRouter(prefix="/sweeps", tags=["sweeps"], route_class=AuthorizedRoute)

_REFUSED: Responses = {
    status.HTTP_400_BAD_REQUEST: {"description": "The sweep cannot be run as asked; `field` names what to fix"},
}
_NOT_FOUND: Responses = {status.HTTP_404_NOT_FOUND: {"description": "No sweep has this id"}}
# Fields a space may not vary: the ones that say what is trained and where from, and secrets.
_FIXED_FIELDS = frozenset({*SECRET_FIELDS, "model_name", "resume_from_checkpoint", "eval_after"})


async def _manager(request: Request) -> SweepManager:
    return request.app.state.sweeps  # type: ignore[no-any-return]


ManagerDep = Annotated[SweepManager, Depends(_manager)]


def trial_queue(studio: Studio) -> Any:
    """How the manager queues a trial: the admission path of POST /train/start, tagged with its
    sweep, as the sweep's maker (with accounts on): the trial is theirs, and counts towards
    their queue limit, whichever task of the server's asks for it."""

    def queue(request: dict[str, Any], tag: dict[str, Any], owner: Optional[dict[str, Any]] = None) -> str:
        acting = ACTING.set(Principal(str(owner["name"]), bool(owner.get("admin")), frozenset({"train"}))) if owner else None
        try:
            return queue_training(studio, TrainingStartRequest.model_validate(request), extra={SWEEP_TRIAL: tag}).id
        finally:
            if acting is not None:
                ACTING.reset(acting)

    return queue


def _owner_now() -> Optional[dict[str, Any]]:
    principal = ACTING.get()
    return {"name": principal.name, "admin": principal.admin} if principal is not None else None


def _seen(sweeps: SweepManager, sweep_id: str) -> Any:
    """The sweep, if the caller may see it; another user's is as unknown as an id never made (404)."""
    sweep = sweeps.table.get(sweep_id)  # SweepNotFound -> 404
    if not sees(sweep.owner):
        raise SweepNotFound(sweep_id)
    return sweep


@router.post("", responses=_REFUSED)
async def create_sweep(body: SweepCreate, studio: StudioDep, sweeps: ManagerDep) -> SweepCreated:
    """Create a sweep: Optuna chooses each trial's values, and each trial is a training job."""
    base = _check(body, studio)
    planned = _planned(body)
    secrets = {name: value for name in SECRET_FIELDS if (value := getattr(base, name))}
    sweep = await sweeps.create(body, base.redacted(), planned, secrets, owner=_owner_now())
    return SweepCreated(sweep_id=sweep.id, message=f"Sweep {sweep.id} queued: {planned} trials")


@router.get("")
async def list_sweeps(sweeps: ManagerDep, limit: PageLimit = 20) -> SweepList:
    """The newest sweeps first, each with its trials and best trial."""
    if seen_owner() is None:
        return SweepList(sweeps=[sweeps.status(sweep.id) for sweep in sweeps.table.list_sweeps(limit)])
    own = [sweep for sweep in sweeps.table.list_sweeps(2**31) if sees(sweep.owner)]
    return SweepList(sweeps=[sweeps.status(sweep.id) for sweep in own[:limit]])


@router.get("/{sweep_id}", responses=_NOT_FOUND)
async def get_sweep(sweep_id: str, sweeps: ManagerDep) -> SweepStatus:
    """The sweep: its trials (values, objective, state), the best trial, and Optuna's parameter importances."""
    _seen(sweeps, sweep_id)
    await sweeps.importances(sweep_id)
    return sweeps.status(sweep_id)


@router.get("/{sweep_id}/stream", responses=_NOT_FOUND)
async def stream_sweep(
    sweep_id: str, studio: StudioDep, sweeps: ManagerDep,
    last_event_id: LastEventIdHeader = None, after: LastEventIdQuery = None,
) -> Response:
    """The sweep's events (SSE): `status` (its own) and `trial` (a trial queued, started, reported,
    pruned, finished, failed or queued again), ending after its terminal status; Last-Event-ID resumes."""
    sweep = _seen(sweeps, sweep_id)
    cursor = max(last_event_id or 0, after or 0)
    if cursor > sweep.last_event_id:
        raise PastLastEvent(sweep_id, cursor, sweep.last_event_id)
    return BoundedEventStream(
        sweeps.stream(sweep_id, cursor), stall_seconds=studio.settings.stream_stall_seconds, on_close=lambda: None,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post("/{sweep_id}/stop", responses=_NOT_FOUND)
async def stop_sweep(sweep_id: str, sweeps: ManagerDep) -> SweepStatus:
    """Stop the sweep: no further trials; its running trials stop after their step and save what they trained."""
    _seen(sweeps, sweep_id)
    return await sweeps.stop(sweep_id)


# -- the checks at creation ----------------------------------------------------


def _check(body: SweepCreate, studio: Studio) -> TrainingStartRequest:
    """The base request, checked; then every edge of the space (SweepRefused naming the field)."""
    base = _request(body.request, "request", studio, queued=len(studio.supervisor.queue_positions()))
    known = set(TrainingStartRequest.model_fields)
    for name, parameter in body.space.items():
        field = f"space.{name}"
        if name not in known:
            raise SweepRefused(f"{field}: {name!r} is not a field of the training request", field=field)
        if name in _FIXED_FIELDS:
            raise SweepRefused(f"{field}: a sweep cannot vary {name} (set it in `request`)", field=field)
        for value in parameter.edges():
            _request({**body.request, name: value}, field, studio, queued=0, value=(name, value))
    metric = body.objective.metric
    if metric == "eval_loss" and not (base.eval_steps > 0 and (base.local_eval_datasets or base.eval_split)):
        raise SweepRefused(
            "objective.metric: eval_loss needs evaluations in every trial: set request.eval_steps above 0 and"
            " evaluation data (local_eval_datasets or eval_split)", field="objective.metric",
        )
    if metric not in TRAINING_OBJECTIVES:
        names = suite_names([suite.type for suite in base.eval_after or []])
        if "/" not in metric or metric.split("/", 1)[0] not in names:
            raise SweepRefused(
                f"objective.metric: {metric!r} is neither eval_loss, train_loss nor SUITE/NAME of a suite in"
                f" request.eval_after (its suites: {', '.join(names) or 'none'})", field="objective.metric",
            )
        if body.pruner_spec().type != "none":
            raise SweepRefused(
                f"pruner: a trial reports {metric} only after it trained, so nothing can prune on it; use pruner"
                " none, or the objective eval_loss or train_loss", field="pruner",
            )
    if base.eval_after:
        check_suites(base.eval_after, studio.settings, studio.service.store, prefix="request.eval_after")
    if body.sampler == "grid":
        for name, parameter in body.space.items():
            if parameter.grid() is None:
                raise SweepRefused(f"space.{name}: the grid sampler needs choices or a step for every field", field=f"space.{name}")
    return base


def _request(data: dict[str, Any], field: str, studio: Studio, queued: int, value: Any = None) -> TrainingStartRequest:
    at = f" at {value[0]}={value[1]!r}" if value is not None else ""
    try:
        request = TrainingStartRequest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        raise SweepRefused(f"{field}: the training request is invalid{at}: {where}: {first.get('msg')}", field=field) from exc
    try:
        check_start(request, studio.settings, queued=queued)
    except StartRefused as exc:
        inner = f".{exc.field}" if exc.field and field == "request" else ""
        raise SweepRefused(f"{field}: the training request is refused{at}: {exc}", field=field + inner) from exc
    return request


def _planned(body: SweepCreate) -> int:
    """The trials the sweep runs: `trials`, and for a grid at most the grid's size."""
    if body.sampler != "grid":
        return body.trials
    size = math.prod(len(parameter.grid() or []) for parameter in body.space.values())
    return min(body.trials, size)
