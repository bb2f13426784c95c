"""GET /health: answers without a token, for load balancers and start-up checks."""

from __future__ import annotations

from fastapi import APIRouter

from finetune_studio.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> Health:
    return Health()
