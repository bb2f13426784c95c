"""`POST /datasets/inspect`: what a job would make of some data, before any job is started.

The request passes the admission a start request passes for its paths (allowed
folders, files that exist, sizes), then the data is read and checked in a child
process (`supervisor/inspector.py`): the server itself never imports the dataset
or tokenizer libraries. Nothing is queued and no job is created. The route is
`@request_scoped` (api/request_scoped.py): a client that goes away takes its
inspection with it (the child is killed, its slot freed).
"""

from __future__ import annotations

from typing import Any, Union

from fastapi import APIRouter, Request, status
from fastapi.responses import JSONResponse

from finetune_studio.api.admission import check_datasets, check_finite, check_paths
from finetune_studio.api.deps import StudioDep
from finetune_studio.api.request_scoped import RequestScopedRoute, request_scoped
from finetune_studio.errors import InspectionBusy, StartRefused
from finetune_studio.schemas import DatasetInspection, DatasetInspectRequest
from finetune_studio.supervisor.inspector import RETRY_AFTER_SECONDS, Inspector
from finetune_studio.text import clean_text

router = APIRouter(prefix="/datasets", tags=["datasets"], route_class=RequestScopedRoute)

_ANSWERS: dict[Union[int, str], dict[str, Any]] = {
    status.HTTP_400_BAD_REQUEST: {"description": "A dataset file is missing, unreadable or over the size limit"},
    status.HTTP_403_FORBIDDEN: {"description": "A path lies outside the allowed folders"},
    status.HTTP_429_TOO_MANY_REQUESTS: {"description": "As many inspections are running as the server allows; see Retry-After"},
    status.HTTP_503_SERVICE_UNAVAILABLE: {"description": "The inspection's process died or ran out of time"},
}


def inspector_of(request: Request) -> Inspector:
    """The app's inspector (made with the app's state, by its lifespan)."""
    inspector: Inspector = request.app.state.inspector
    return inspector


@router.post("/inspect", response_model=DatasetInspection, responses=_ANSWERS)
@request_scoped
async def inspect_dataset(body: DatasetInspectRequest, studio: StudioDep, request: Request) -> Any:
    """Read and check the data as a job would, and report its shape, rows, a preview of
    the first rows as the model sees them (the part the loss covers marked), token
    statistics (with `model_name`), and every problem with its file and line. Data with
    problems is a 200 whose `ok` is false: the report is the answer."""
    training = body.training_request()
    settings = studio.settings
    try:
        check_finite(training)
        roots = settings.path_roots()
        check_paths(training, roots)
        check_datasets(training, settings.max_dataset_bytes, roots)
    except StartRefused as exc:
        answer: dict[str, Any] = {"detail": clean_text(str(exc))}
        field = getattr(exc, "field", None)
        if field:
            answer["field"] = field
        return JSONResponse(answer, status_code=exc.status_code)
    try:
        found = await inspector_of(request).inspect(body.model_dump(mode="json"))
    except InspectionBusy as exc:
        return JSONResponse(
            {"detail": str(exc)}, status_code=exc.status_code, headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
        )
    return DatasetInspection.model_validate(found)
