"""Sweeps' rows, their trials and their event log, in the job store's SQLite file (migration 7).

A sweep (POST /sweeps; supervisor/sweeps.py drives it) has a status (`queued`, `running`,
`completed`, `stopped`, `error`: schemas.SweepState), one row per trial (the training job
that ran it, the values Optuna chose, its state and objective value, whether it counts
towards the sweep's `trials`), and an event log with ids 1, 2, 3, ... as a job's: `status`
events (the sweep's own status) and `trial` events (a trial started, reported, was pruned,
finished, or was queued again after a restart). Each write and its event are one
transaction, and a status or a trial's end queues its webhooks' deliveries in it
(jobs/webhooks.py EVENTS, kinds `sweep` and `sweep_trial`). Optuna's study itself lives in
its own storage (`wire.DataDir.sweeps_db`).

Plain Python (the standard library); used from the server's event loop thread only.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Optional

from finetune_studio.errors import InvalidTransition, SweepNotFound
from finetune_studio.failures import StorageHealth
from finetune_studio.jobs.phases import TERMINAL
from finetune_studio.jobs.sql import as_bool, as_json, insert_next, record, stored_json
from finetune_studio.jobs.webhooks import WebhookTable

MIGRATION = """
CREATE TABLE sweeps (
    id             TEXT PRIMARY KEY,
    seq            INTEGER NOT NULL UNIQUE,
    created_at     REAL NOT NULL,
    updated_at     REAL NOT NULL,
    status         TEXT NOT NULL,
    status_json    TEXT NOT NULL,
    spec_json      TEXT NOT NULL,
    last_event_id  INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE sweep_events (
    sweep_id    TEXT NOT NULL,
    id          INTEGER NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('status', 'trial')),
    data        TEXT NOT NULL,
    created_at  REAL NOT NULL,
    PRIMARY KEY (sweep_id, id)
) WITHOUT ROWID;
CREATE TABLE sweep_trials (
    sweep_id     TEXT NOT NULL,
    number       INTEGER NOT NULL,
    job_id       TEXT NOT NULL,
    params_json  TEXT NOT NULL,
    state        TEXT NOT NULL,
    value        REAL,
    steps        INTEGER,
    counted      INTEGER NOT NULL DEFAULT 0,
    requeued     INTEGER NOT NULL DEFAULT 0,
    prune_at     INTEGER,
    interrupted  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sweep_id, number)
) WITHOUT ROWID;
CREATE INDEX sweep_trials_job ON sweep_trials (job_id);
"""
# A trial's states: `queued` and `running` while its job has not ended (schemas.TrialState).
OPEN_TRIAL_STATES = ("queued", "running")
# Where a sweep's spec keeps its maker (with accounts on): {name, admin}; None in single-user mode.
OWNER = "owner"


def owner_name(spec: dict[str, Any]) -> Optional[str]:
    """The name of a sweep's maker, from its spec (None: made in single-user mode, the admins')."""
    owner = spec.get(OWNER)
    return str(owner["name"]) if isinstance(owner, dict) else None


@dataclass(frozen=True)
class SweepRecord:
    id: str
    created_at: float
    status: str
    status_json: dict[str, Any]
    spec: dict[str, Any]  # the SweepCreate as admitted (the base request redacted, the space, the objective, ...)
    last_event_id: int

    @property
    def owner(self) -> Optional[str]:
        return owner_name(self.spec)


@dataclass(frozen=True)
class TrialRecord:
    sweep_id: str
    number: int
    job_id: str
    params: dict[str, Any]
    state: str
    value: Optional[float]
    steps: Optional[int]
    counted: bool
    requeued: bool
    prune_at: Optional[int]  # the step at which the sweep stopped it for the pruner (its end is `pruned`)
    interrupted: bool = False  # its server shut down while it ran (its end then is the shutdown's, not its own)

    def public(self) -> dict[str, Any]:
        """As GET /sweeps/{id} and the `trial` events show it (schemas.SweepTrial)."""
        return {"number": self.number, "job_id": self.job_id, "params": self.params, "value": self.value,
                "state": self.state, "steps": self.steps, "requeued": self.requeued}


class SweepTable:
    """The sweeps' tables on the job store's connection; every write is one transaction
    through `health.writing()`, as every write of the store is."""

    def __init__(self, db: sqlite3.Connection, health: StorageHealth, webhooks: WebhookTable) -> None:
        self._db = db
        self.health = health
        self._webhooks = webhooks

    # -- writes -------------------------------------------------------------

    def create(self, sweep_id: str, spec: dict[str, Any], status: dict[str, Any]) -> tuple[int, str]:
        """Insert a sweep and its first status (event 1)."""
        now = time.time()
        data = stored_json(status)
        with self.health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            insert_next(self._db, "sweeps", {
                "id": sweep_id, "created_at": now, "updated_at": now, "status": status["status"], "status_json": data,
                "spec_json": stored_json(spec), "last_event_id": 1})
            self._event(sweep_id, 1, "status", data, now)
            queued = self._webhooks.enqueue("sweep", sweep_id, {"phase": status["status"], "details": {}}, now, owner_name(spec))
        if queued:
            self._webhooks.queued()
        return 1, data

    def set_status(self, sweep_id: str, status: dict[str, Any]) -> tuple[int, str]:
        """The sweep's new status, from any status but a terminal one (InvalidTransition)."""
        now = time.time()
        data = stored_json(status)
        marks = ",".join("?" * len(TERMINAL))
        with self.health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute(
                "UPDATE sweeps SET status = ?, status_json = ?, updated_at = ?, last_event_id = last_event_id + 1"  # noqa: S608 (placeholders only)
                f" WHERE id = ? AND status NOT IN ({marks}) RETURNING last_event_id",
                (status["status"], data, now, sweep_id, *sorted(TERMINAL)),
            ).fetchone()
            if row is None:
                current = self.get(sweep_id).status
                raise InvalidTransition(f"sweep {sweep_id} has ended ({current}); it cannot become {status['status']}")
            self._event(sweep_id, row[0], "status", data, now)
            queued = self._webhooks.enqueue("sweep", sweep_id, {"phase": status["status"], "details": {}}, now,
                                            self.get(sweep_id).owner)
        if queued:
            self._webhooks.queued()
        return int(row[0]), data

    def add_trial(self, sweep_id: str, number: int, job_id: str, params: dict[str, Any]) -> tuple[int, str]:
        """A trial's job was queued: its row (`queued`) and its `trial` event (`started`)."""
        with self.health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "INSERT INTO sweep_trials (sweep_id, number, job_id, params_json, state) VALUES (?, ?, ?, ?, 'queued')",
                (sweep_id, number, job_id, stored_json(params)),
            )
            return self._trial_event(sweep_id, number, "started", time.time())

    def update_trial(
        self, sweep_id: str, number: int, event: str, *, state: Optional[str] = None, value: Optional[float] = None,
        steps: Optional[int] = None, counted: Optional[bool] = None, requeued: Optional[bool] = None,
        interrupted: Optional[bool] = None,
        prune_at: Optional[int] = None, report: Optional[dict[str, Any]] = None,
    ) -> tuple[int, str]:
        """Change a trial's row (the arguments given) and log a `trial` event named `event`;
        a trial's end (`complete`, `pruned`, `failed`) queues its webhooks' deliveries."""
        sets, values = [], []
        for column, given in (("state", state), ("value", value), ("steps", steps), ("prune_at", prune_at)):
            if given is not None:
                sets.append(f"{column} = ?")
                values.append(given)
        for column, flag in (("counted", counted), ("requeued", requeued), ("interrupted", interrupted)):
            if flag is not None:
                sets.append(f"{column} = ?")
                values.append(int(flag))
        now = time.time()
        with self.health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            if sets:
                self._db.execute(
                    f"UPDATE sweep_trials SET {', '.join(sets)} WHERE sweep_id = ? AND number = ?",  # noqa: S608 (columns are ours)
                    (*values, sweep_id, number),
                )
            written = self._trial_event(sweep_id, number, event, now, report)
            queued = 0
            if state in ("complete", "pruned", "failed"):
                queued = self._webhooks.enqueue("sweep_trial", sweep_id, {"phase": state, "details": {}}, now,
                                                self.get(sweep_id).owner)
        if queued:
            self._webhooks.queued()
        return written

    def _trial_event(
        self, sweep_id: str, number: int, event: str, now: float, report: Optional[dict[str, Any]] = None
    ) -> tuple[int, str]:
        trial = self.trial(sweep_id, number)
        payload = {"sweep_id": sweep_id, "event": event, **trial.public(), **({"report": report} if report else {})}
        row = self._db.execute(
            "UPDATE sweeps SET last_event_id = last_event_id + 1, updated_at = ? WHERE id = ? RETURNING last_event_id",
            (now, sweep_id),
        ).fetchone()
        data = stored_json(payload)
        self._event(sweep_id, row[0], "trial", data, now)
        return int(row[0]), data

    def _event(self, sweep_id: str, event_id: int, kind: str, data: str, now: float) -> None:
        self._db.execute(
            "INSERT INTO sweep_events (sweep_id, id, kind, data, created_at) VALUES (?, ?, ?, ?, ?)",
            (sweep_id, event_id, kind, data, now),
        )

    # -- reads --------------------------------------------------------------

    def get(self, sweep_id: str) -> SweepRecord:
        row = self._db.execute("SELECT * FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
        if row is None:
            raise SweepNotFound(sweep_id)
        return _sweep(row)

    def list_sweeps(self, limit: int, unfinished_only: bool = False) -> list[SweepRecord]:
        """The newest sweeps first (every unfinished one, oldest first, with `unfinished_only`)."""
        if unfinished_only:
            marks = ",".join("?" * len(TERMINAL))
            rows = self._db.execute(
                f"SELECT * FROM sweeps WHERE status NOT IN ({marks}) ORDER BY seq LIMIT ?",  # noqa: S608 (placeholders only)
                (*sorted(TERMINAL), limit),
            ).fetchall()
        else:
            rows = self._db.execute("SELECT * FROM sweeps ORDER BY seq DESC LIMIT ?", (limit,)).fetchall()
        return [_sweep(row) for row in rows]

    def trials(self, sweep_id: str) -> list[TrialRecord]:
        rows = self._db.execute("SELECT * FROM sweep_trials WHERE sweep_id = ? ORDER BY number", (sweep_id,)).fetchall()
        return [_trial(row) for row in rows]

    def trial(self, sweep_id: str, number: int) -> TrialRecord:
        row = self._db.execute(
            "SELECT * FROM sweep_trials WHERE sweep_id = ? AND number = ?", (sweep_id, number)
        ).fetchone()
        if row is None:
            raise SweepNotFound(f"{sweep_id} (trial {number})")
        return _trial(row)

    def events_after(self, sweep_id: str, after_id: int, limit: int = 1000) -> list[tuple[int, str, str]]:
        """(id, kind, data) of the sweep's events past `after_id`, oldest first."""
        rows = self._db.execute(
            "SELECT id, kind, data FROM sweep_events WHERE sweep_id = ? AND id > ? ORDER BY id LIMIT ?",
            (sweep_id, after_id, limit),
        ).fetchall()
        return [(int(row[0]), str(row[1]), str(row[2])) for row in rows]


def _sweep(row: sqlite3.Row) -> SweepRecord:
    return record(SweepRecord, row, status_json=as_json("status_json"), spec=as_json("spec_json"))


def _trial(row: sqlite3.Row) -> TrialRecord:
    return record(TrialRecord, row, params=as_json("params_json"), counted=as_bool("counted"), requeued=as_bool("requeued"),
                  interrupted=as_bool("interrupted"))
