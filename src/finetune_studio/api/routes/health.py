"""GET and HEAD /health: answer without a token, for load balancers and start-up checks."""

from __future__ import annotations

from fastapi import APIRouter, Response

from finetune_studio.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> Health:
    return Health()


@router.head("/health", response_class=Response, responses={200: {"description": "The server is up (no body)"}})
async def health_head() -> Response:
    # Load balancers often probe with HEAD: the same 200, without the body.
    return Response(status_code=200)
