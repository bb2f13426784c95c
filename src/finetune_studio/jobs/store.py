"""The SQLite store: jobs and their event log, in one WAL database file.

The schema lives here and nowhere else; migrations are numbered by SQLite's
`user_version`. Every phase change is one guarded UPDATE (`transition`) that only
matches a row in an allowed phase, and appends its status event in the same
transaction, so the job row and its event log can never disagree.

The store is used from one thread (the server's event loop); it is plain Python
and imports neither FastAPI nor torch.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_studio.errors import InvalidTransition, JobNotFinished, JobNotFound, StorageFailed
from finetune_studio.failures import StorageHealth
from finetune_studio.jobs.accounts import MIGRATION as ACCOUNTS_MIGRATION
from finetune_studio.jobs.accounts import SESSIONS_MIGRATION, AccountTable, acting_owner, sees
from finetune_studio.jobs.phases import KINDS, PROGRESS_PHASES, TERMINAL, allowed_from
from finetune_studio.jobs.sql import (
    as_bool,
    connect,
    insert_next,
    matching,
    record,
    stored_json,
    stored_text,
    stored_value,
)
from finetune_studio.jobs.sweeps import MIGRATION as SWEEPS_MIGRATION
from finetune_studio.jobs.sweeps import SweepTable
from finetune_studio.jobs.webhooks import MIGRATION as WEBHOOKS_MIGRATION
from finetune_studio.jobs.webhooks import OWNER_MIGRATION as WEBHOOKS_OWNER_MIGRATION
from finetune_studio.jobs.webhooks import WebhookTable

# The phases that take progress events, of any kind (no two kinds' overlap wrongly:
# a training job is never `merging`, an export never `training`).
_PROGRESS_PHASES: tuple[str, ...] = tuple(sorted(frozenset().union(*PROGRESS_PHASES.values())))
_PROGRESS_MARKS = ",".join("?" * len(_PROGRESS_PHASES))
# The guard of resume: the job's terminal status says it was paused (JSON true reads as 1).
_PAUSED = " AND json_extract(status_json, '$.details.paused') = 1"

MIGRATIONS: tuple[str, ...] = (
    # 1: jobs and events
    """
    CREATE TABLE jobs (
        id              TEXT PRIMARY KEY,
        seq             INTEGER NOT NULL UNIQUE,
        created_at      REAL NOT NULL,
        updated_at      REAL NOT NULL,
        phase           TEXT NOT NULL,
        status_json     TEXT NOT NULL,
        progress_json   TEXT,
        request_json    TEXT NOT NULL,
        output_dir      TEXT NOT NULL,
        worker_pid      INTEGER,
        stop_requested  INTEGER NOT NULL DEFAULT 0,
        last_event_id   INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_phase_seq ON jobs (phase, seq);
    CREATE TABLE events (
        job_id      TEXT NOT NULL REFERENCES jobs (id),
        id          INTEGER NOT NULL,
        kind        TEXT NOT NULL CHECK (kind IN ('status', 'progress')),
        data        TEXT NOT NULL,
        created_at  REAL NOT NULL,
        PRIMARY KEY (job_id, id)
    ) WITHOUT ROWID;
    """,
    # 2: job kinds (jobs/phases.py): every job so far is a training job; exports are jobs too
    """
    ALTER TABLE jobs ADD COLUMN kind TEXT NOT NULL DEFAULT 'train';
    CREATE INDEX jobs_kind_phase_seq ON jobs (kind, phase, seq);
    """,
    # 3: the one file store (finetune_studio/files/: /v1/files and the page's uploads),
    # and pause (a stop that leaves the job resumable: jobs/phases.py)
    """
    CREATE TABLE files (
        id          TEXT PRIMARY KEY,
        seq         INTEGER NOT NULL UNIQUE,
        created_at  REAL NOT NULL,
        purpose     TEXT NOT NULL,
        filename    TEXT NOT NULL,
        bytes       INTEGER NOT NULL,
        path        TEXT NOT NULL,
        facts_json  TEXT NOT NULL
    );
    CREATE INDEX files_purpose_seq ON files (purpose, seq);
    ALTER TABLE jobs ADD COLUMN pause_requested INTEGER NOT NULL DEFAULT 0;
    """,
    # 4: one row the server rewrites to learn whether writes get through again (JobStore.probe_write)
    """
    CREATE TABLE write_probe (id INTEGER PRIMARY KEY CHECK (id = 1), at REAL NOT NULL);
    """,
    # 5: a finished evaluation's results (the table of metrics) and its per-sample rows (jobs of kind `eval`)
    """
    CREATE TABLE eval_results (
        eval_id       TEXT PRIMARY KEY,
        created_at    REAL NOT NULL,
        results_json  TEXT NOT NULL
    );
    CREATE TABLE eval_samples (
        eval_id    TEXT NOT NULL,
        seq        INTEGER NOT NULL,
        suite      TEXT NOT NULL,
        idx        INTEGER NOT NULL,
        data_json  TEXT NOT NULL,
        PRIMARY KEY (eval_id, seq)
    ) WITHOUT ROWID;
    CREATE INDEX eval_samples_suite ON eval_samples (eval_id, suite, seq);
    """,
    # 6: webhooks and their outbox (jobs/webhooks.py): a delivery is written in the transaction of its status
    WEBHOOKS_MIGRATION,
    # 7: sweeps, their trials and their event log (jobs/sweeps.py; Optuna's study is in sweeps.db)
    SWEEPS_MIGRATION,
    # 8: accounts (jobs/accounts.py): users, API keys, the audit log; every job's and file's owner
    ACCOUNTS_MIGRATION,
    # 9: the page's sessions (jobs/accounts.py): a sign-in with a password, kept as an HMAC
    SESSIONS_MIGRATION,
    # 10: a webhook's owner (jobs/webhooks.py)
    WEBHOOKS_OWNER_MIGRATION,
)


# Job owners `JobStore.owner_of` keeps, at most (past it, it starts again).
MAX_KEPT_OWNERS = 4096


@dataclass(frozen=True, slots=True)
class StoredEvent:
    job_id: str
    id: int
    kind: str  # "status" | "progress"
    data: str  # the JSON payload, serialized once

    @property
    def is_terminal_status(self) -> bool:
        return self.kind == "status" and json.loads(self.data)["phase"] in TERMINAL


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: str
    seq: int
    created_at: float
    phase: str
    status: dict[str, Any]
    progress: Optional[dict[str, Any]]
    request: dict[str, Any]
    output_dir: str
    worker_pid: Optional[int]
    stop_requested: bool
    last_event_id: int
    kind: str = "train"  # jobs/phases.py JobKind
    pause_requested: bool = False  # the stop asked for is a pause (it ends `stopped` with details.paused)
    owner: Optional[str] = None  # the user who made it (jobs/accounts.py); None: made before accounts, or single-user


class JobStore:
    """Jobs and their events in SQLite. Every write passes `health.writing()`: one that
    fails for the storage's sake (a full disk, a read-only file system, a locked
    database) raises `StorageFailed` and marks the data dir unhealthy until a write
    gets through again (`/health` says `degraded` meanwhile)."""

    def __init__(self, path: Path, health: Optional[StorageHealth] = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.health = health or StorageHealth()
        # Statuses the store could not write, shown by every read until they are (see `hold`).
        self._held: dict[str, dict[str, Any]] = {}
        # job id -> its owner, as `owner_of` read it (a job's owner never changes; a deleted job's goes).
        self._owners: dict[str, Optional[str]] = {}
        self._db = connect(path)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a crash of this process; only power loss can
        # lose the last transactions.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()
        # Webhooks' registrations and outbox; a status write below queues its deliveries.
        self.webhooks = WebhookTable(self._db, self.health)
        # Sweeps (POST /sweeps): their rows, trials and events; a status write queues its webhooks too.
        self.sweeps: SweepTable = SweepTable(self._db, self.health, self.webhooks)

    def accounts(self, secret: bytes) -> AccountTable:
        """Users, keys and the audit log on this store's connection (accounts on only)."""
        return AccountTable(self._db, self.health, secret)

    def close(self) -> None:
        self._db.close()

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            self._db.executescript(f"BEGIN; {script}; PRAGMA user_version = {number:d}; COMMIT;")

    # -- writes -------------------------------------------------------------

    def create_job(
        self, job_id: str, request: dict[str, Any], output_dir: str, status: dict[str, Any], kind: str = "train",
        owner: Optional[str] = None,
    ) -> StoredEvent:
        """Insert a queued (`idle`) job of `kind` and its first status event (id 1), owned by
        `owner` (None: the current request's user, jobs/accounts.py; none in single-user mode)."""
        owner = owner if owner is not None else acting_owner()
        if kind not in KINDS:
            raise ValueError(f"unknown job kind {kind!r} (kinds: {', '.join(KINDS)})")
        now = time.time()
        data = stored_json(status)
        with self.health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            insert_next(self._db, "jobs", {
                "id": job_id, "created_at": now, "updated_at": now, "phase": "idle", "status_json": data,
                "request_json": stored_json(request), "output_dir": output_dir, "last_event_id": 1, "kind": kind,
                "owner": owner})
            self._db.execute(
                "INSERT INTO events (job_id, id, kind, data, created_at) VALUES (?, 1, 'status', ?, ?)",
                (job_id, data, now),
            )
            queued = self.webhooks.enqueue(kind, job_id, status, now, owner)
        if queued:
            self.webhooks.queued()
        return StoredEvent(job_id, 1, "status", data)

    def transition(self, job_id: str, status: dict[str, Any], request: Optional[dict[str, Any]] = None) -> StoredEvent:
        """Move a job to `status["phase"]` if its kind's state machine allows it from where it is.

        Resume (`stopped` -> `idle`, the one edge out of a terminal phase) is taken only
        by a paused job (`details.paused`); it clears the stop the job ended with, and
        may store the request it runs with now (`request`).

        Raises InvalidTransition (naming both phases) when it does not, and
        JobNotFound for an unknown id.
        """
        target = status["phase"]
        now = time.time()
        data = stored_json(status)
        with self.health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            kind = self._kind_of(job_id)
            allowed = sorted(allowed_from(target, kind))
            if not allowed:
                raise InvalidTransition(f"job {job_id} cannot go to {target!r}: no phase of a {kind} job leads there")
            marks = ",".join("?" * len(allowed))
            resets, guard, values = "", "", []
            if target == "idle" and kind == "train":  # resume (an export's idle -> idle is a new message)
                resets, guard = ", stop_requested = 0, pause_requested = 0, worker_pid = NULL", _PAUSED
            if request is not None:
                resets += ", request_json = ?"
                values.append(stored_json(request))
            row = self._db.execute(
                f"UPDATE jobs SET phase = ?, status_json = ?, updated_at = ?, last_event_id = last_event_id + 1{resets}"  # noqa: S608 (placeholders only)
                f" WHERE id = ? AND phase IN ({marks}){guard} RETURNING last_event_id",
                (target, data, now, *values, job_id, *allowed),
            ).fetchone()
            if row is None:
                current = self._phase_of(job_id)
                why = ": only a paused job resumes" if target == "idle" and current in allowed else ""
                raise InvalidTransition(f"job {job_id} cannot go from {current} to {target}{why}")
            event_id = row[0]
            self._db.execute(
                "INSERT INTO events (job_id, id, kind, data, created_at) VALUES (?, ?, 'status', ?, ?)",
                (job_id, event_id, data, now),
            )
            queued = self.webhooks.enqueue(kind, job_id, status, now, self.owner_of(job_id))
        self._held.pop(job_id, None)
        if queued:
            self.webhooks.queued()
        return StoredEvent(job_id, event_id, "status", data)

    def append_progress(self, job_id: str, progress: dict[str, Any]) -> Optional[StoredEvent]:
        """Record one step's metrics; only a job in a phase that has steps takes them
        (`training`; an export's merging, converting, quantizing), else None."""
        now = time.time()
        data = stored_json(progress)
        with self.health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute(
                "UPDATE jobs SET progress_json = ?, updated_at = ?, last_event_id = last_event_id + 1"  # noqa: S608 (placeholders only)
                f" WHERE id = ? AND phase IN ({_PROGRESS_MARKS}) RETURNING last_event_id",
                (data, now, job_id, *_PROGRESS_PHASES),
            ).fetchone()
            if row is None:
                return None
            self._db.execute(
                "INSERT INTO events (job_id, id, kind, data, created_at) VALUES (?, ?, 'progress', ?, ?)",
                (job_id, row[0], data, now),
            )
        return StoredEvent(job_id, row[0], "progress", data)

    def set_worker_pid(self, job_id: str, pid: Optional[int]) -> None:
        with self.health.writing():
            self._db.execute("UPDATE jobs SET worker_pid = ? WHERE id = ?", (pid, job_id))

    def set_stop_requested(self, job_id: str, pause: bool = False) -> None:
        """Record a stop; with `pause`, one that leaves the job resumable (the latest request wins)."""
        with self.health.writing():
            self._db.execute(
                "UPDATE jobs SET stop_requested = 1, pause_requested = ? WHERE id = ?",
                (int(pause), job_id),
            )

    def set_project_name(self, job_id: str, project_name: Optional[str]) -> None:
        """Rename a job: the label in its stored request and in its current status (no
        event: a label is no phase change). JobNotFound for an unknown id."""
        with self.health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute(
                "UPDATE jobs SET request_json = json_set(request_json, '$.project_name', ?),"
                " status_json = json_set(status_json, '$.details.project_name', ?) WHERE id = ? RETURNING id",
                (project_name, project_name, job_id),
            ).fetchone()
            if row is None:
                raise JobNotFound(job_id)

    def delete_jobs(self, job_ids: list[str]) -> None:
        """Remove finished jobs and their events in one transaction: all of them, or
        none if any is unknown or not in a terminal phase (JobNotFinished, naming it)."""
        marks = ",".join("?" * len(TERMINAL))
        with self.health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            for job_id in job_ids:
                phase = self._phase_of(job_id)
                if phase not in TERMINAL:
                    raise JobNotFinished(f"job {job_id} is {phase}: stop it first, or wait until it has finished")
            for job_id in job_ids:
                self._owners.pop(job_id, None)
                self._db.execute("DELETE FROM events WHERE job_id = ?", (job_id,))
                self._db.execute("DELETE FROM eval_results WHERE eval_id = ?", (job_id,))
                self._db.execute("DELETE FROM eval_samples WHERE eval_id = ?", (job_id,))
                self._db.execute(
                    f"DELETE FROM jobs WHERE id = ? AND phase IN ({marks})",  # noqa: S608 (placeholders only)
                    (job_id, *sorted(TERMINAL)),
                )

    def save_eval_results(self, eval_id: str, results: dict[str, Any], samples: Iterable[dict[str, Any]]) -> int:
        """Keep a finished evaluation's results and its per-sample rows (each with `suite` and
        `index`), replacing any kept before, in one transaction; returns the rows kept."""
        now = time.time()
        count = 0
        with self.health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM eval_samples WHERE eval_id = ?", (eval_id,))
            self._db.execute(
                "INSERT INTO eval_results (eval_id, created_at, results_json) VALUES (?, ?, ?)"
                " ON CONFLICT (eval_id) DO UPDATE SET created_at = excluded.created_at, results_json = excluded.results_json",
                (eval_id, now, stored_json(results)),
            )
            for count, row in enumerate(samples, start=1):
                self._db.execute(
                    "INSERT INTO eval_samples (eval_id, seq, suite, idx, data_json) VALUES (?, ?, ?, ?, ?)",
                    (eval_id, count, str(row.get("suite", "")), int(row.get("index", 0)), stored_json(row)),
                )
        return count

    def eval_results(self, eval_id: str) -> Optional[dict[str, Any]]:
        """A finished evaluation's results as kept (None: none were kept)."""
        row = self._db.execute("SELECT results_json FROM eval_results WHERE eval_id = ?", (eval_id,)).fetchone()
        return stored_value(row[0]) if row is not None else None

    def eval_samples(
        self, eval_id: str, suite: Optional[str] = None, offset: int = 0, limit: int = 100
    ) -> tuple[list[dict[str, Any]], int]:
        """A page of an evaluation's per-sample rows (of one suite, or of all in order), and how many there are."""
        where, params = matching({"eval_id": eval_id, "suite": suite})
        total = int(self._db.execute(f"SELECT COUNT(*) FROM eval_samples WHERE {where}", params).fetchone()[0])  # noqa: S608 (placeholders only)
        rows = self._db.execute(
            f"SELECT data_json FROM eval_samples WHERE {where} ORDER BY seq LIMIT ? OFFSET ?",  # noqa: S608 (placeholders only)
            (*params, limit, offset),
        )
        return [stored_value(row[0]) for row in rows], total

    def probe_write(self) -> bool:
        """Write one small row: True when it got through (and the health is `ok` again),
        False when it failed for the storage's sake (the health keeps the fault)."""
        try:
            with self.health.writing(), self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute(
                    "INSERT INTO write_probe (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = excluded.at",
                    (time.time(),),
                )
        except StorageFailed:
            return False
        return True

    def hold(self, job_id: str, status: Optional[dict[str, Any]]) -> None:
        """Show `status` (a terminal one that could not be written) as the job's own in
        every read, and no longer list the job as queued, until a transition of the job
        is written (or `status` is None). Held in memory only: a restart forgets it, and
        recovery ends the job from what is stored."""
        if status is None:
            self._held.pop(job_id, None)
        else:
            self._held[job_id] = status

    def _record(self, row: sqlite3.Row) -> JobRecord:
        record = _record(row)
        held = self._held.get(record.id)
        if held is None:
            return record
        return dataclasses.replace(record, phase=str(held["phase"]), status=held)

    # -- reads --------------------------------------------------------------

    def _kind_of(self, job_id: str) -> str:
        row = self._db.execute("SELECT kind FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(job_id)
        return str(row[0])

    def _phase_of(self, job_id: str) -> str:
        row = self._db.execute("SELECT phase FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(job_id)
        return str(row[0])

    def status_json(self, job_id: str, kind: Optional[str] = None) -> tuple[str, str]:
        """The job's phase and its current status as stored JSON (no parsing); with
        `kind`, a job of another kind is not found (a training id under /export/)."""
        row = self._db.execute("SELECT phase, status_json, kind FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None or (kind is not None and row[2] != kind):
            raise JobNotFound(job_id)
        held = self._held.get(job_id)
        if held is not None:
            return str(held["phase"]), stored_json(held)
        return str(row[0]), stored_text(str(row[1]))

    def get_job(self, job_id: str, kind: Optional[str] = None) -> JobRecord:
        """The job; with `kind`, a job of another kind is not found."""
        row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None or (kind is not None and row["kind"] != kind):
            raise JobNotFound(job_id)
        return self._record(row)

    def get_visible(self, job_id: str, kind: Optional[str] = None) -> JobRecord:
        """The job, as `get_job`, when the current request may see it (jobs/accounts.py `sees`):
        another user's job is not found, exactly as an unknown id."""
        record = self.get_job(job_id, kind)
        if not sees(record.owner):
            raise JobNotFound(job_id)
        return record

    def list_jobs(
        self, kind: Optional[str] = "train", exported_job: Optional[str] = None, owner: Optional[str] = None
    ) -> list[JobRecord]:
        """Jobs of `kind` (None: every kind), newest first; with `exported_job`, only
        the exports of that training job; with `owner`, only that user's."""
        where, params = matching({"kind": kind, "owner": owner, "json_extract(request_json, '$.job_id')": exported_job})
        query = f"SELECT * FROM jobs WHERE {where} ORDER BY seq DESC"  # noqa: S608 (placeholders only)
        return [self._record(row) for row in self._db.execute(query, params)]

    def phase_counts(self) -> dict[tuple[str, str], int]:
        """How many jobs are in each (kind, phase): for /metrics."""
        rows = self._db.execute("SELECT kind, phase, COUNT(*) FROM jobs GROUP BY kind, phase")
        return {(str(r[0]), str(r[1])): int(r[2]) for r in rows}

    def queued_job_ids(self, kind: Optional[str] = "train") -> list[str]:
        """Jobs of `kind` (None: every kind) waiting to run, first in first out."""
        return [job_id for job_id, _ in self.queued_jobs(kind)]

    def queued_jobs(self, kind: Optional[str] = "train") -> list[tuple[str, Optional[str]]]:
        """(id, owner) of the jobs of `kind` (None: every kind) waiting to run, first in first out."""
        if kind is None:
            rows = self._db.execute("SELECT id, owner FROM jobs WHERE phase = 'idle' ORDER BY seq")
        else:
            rows = self._db.execute("SELECT id, owner FROM jobs WHERE kind = ? AND phase = 'idle' ORDER BY seq", (kind,))
        return [(str(row[0]), row[1]) for row in rows if str(row[0]) not in self._held]

    def owner_of(self, job_id: str) -> Optional[str]:
        """The job's owner (None: none recorded); JobNotFound for an unknown id. Kept once read
        (at most MAX_KEPT_OWNERS): every request with accounts on asks it of the ids in its path."""
        if job_id in self._owners:
            return self._owners[job_id]
        row = self._db.execute("SELECT owner FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(job_id)
        if len(self._owners) >= MAX_KEPT_OWNERS:
            self._owners.clear()
        owner = self._owners[job_id] = None if row[0] is None else str(row[0])
        return owner

    def unfinished_jobs(self) -> list[JobRecord]:
        marks = ",".join("?" * len(TERMINAL))
        rows = self._db.execute(
            f"SELECT * FROM jobs WHERE phase NOT IN ({marks}) ORDER BY seq",  # noqa: S608 (placeholders only)
            tuple(sorted(TERMINAL)),
        )
        return [self._record(row) for row in rows]

    def progress_points(
        self, job_id: str
    ) -> list[tuple[int, Optional[float], Optional[float], Optional[int], Optional[float], Optional[float]]]:
        """(step, loss, eval_loss, num_tokens, tokens_per_second, mfu) of each of the job's
        progress events, in order, read in SQL (no event is parsed in Python): for the run summary."""
        rows = self._db.execute(
            "SELECT json_extract(data, '$.step'), json_extract(data, '$.loss'), json_extract(data, '$.eval_loss'),"
            " json_extract(data, '$.num_tokens'), json_extract(data, '$.tokens_per_second'), json_extract(data, '$.mfu')"
            " FROM events WHERE job_id = ? AND kind = 'progress' ORDER BY id",
            (job_id,),
        )
        return [
            (int(r[0]), _float(r[1]), _float(r[2]), int(r[3]) if r[3] is not None else None, _float(r[4]), _float(r[5]))
            for r in rows
            if r[0] is not None
        ]

    def queued_at(self, job_id: str) -> Optional[float]:
        """`details.time` of the job's first status (`idle`, event 1)."""
        row = self._db.execute(
            "SELECT json_extract(data, '$.details.time') FROM events WHERE job_id = ? AND id = 1", (job_id,)
        ).fetchone()
        return _float(row[0]) if row is not None else None

    def events_before(self, job_id: str, before_id: Optional[int], limit: int) -> list[StoredEvent]:
        """Up to `limit` of the job's events with an id below `before_id` (None: from the
        last), newest first: OpenAI's event list pages backwards with an `after` cursor."""
        rows = self._db.execute(
            "SELECT id, kind, data FROM events WHERE job_id = ? AND id < ? ORDER BY id DESC LIMIT ?",
            (job_id, before_id if before_id is not None else 2**63 - 1, limit),
        )
        return [StoredEvent(job_id, int(r[0]), str(r[1]), stored_text(str(r[2]))) for r in rows]

    def progress_at(self, job_id: str, step: int) -> Optional[dict[str, Any]]:
        """The job's progress event of optimizer step `step` (the latest, should there be two)."""
        row = self._db.execute(
            "SELECT data FROM events WHERE job_id = ? AND kind = 'progress' AND json_extract(data, '$.step') = ?"
            " ORDER BY id DESC LIMIT 1",
            (job_id, step),
        ).fetchone()
        return stored_value(row[0]) if row is not None else None

    def events_after(
        self, job_id: str, after_id: int, limit: int = 1000, max_bytes: Optional[int] = None, row_overhead: int = 0
    ) -> list[StoredEvent]:
        """Up to `limit` events after `after_id`; with `max_bytes`, the page ends with
        the event that brings it to that many bytes, each event counting its data and
        `row_overhead` (the caller's framing); rows past it are not read."""
        rows = self._db.execute(
            "SELECT id, kind, data FROM events WHERE job_id = ? AND id > ? ORDER BY id LIMIT ?",
            (job_id, after_id, limit),
        )
        if max_bytes is None:
            return [StoredEvent(job_id, int(r[0]), str(r[1]), stored_text(str(r[2]))) for r in rows]
        page: list[StoredEvent] = []
        size = 0
        for row in rows:
            page.append(StoredEvent(job_id, int(row[0]), str(row[1]), stored_text(str(row[2]))))
            size += len(row[2]) + row_overhead
            if size >= max_bytes:
                break
        return page


def _float(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) else None


# How `_record` reads the columns that are not its fields as they are (made once: every list reads many rows).
_JOB_READERS: dict[str, Callable[[sqlite3.Row], Any]] = {
    "status": lambda row: stored_value(row["status_json"]),
    "progress": lambda row: stored_value(row["progress_json"]) if row["progress_json"] else None,
    "request": lambda row: stored_value(row["request_json"]),
    "stop_requested": as_bool("stop_requested"),
    "pause_requested": as_bool("pause_requested"),
}


def _record(row: sqlite3.Row) -> JobRecord:
    return record(JobRecord, row, **_JOB_READERS)
