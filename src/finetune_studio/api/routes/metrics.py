"""GET /metrics: Prometheus's text format (api/metrics.py says what it reports).

Behind the token like every API route, unless `metrics_public` is set (api/app.py
leaves its prefix out of the token guard's then)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from finetune_studio.api.accounts import AuthorizedRoute

router = APIRouter(prefix="/metrics", tags=["metrics"], route_class=AuthorizedRoute)


@router.get("", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "The metrics"}})
async def metrics(request: Request) -> Response:
    """Every metric, read now (the store is read on the event loop, as every route reads it)."""
    return Response(generate_latest(request.app.state.metrics), media_type=CONTENT_TYPE_LATEST)
