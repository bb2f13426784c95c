"""Webhooks' registrations and their outbox, in the job store's SQLite file (migration 6).

The one table of events a webhook can ask for is `EVENTS`. A status write of the job
store (`JobStore.create_job`, `JobStore.transition`) calls `WebhookTable.enqueue` inside
its own transaction, so a delivery is written together with the status that causes it:
a crash loses neither, or both. The server's dispatcher (supervisor/webhooks.py) sends
what is due, records each attempt (`record_attempt`) and schedules the next; a delivery
keeps its id (the `webhook-id` header) through every attempt and every restart.

With accounts, a registration belongs to the user who made it (migration 10): its owner
sees and manages it (another user's is a 404, as an unknown id), and it is sent the events
of that owner's objects only. It sees what its maker sees: an admin's registration (its
`owner` None), and one made before accounts, is sent the events of every object.

Plain Python (the standard library); used from the server's event loop thread only.
"""

from __future__ import annotations

import base64
import json
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Optional

from finetune_studio.errors import WebhookNotFound
from finetune_studio.failures import StorageHealth
from finetune_studio.jobs.accounts import seen_owner, sees
from finetune_studio.jobs.phases import TERMINAL, openai_end
from finetune_studio.jobs.sql import as_json, insert_next, record


@dataclass(frozen=True)
class EventType:
    kind: str  # the job kind whose statuses send it (jobs/phases.py KINDS)
    description: str
    # Whether a status of that kind sends it: (phase, details) -> bool.
    sent_by: Callable[[str, dict[str, Any]], bool]


def _ended(end: str) -> Callable[[str, dict[str, Any]], bool]:
    # A sweep trial that its pruner stopped was not cancelled by anyone: it sends the studio's
    # phase event (and the sweep's trial event) only, never OpenAI's `cancelled`.
    return lambda phase, details: openai_end(phase, details) == end and not details.get("pruned")


def _terminal(phase: str, details: dict[str, Any]) -> bool:
    return phase in TERMINAL


# The one table of webhook events: name -> what sends it. OpenAI's three are sent for
# every training job (a /train job and a /v1/fine_tuning job alike) in OpenAI's body
# shape; the studio's own carry the phase in `data` (a sweep's: its status, or its trial's state).
EVENTS: dict[str, EventType] = {
    "fine_tuning.job.succeeded": EventType("train", "a training job completed", _ended("succeeded")),
    "fine_tuning.job.failed": EventType("train", "a training job failed (phase error)", _ended("failed")),
    "fine_tuning.job.cancelled": EventType("train", "a training job was stopped (not paused)", _ended("cancelled")),
    "studio.job.phase": EventType("train", "a training job entered a phase (every status change)", lambda p, d: True),
    "studio.export.completed": EventType("export", "an export ended: completed, error or stopped (data.phase)", _terminal),
    "studio.eval.completed": EventType("eval", "an evaluation ended: completed, error or stopped (data.phase)", _terminal),
    "studio.sweep.completed": EventType("sweep", "a sweep ended: completed, stopped or error (data.phase)", _terminal),
    "studio.sweep.trial": EventType("sweep_trial", "a sweep's trial ended: complete, pruned or failed (data.phase)", lambda p, d: True),
}
# What POST /webhooks/{id}/test sends (no registration asks for it).
TEST_EVENT = "studio.webhook.test"
# Finished deliveries kept per webhook (the newest); older ones go as new ones finish.
KEPT_DELIVERIES = 1000

MIGRATION = """
CREATE TABLE webhooks (
    id               TEXT PRIMARY KEY,
    seq              INTEGER NOT NULL UNIQUE,
    created_at       REAL NOT NULL,
    url              TEXT NOT NULL,
    secret           TEXT NOT NULL,
    events_json      TEXT NOT NULL,
    disabled_at      REAL,
    disabled_reason  TEXT
);
CREATE TABLE webhook_deliveries (
    id               TEXT PRIMARY KEY,
    seq              INTEGER NOT NULL UNIQUE,
    webhook_id       TEXT NOT NULL,
    event_type       TEXT NOT NULL,
    payload          TEXT NOT NULL,
    created_at       REAL NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  REAL,
    last_error       TEXT
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_attempt_at);
CREATE INDEX webhook_deliveries_of ON webhook_deliveries (webhook_id, seq);
CREATE TABLE webhook_attempts (
    delivery_id  TEXT NOT NULL,
    number       INTEGER NOT NULL,
    at           REAL NOT NULL,
    status_code  INTEGER,
    error        TEXT,
    duration     REAL NOT NULL,
    PRIMARY KEY (delivery_id, number)
) WITHOUT ROWID;
"""

