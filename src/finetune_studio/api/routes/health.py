"""GET and HEAD /health: answer without a token, for load balancers and start-up checks.

Always 200 while the server runs: `{"status": "ok"}`, or `{"status": "degraded",
"store": {"error_code", "message"}}` while its writes to the data dir fail (it goes
back to `ok` by itself once a write gets through). HEAD answers the same 200 without
a body either way: a load balancer has nothing better to send the request to."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from finetune_studio.schemas import Health, StoreProblem

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health, response_model_exclude_none=True)
async def health(request: Request) -> Any:
    studio = getattr(request.app.state, "studio", None)
    fault = studio.service.store.health.fault if studio is not None else None
    if fault is None:
        return Health()
    return Health(status="degraded", store=StoreProblem(error_code=fault.error_code, message=fault.message))


@router.head("/health", response_class=Response, responses={200: {"description": "The server is up (no body)"}})
async def health_head() -> Response:
    # Load balancers often probe with HEAD: the same 200, without the body.
    return Response(status_code=200)
