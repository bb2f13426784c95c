"""The webhook routes (docs/API.md, Webhooks): register, list, remove, test, and each one's deliveries.

A registration names its `url`, the `events` it wants (jobs/webhooks.py EVENTS) and
optionally its secret; the server makes one otherwise (`whsec_` + base64, as Standard
Webhooks writes it) and answers it once. An exposed server takes only a target the
outbound rule allows (outbound.py: 403, naming `url`). What is sent, and when, is the
dispatcher's (supervisor/webhooks.py).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from fastapi import APIRouter, status

from finetune_studio.api.accounts import AuthorizedRoute
from finetune_studio.api.deps import PageLimit, Responses, StudioDep
from finetune_studio.errors import WebhookRefused
from finetune_studio.jobs.webhooks import EVENTS, DeliveryRecord, WebhookRecord, new_secret
from finetune_studio.outbound import name_problem
from finetune_studio.schemas import (
    Webhook,
    WebhookAttempt,
    WebhookCreate,
    WebhookCreated,
    WebhookDeleted,
    WebhookDelivery,
    WebhookDeliveryList,
    WebhookEventList,
    WebhookEventType,
    WebhookList,
)
from finetune_studio.supervisor.webhooks import SETTING

router = APIRouter(prefix="/webhooks", tags=["webhooks"], route_class=AuthorizedRoute)
# The event list has a path of its own: under /webhooks, `events` would also match
# /webhooks/{webhook_id}, whose DELETE a 405's Allow would then name.
events_router = APIRouter(prefix="/webhook-events", tags=["webhooks"], route_class=AuthorizedRoute)

# The bytes a given secret may hold (Standard Webhooks: 24 to 64).
SECRET_BYTES = (24, 64)
_NOT_FOUND: Responses = {status.HTTP_404_NOT_FOUND: {"description": "No webhook has this id"}}


def _check_secret(secret: str) -> None:
    low, high = SECRET_BYTES
    fix = f"give `whsec_` and the base64 of {low} to {high} random bytes, or leave `secret` out for the server to make one"
    if not secret.startswith("whsec_"):
        raise WebhookRefused(f"secret: it must start with whsec_; {fix}", field="secret")
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        raise WebhookRefused(f"secret: what follows whsec_ is not base64; {fix}", field="secret") from None
    if not low <= len(key) <= high:
        raise WebhookRefused(f"secret: it holds {len(key)} bytes; {fix}", field="secret")


def _webhook(record: WebhookRecord) -> dict[str, Any]:
    return {
        "id": record.id, "url": record.url, "events": record.events, "created_at": int(record.created_at),
        "disabled": record.disabled_at is not None, "disabled_reason": record.disabled_reason,
    }


def _delivery(record: DeliveryRecord) -> WebhookDelivery:
    return WebhookDelivery(
        id=record.id, webhook_id=record.webhook_id, event_type=record.event_type, created_at=record.created_at,
        state=record.state,  # type: ignore[arg-type]  # the table's CHECK holds it to the three
        next_attempt_at=record.next_attempt_at, last_error=record.last_error, payload=record.payload,
        attempts=[
            WebhookAttempt(number=a.number, at=a.at, status_code=a.status_code, error=a.error,
                           duration_ms=round(a.duration * 1000, 3))
            for a in record.attempts
        ],
    )


@router.post(
    "",
    response_model=WebhookCreated,
    responses={
        status.HTTP_400_BAD_REQUEST: {"description": "An unknown event, a URL that is none, a secret of the wrong form (`field` names it)"},
        status.HTTP_403_FORBIDDEN: {"description": "A target an exposed server may not reach (FINETUNE_STUDIO_WEBHOOK_ALLOWED_HOSTS)"},
    },
)
async def create_webhook(body: WebhookCreate, studio: StudioDep) -> WebhookCreated:
    """Register a webhook; its secret is answered this once."""
    for index, name in enumerate(body.events):
        if name not in EVENTS:
            raise WebhookRefused(
                f"events[{index}]: {name!r} is not an event this server sends; choose from {', '.join(EVENTS)}",
                field=f"events[{index}]",
            )
    settings = studio.settings
    problem = name_problem(
        body.url, allowed=settings.webhook_allowed_hosts, exposed=not settings.is_loopback(), what="a webhook",
        setting=SETTING,
    )
    if problem:
        code = 400 if "URL" in problem or "password" in problem else 403
        raise WebhookRefused(f"url: {problem}", field="url", status_code=code)
    if body.secret is not None:
        _check_secret(body.secret)
    secret = body.secret or new_secret()
    record = studio.service.store.webhooks.add(body.url, secret, list(dict.fromkeys(body.events)))
    return WebhookCreated(**_webhook(record), secret=secret)


@router.get("", response_model=WebhookList)
async def list_webhooks(studio: StudioDep) -> WebhookList:
    """Every registration (without its secret)."""
    return WebhookList(data=[Webhook(**_webhook(record)) for record in studio.service.store.webhooks.all()])


@events_router.get("", response_model=WebhookEventList)
async def list_event_types() -> WebhookEventList:
    """The events a registration may ask for, each with what sends it (the page's choices)."""
    return WebhookEventList(data=[WebhookEventType(name=name, description=event.description) for name, event in EVENTS.items()])


@router.delete("/{webhook_id}", response_model=WebhookDeleted, responses=_NOT_FOUND)
async def delete_webhook(webhook_id: str, studio: StudioDep) -> WebhookDeleted:
    """Remove a registration and its deliveries; nothing more is sent to it."""
    studio.service.store.webhooks.delete(webhook_id)
    return WebhookDeleted(id=webhook_id)


@router.get("/{webhook_id}/deliveries", response_model=WebhookDeliveryList, responses=_NOT_FOUND)
async def list_deliveries(webhook_id: str, studio: StudioDep, limit: PageLimit = 20) -> WebhookDeliveryList:
    """The webhook's newest deliveries, newest first, each with every attempt and its outcome."""
    records = studio.service.store.webhooks.deliveries(webhook_id, limit)
    return WebhookDeliveryList(data=[_delivery(record) for record in records])


@router.post("/{webhook_id}/test", response_model=WebhookDelivery, responses=_NOT_FOUND)
async def test_webhook(webhook_id: str, studio: StudioDep) -> WebhookDelivery:
    """Queue a `studio.webhook.test` event to this webhook (sent even if it was disabled)."""
    table = studio.service.store.webhooks
    delivery_id = table.enqueue_test(webhook_id)
    found = next(record for record in table.deliveries(webhook_id, 50) if record.id == delivery_id)
    return _delivery(found)