# 10: a registration's owner: whose objects it is told of (None: everyone's; made by an admin, before
# accounts, or in single-user mode).
OWNER_MIGRATION = """
ALTER TABLE webhooks ADD COLUMN owner TEXT;
"""


def new_secret() -> str:
    """A signing secret as Standard Webhooks writes one: `whsec_` and 24 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


@dataclass(frozen=True)
class WebhookRecord:
    id: str
    created_at: float
    url: str
    events: list[str]
    disabled_at: Optional[float]
    disabled_reason: Optional[str]
    owner: Optional[str] = None


@dataclass(frozen=True)
class DueDelivery:
    id: str  # the webhook-id header, the same on every attempt
    webhook_id: str
    url: str
    secret: str
    payload: str
    attempts: int  # made so far
    created_at: float


@dataclass(frozen=True)
class Attempt:
    number: int
    at: float
    status_code: Optional[int]
    error: Optional[str]
    duration: float


@dataclass(frozen=True)
class DeliveryRecord:
    id: str
    webhook_id: str
    event_type: str
    payload: dict[str, Any]
    created_at: float
    state: str
    next_attempt_at: Optional[float]
    last_error: Optional[str]
    attempts: list[Attempt]


def event_body(event_type: str, kind: str, job_id: str, status: dict[str, Any], now: float) -> dict[str, Any]:
    """A delivery's JSON body: OpenAI's event shape `{id, object, created_at, type, data}`;
    OpenAI's own events carry only the job's id in `data`, the studio's its phase too."""
    data: dict[str, Any] = {"id": job_id}
    if not event_type.startswith("fine_tuning."):
        data.update(kind=kind, phase=status.get("phase"))
        details = status.get("details") or {}
        if details.get("error_code"):
            data["error_code"] = details["error_code"]
        if kind == "export":
            data["job_id"] = status.get("job_id")
    return {"id": "evt_" + secrets.token_hex(12), "object": "event", "created_at": int(now), "type": event_type, "data": data}


class WebhookTable:
    """The webhooks' tables on the job store's connection. `enqueue` runs inside the
    caller's transaction; every other write is a transaction of its own through
    `health.writing()`, as every write of the store is."""

    def __init__(self, db: sqlite3.Connection, health: StorageHealth) -> None:
        self._db = db
        self.health = health
        # Called after a transaction that queued a delivery (the dispatcher wakes).
        self.on_queued: Optional[Callable[[], None]] = None

    # -- registrations ------------------------------------------------------

    def add(self, url: str, secret: str, events: list[str]) -> WebhookRecord:
        """A registration, owned by the current request's user (jobs/accounts.py): told of what they see."""
        webhook_id = "wh_" + secrets.token_hex(8)
        now = time.time()
        owner = seen_owner()
        with self.health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            insert_next(self._db, "webhooks", {
                "id": webhook_id, "created_at": now, "url": url, "secret": secret, "events_json": json.dumps(events),
                "owner": owner})
        return WebhookRecord(webhook_id, now, url, events, None, None, owner)

    def all(self) -> list[WebhookRecord]:
        """The registrations the current request's user sees (every one, for an admin)."""
        rows = self._db.execute("SELECT * FROM webhooks ORDER BY seq")
        return [_webhook(row) for row in rows if sees(row["owner"])]

    def get(self, webhook_id: str) -> WebhookRecord:
        """One registration; another user's is not found, as an unknown id is."""
        row = self._db.execute("SELECT * FROM webhooks WHERE id = ?", (webhook_id,)).fetchone()
        if row is None or not sees(row["owner"]):
            raise WebhookNotFound(webhook_id)
        return _webhook(row)

    def delete(self, webhook_id: str) -> None:
        """The registration, its deliveries and their attempts, in one transaction."""
        with self.health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self.get(webhook_id)  # WebhookNotFound: unknown, or another user's
            self._db.execute("DELETE FROM webhooks WHERE id = ?", (webhook_id,))
            self._db.execute(
                "DELETE FROM webhook_attempts WHERE delivery_id IN (SELECT id FROM webhook_deliveries WHERE webhook_id = ?)",
                (webhook_id,),
            )
            self._db.execute("DELETE FROM webhook_deliveries WHERE webhook_id = ?", (webhook_id,))

    # -- the outbox ---------------------------------------------------------

    def enqueue(self, kind: str, job_id: str, status: dict[str, Any], now: float, owner: Optional[str]) -> int:
        """Queue a delivery to every enabled webhook that asked for an event this status
        sends and may see it (`owner`: the object's; see the module's docstring). Inside the
        caller's open transaction (no BEGIN, no commit); returns how many."""
        phase, details = str(status.get("phase")), status.get("details") or {}
        types = [name for name, event in EVENTS.items() if event.kind == kind and event.sent_by(phase, details)]
        if not types:
            return 0
        # The object's owner's registrations get it, and those told of everyone's.
        rows = self._db.execute(
            "SELECT id, events_json FROM webhooks WHERE disabled_at IS NULL AND (owner IS NULL OR owner IS ?)", (owner,)
        ).fetchall()
        queued = 0
        for row in rows:
            wanted = set(json.loads(row[1]))
            for event_type in types:
                if event_type in wanted:
                    self._insert(str(row[0]), event_type, event_body(event_type, kind, job_id, status, now), now)
                    queued += 1
        return queued

    def queued(self) -> None:
        """After a committed transaction that queued deliveries: wake the dispatcher."""
        if self.on_queued is not None:
            self.on_queued()

    def enqueue_test(self, webhook_id: str) -> str:
        """A test event for one webhook (enabled or not: a test is how one checks a fixed target)."""
        now = time.time()
        body = {"id": "evt_" + secrets.token_hex(12), "object": "event", "created_at": int(now), "type": TEST_EVENT,
                "data": {"id": webhook_id}}
        with self.health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self.get(webhook_id)
            delivery_id = self._insert(webhook_id, TEST_EVENT, body, now)
        self.queued()
        return delivery_id

    def _insert(self, webhook_id: str, event_type: str, body: dict[str, Any], now: float) -> str:
        delivery_id = "msg_" + secrets.token_hex(12)
        insert_next(self._db, "webhook_deliveries", {
            "id": delivery_id, "webhook_id": webhook_id, "event_type": event_type,
            "payload": json.dumps(body, separators=(",", ":")), "created_at": now, "state": "pending",
            "next_attempt_at": now})
        return delivery_id

    def due(self, now: float, limit: int) -> list[DueDelivery]:
        """Pending deliveries whose time has come, oldest first: those of enabled webhooks,
        and test events of any."""
        rows = self._db.execute(
            "SELECT d.id, d.webhook_id, w.url, w.secret, d.payload, d.attempts, d.created_at FROM webhook_deliveries d"
            " JOIN webhooks w ON w.id = d.webhook_id"
            " WHERE d.state = 'pending' AND d.next_attempt_at <= ? AND (w.disabled_at IS NULL OR d.event_type = ?)"
            " ORDER BY d.next_attempt_at, d.seq LIMIT ?",
            (now, TEST_EVENT, limit),
        )
        return [DueDelivery(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), int(r[5]), float(r[6])) for r in rows]

    def next_due(self, exclude: Iterable[str] = ()) -> Optional[float]:
        """When the next pending delivery is due, of those not in `exclude` (None: none is pending)."""
        skipped = sorted(exclude)
        row = self._db.execute(
            "SELECT MIN(d.next_attempt_at) FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id"  # noqa: S608 (placeholders only)
            f" WHERE d.state = 'pending' AND (w.disabled_at IS NULL OR d.event_type = ?) AND d.id NOT IN ({','.join('?' * len(skipped))})",
            (TEST_EVENT, *skipped),
        ).fetchone()
        return float(row[0]) if row is not None and row[0] is not None else None

    def record_attempt(
        self,
        delivery: DueDelivery,
        attempt: Attempt,
        next_attempt_at: Optional[float],
        disable_reason: Optional[str] = None,
    ) -> str:
        """Keep one attempt and what follows it, in one transaction: `delivered` (a 2xx),
        else pending until `next_attempt_at`, else `failed`; with `disable_reason` (the
        last attempt of a delivery failed) the webhook is disabled and its other pending
        deliveries fail with the reason. Returns the delivery's state."""
        delivered = attempt.status_code is not None and 200 <= attempt.status_code < 300
        state = "delivered" if delivered else ("pending" if next_attempt_at is not None else "failed")
        error = None if delivered else (attempt.error or f"HTTP {attempt.status_code}")
        with self.health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "INSERT OR REPLACE INTO webhook_attempts (delivery_id, number, at, status_code, error, duration)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (delivery.id, attempt.number, attempt.at, attempt.status_code, attempt.error, attempt.duration),
            )
            self._db.execute(
                "UPDATE webhook_deliveries SET state = ?, attempts = ?, next_attempt_at = ?, last_error = ? WHERE id = ?",
                (state, attempt.number, next_attempt_at if state == "pending" else None, error, delivery.id),
            )
            if disable_reason is not None:
                self._db.execute(
                    "UPDATE webhooks SET disabled_at = ?, disabled_reason = ? WHERE id = ? AND disabled_at IS NULL",
                    (attempt.at, disable_reason, delivery.webhook_id),
                )
                self._db.execute(
                    "UPDATE webhook_deliveries SET state = 'failed', next_attempt_at = NULL, last_error = ?"
                    " WHERE webhook_id = ? AND state = 'pending' AND event_type != ?",
                    (f"not sent: the webhook was disabled ({disable_reason})", delivery.webhook_id, TEST_EVENT),
                )
            if state != "pending":
                self._prune(delivery.webhook_id)
        return state

    def _prune(self, webhook_id: str) -> None:
        old = (
            "SELECT id FROM webhook_deliveries WHERE webhook_id = ? AND state != 'pending'"
            " ORDER BY seq DESC LIMIT -1 OFFSET ?"
        )
        self._db.execute(f"DELETE FROM webhook_attempts WHERE delivery_id IN ({old})", (webhook_id, KEPT_DELIVERIES))  # noqa: S608 (placeholders only)
        self._db.execute(f"DELETE FROM webhook_deliveries WHERE id IN ({old})", (webhook_id, KEPT_DELIVERIES))  # noqa: S608 (placeholders only)

    # -- reads --------------------------------------------------------------

    def deliveries(self, webhook_id: str, limit: int) -> list[DeliveryRecord]:
        """The webhook's newest deliveries, newest first, each with its attempts in order."""
        self.get(webhook_id)
        rows = self._db.execute(
            "SELECT * FROM webhook_deliveries WHERE webhook_id = ? ORDER BY seq DESC LIMIT ?", (webhook_id, limit)
        ).fetchall()
        records = []
        for row in rows:
            attempts = [
                Attempt(int(a["number"]), float(a["at"]), a["status_code"], a["error"], float(a["duration"]))
                for a in self._db.execute(
                    "SELECT * FROM webhook_attempts WHERE delivery_id = ? ORDER BY number", (row["id"],)
                )
            ]
            records.append(
                DeliveryRecord(
                    id=row["id"], webhook_id=row["webhook_id"], event_type=row["event_type"],
                    payload=json.loads(row["payload"]), created_at=row["created_at"], state=row["state"],
                    next_attempt_at=row["next_attempt_at"], last_error=row["last_error"], attempts=attempts,
                )
            )
        return records

    def counts(self) -> dict[tuple[str, str], int]:
        """Deliveries kept, by (webhook id, state): for /metrics."""
        rows = self._db.execute("SELECT webhook_id, state, COUNT(*) FROM webhook_deliveries GROUP BY webhook_id, state")
        return {(str(r[0]), str(r[1])): int(r[2]) for r in rows}


def _webhook(row: sqlite3.Row) -> WebhookRecord:
    return record(WebhookRecord, row, events=as_json("events_json"))
