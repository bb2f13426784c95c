"""Accounts: users, their API keys, the page's sessions and the audit log, in the job store's
SQLite file (migrations 8 and 9).

Off by default (`accounts` in docs/SETTINGS.md): a single-user server never reads these
tables. With accounts on, every request names a key (`Authorization: Bearer fts-...`) or a
session (the page's cookie, made by signing in with a name and password); neither is ever
stored, only its HMAC-SHA256 under the server's secret (`DataDir.secret`, a file of mode
0600 made at the first use), so a copy of the database alone opens nothing. A session's
CSRF token is derived from it (another HMAC), so it is stored nowhere either. Passwords
are argon2id hashes (argon2-cffi). The audit table is append-only: triggers refuse every
UPDATE and DELETE of it.

Every job and file row has an `owner` (a user's name); a row made before accounts were
turned on has none, and belongs to the admins (`Principal.sees`).

Plain Python (the standard library and argon2-cffi): the server and the CLI's `users`
commands (which work on the data dir directly) both use it. Used from one thread.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import json
import os
import re
import secrets
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from finetune_studio.errors import Refused, StudioError
from finetune_studio.failures import StorageHealth
from finetune_studio.jobs.sql import insert_next, matching, record

# The one list of scopes a key can hold (api/scopes.py maps every route to one of them).
SCOPES: tuple[str, ...] = ("read", "train", "chat", "files", "admin")
KEY_PREFIX = "fts-"
# secrets.token_urlsafe's argument: bytes of randomness in a key (the issue asks for at least 32).
KEY_BYTES = 32
# How much of a key a list shows (`fts-` and 8 characters): enough to tell keys apart, too little to guess.
SHOWN_PREFIX = len(KEY_PREFIX) + 8
SECRET_BYTES = 32
# A key's `last_used_at` is written at most this often (a write per request would cost every poll).
LAST_USED_EVERY_SECONDS = 60.0
# How long what `lookup` keeps is trusted before it asks SQLite whether another process (the
# CLI's `users remove`) changed the file: a change made through this server is seen at once.
OTHER_WRITERS_SECONDS = 0.05
# secrets.token_urlsafe's argument: bytes of randomness in a session's cookie (at least 32, as a key's).
SESSION_BYTES = 32
# How long a sign-in lasts: then the page asks for the password again.
SESSION_SECONDS = 12 * 3600.0
USER_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
# The name objects from before accounts (owner NULL) and FINETUNE_STUDIO_TOKEN's requests act
# under when no admin has been made yet.
FALLBACK_ADMIN = "admin"

MIGRATION = """
CREATE TABLE users (
    name           TEXT PRIMARY KEY,
    seq            INTEGER NOT NULL UNIQUE,
    created_at     REAL NOT NULL,
    is_admin       INTEGER NOT NULL DEFAULT 0,
    password_hash  TEXT
);
CREATE TABLE api_keys (
    id            TEXT PRIMARY KEY,
    seq           INTEGER NOT NULL UNIQUE,
    user_name     TEXT NOT NULL REFERENCES users (name) ON DELETE CASCADE,
    name          TEXT NOT NULL,
    prefix        TEXT NOT NULL,
    digest        TEXT NOT NULL UNIQUE,
    scopes_json   TEXT NOT NULL,
    created_at    REAL NOT NULL,
    expires_at    REAL,
    last_used_at  REAL,
    revoked_at    REAL
);
CREATE TABLE audit (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    at       REAL NOT NULL,
    actor    TEXT,
    action   TEXT NOT NULL,
    target   TEXT,
    address  TEXT,
    detail   TEXT
);
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
ALTER TABLE jobs ADD COLUMN owner TEXT;
CREATE INDEX jobs_owner_seq ON jobs (owner, seq);
ALTER TABLE files ADD COLUMN owner TEXT;
CREATE INDEX files_owner_seq ON files (owner, seq);
"""


# 9: the page's sessions (a sign-in with a password). `id` is a handle for the server's own
# bookkeeping, never the cookie's value, of which only the HMAC (`digest`) is kept.
SESSIONS_MIGRATION = """
CREATE TABLE sessions (
    id          TEXT PRIMARY KEY,
    digest      TEXT NOT NULL UNIQUE,
    user_name   TEXT NOT NULL REFERENCES users (name) ON DELETE CASCADE,
    created_at  REAL NOT NULL,
    expires_at  REAL NOT NULL
);
CREATE INDEX sessions_user ON sessions (user_name);
"""


class AccountNotFound(StudioError):
    status_code = 404


class AccountRefused(Refused):
    """A user or key request the server will not take (a bad name, an unknown scope): 400, naming the field."""


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: a user (by name), whether an admin, and its key's scopes."""

    name: str
    admin: bool
    scopes: frozenset[str]
    key_id: Optional[str] = None  # None: FINETUNE_STUDIO_TOKEN, or a session
    expires_at: Optional[float] = None
    session_id: Optional[str] = None  # the page's session (SessionRecord.id), signed in with a password

    @property
    def credential(self) -> Optional[str]:
        """The key's or the session's id, whose revocation or end closes what this principal has open."""
        return self.key_id or self.session_id

    def sees(self, owner: Optional[str]) -> bool:
        """Whether this principal may see and act on an object of `owner` (None: made before accounts, the admins')."""
        return self.admin or (owner is not None and owner == self.name)

    @property
    def owner_filter(self) -> Optional[str]:
        """The owner a list is narrowed to: None (every owner) for an admin."""
        return None if self.admin else self.name


# The principal of the request being served (set by api/accounts.py's guard for the request's
# own context only); None in single-user mode and in the server's own tasks.
ACTING: contextvars.ContextVar[Optional[Principal]] = contextvars.ContextVar("finetune_studio_acting", default=None)


def acting_owner() -> Optional[str]:
    """The owner that what the current request creates gets (None: single-user mode)."""
    principal = ACTING.get()
    return principal.name if principal is not None else None


def seen_owner() -> Optional[str]:
    """The owner a list made for the current request is narrowed to (None: everything)."""
    principal = ACTING.get()
    return principal.owner_filter if principal is not None else None


def sees(owner: Optional[str]) -> bool:
    """Whether the current request may see an object of `owner` (always, in single-user mode)."""
    principal = ACTING.get()
    return principal is None or principal.sees(owner)


@dataclass(frozen=True)
class User:
    name: str
    admin: bool
    created_at: float

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "admin": self.admin, "created_at": self.created_at}


@dataclass(frozen=True)
class KeyRecord:
    id: str
    user: str
    name: str
    prefix: str
    scopes: tuple[str, ...]
    created_at: float
    expires_at: Optional[float]
    last_used_at: Optional[float]
    revoked_at: Optional[float]

    def usable(self, now: float) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def to_json(self) -> dict[str, Any]:
        """What a list shows: never the key, nor its digest."""
        return {
            "id": self.id, "user": self.user, "name": self.name, "prefix": self.prefix, "scopes": list(self.scopes),
            "created_at": self.created_at, "expires_at": self.expires_at, "last_used_at": self.last_used_at,
        }


@dataclass(frozen=True)
class SessionRecord:
    id: str
    user: str
    created_at: float
    expires_at: float


def user_scopes(admin: bool) -> frozenset[str]:
    """Every scope a user has (a session's): an admin's include `admin`."""
    return frozenset(SCOPES if admin else (scope for scope in SCOPES if scope != "admin"))


def server_secret(path: Path) -> bytes:
    """The HMAC secret in `path` (`DataDir.secret`), made (32 random bytes, mode 0600) when there is none."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_bytes(SECRET_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first
        return path.read_bytes()
    with os.fdopen(fd, "wb") as out:
        out.write(value)
        out.flush()
        os.fsync(out.fileno())
    return value


def check_user_name(name: str) -> str:
    if not USER_NAME.fullmatch(name):
        raise AccountRefused(
            "name: a user's name is 1 to 64 characters of lower-case letters, digits, '_', '.' and '-',"
            " starting with a letter or digit",
            field="name",
        )
    return name


def check_scopes(scopes: Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(scopes))
    unknown = [scope for scope in chosen if scope not in SCOPES]
    if unknown or not chosen:
        raise AccountRefused(
            f"scopes: {'unknown scope ' + ', '.join(map(repr, unknown)) if unknown else 'none given'};"
            f" a key holds one or more of {', '.join(SCOPES)}",
            field="scopes",
        )
    return chosen


# Keys `AccountTable.lookup` keeps found, at most (past it, it starts again).
MAX_CACHED_KEYS = 4096


class AccountTable:
    """Users, keys and the audit log on the job store's connection (migration 7)."""

    def __init__(self, db: sqlite3.Connection, health: StorageHealth, secret: bytes) -> None:
        self._db = db
        self._health = health
        self._secret = secret
        self._hasher = PasswordHasher()  # argon2id with the library's recommended costs
        # key id -> when its last_used_at was last written (see LAST_USED_EVERY_SECONDS).
        self._touched: dict[str, float] = {}
        # What `lookup` found, by the key itself (held in this process's memory only, as each
        # request holds it; never stored): valid while neither this table changed a key or a user
        # (`_forget`) nor another process committed to the file (SQLite's data_version moves only
        # then: the CLI's `users remove`, say), asked at most once an OTHER_WRITERS_SECONDS, so a
        # revocation holds from the next request on (another process's within that time).
        self._found: dict[str, tuple[KeyRecord, bool, Principal]] = {}
        self._data_version = -1
        self._version_asked = -OTHER_WRITERS_SECONDS

    def digest(self, key: str) -> str:
        return hmac.digest(self._secret, key.encode(), "sha256").hex()  # hmac.new(...).hexdigest(), in one C call

    # -- users --------------------------------------------------------------

    def add_user(self, name: str, password: Optional[str] = None, admin: bool = False) -> User:
        check_user_name(name)
        hashed = self._hasher.hash(password) if password else None
        now = time.time()
        with self._health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            if self._db.execute("SELECT 1 FROM users WHERE name = ?", (name,)).fetchone():
                raise AccountRefused(f"name: a user {name!r} exists already", field="name", status_code=409)
            insert_next(self._db, "users", {"name": name, "created_at": now, "is_admin": int(admin), "password_hash": hashed})
        return User(name, admin, now)

    def remove_user(self, name: str) -> None:
        """Remove a user, their keys and their sessions (their jobs and files stay, seen by the admins)."""
        self._forget()
        with self._health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM api_keys WHERE user_name = ?", (name,))
            self._db.execute("DELETE FROM sessions WHERE user_name = ?", (name,))
            if self._db.execute("DELETE FROM users WHERE name = ? RETURNING name", (name,)).fetchone() is None:
                raise AccountNotFound(f"no user {name!r}: GET /auth/users (or `finetune-studio users list`) lists them")

    def users(self) -> list[User]:
        rows = self._db.execute("SELECT name, is_admin, created_at FROM users ORDER BY seq")
        return [User(str(r[0]), bool(r[1]), float(r[2])) for r in rows]

    def user(self, name: str) -> Optional[User]:
        row = self._db.execute("SELECT name, is_admin, created_at FROM users WHERE name = ?", (name,)).fetchone()
        return User(str(row[0]), bool(row[1]), float(row[2])) if row is not None else None

    def first_admin(self) -> str:
        """The name FINETUNE_STUDIO_TOKEN acts as: the first admin made, else FALLBACK_ADMIN."""
        row = self._db.execute("SELECT name FROM users WHERE is_admin = 1 ORDER BY seq LIMIT 1").fetchone()
        return str(row[0]) if row is not None else FALLBACK_ADMIN

    def password_hash(self, name: str) -> Optional[str]:
        """The argon2id hash of `name`'s password, None for an unknown user or one without a password."""
        row = self._db.execute("SELECT password_hash FROM users WHERE name = ?", (name,)).fetchone()
        return str(row[0]) if row is not None and row[0] else None

    def verify_password(self, stored: Optional[str], password: str) -> bool:
        """Whether `password` matches `stored` (from password_hash); None costs a hash too, so that
        unknown names take a wrong password's time. Reads no table: it may run in another thread."""
        try:
            if stored is None:
                self._hasher.hash(password)
                return False
            return bool(self._hasher.verify(stored, password))
        except (VerificationError, InvalidHashError):
            return False

    # -- keys ---------------------------------------------------------------

    def create_key(
        self, user: str, name: str, scopes: Iterable[str], expires_in_days: Optional[float] = None
    ) -> tuple[KeyRecord, str]:
        """A new key for `user`: its record and the key itself (shown once, never stored)."""
        chosen = check_scopes(scopes)
        if self.user(user) is None:
            raise AccountNotFound(f"no user {user!r}")
        key = KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)
        key_id = "key_" + secrets.token_hex(8)
        now = time.time()
        expires = now + expires_in_days * 86400.0 if expires_in_days is not None else None
        with self._health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            insert_next(self._db, "api_keys", {
                "id": key_id, "user_name": user, "name": name, "prefix": key[:SHOWN_PREFIX], "digest": self.digest(key),
                "scopes_json": json.dumps(chosen), "created_at": now, "expires_at": expires})
        record = self.key(key_id)
        assert record is not None  # noqa: S101 (just written)
        return record, key

    def key(self, key_id: str) -> Optional[KeyRecord]:
        row = self._db.execute("SELECT * FROM api_keys WHERE id = ?", (key_id,)).fetchone()
        return _key(row) if row is not None else None

    def keys(self, user: Optional[str] = None) -> list[KeyRecord]:
        """The keys not revoked (of `user`, or of everyone), newest first."""
        where, params = matching({"user_name": user}, "revoked_at IS NULL")
        query = f"SELECT * FROM api_keys WHERE {where} ORDER BY seq DESC"  # noqa: S608 (placeholders only)
        return [_key(row) for row in self._db.execute(query, params)]

    def revoke_key(self, key_id: str) -> KeyRecord:
        self._forget()
        with self._health.writing():
            row = self._db.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL RETURNING *", (time.time(), key_id)
            ).fetchone()
        if row is None:
            raise AccountNotFound(f"no key {key_id!r}: GET /auth/keys lists them")
        return _key(row)

    def lookup(self, key: str) -> Optional[tuple[KeyRecord, bool, Principal]]:
        """The key's record, whether its user is an admin, and the principal it makes (one HMAC and
        one indexed read, kept), or None for a key no row holds. Revoked and expired keys are
        returned: the caller says why."""
        now = time.monotonic()
        if now - self._version_asked >= OTHER_WRITERS_SECONDS:
            self._version_asked = now
            version = self._db.execute("PRAGMA data_version").fetchone()[0]
            if version != self._data_version:
                self._forget()
                self._data_version = version
        found = self._found.get(key)
        if found is not None:
            return found
        row = self._db.execute(
            "SELECT api_keys.*, users.is_admin FROM api_keys JOIN users ON users.name = api_keys.user_name"
            " WHERE digest = ?",
            (self.digest(key),),
        ).fetchone()
        if row is None:  # not kept: a made-up key must not grow the cache
            return None
        if len(self._found) >= MAX_CACHED_KEYS:
            self._found.clear()
        record, admin = _key(row), bool(row["is_admin"])
        found = self._found[key] = (record, admin, Principal(record.user, admin, frozenset(record.scopes), record.id,
                                                                record.expires_at))
        return found

    def _forget(self) -> None:
        """Drop what `lookup` keeps (a key or a user changed)."""
        self._found.clear()

    def touch(self, key_id: str, now: float) -> None:
        """Record a use of the key, at most once a LAST_USED_EVERY_SECONDS."""
        if now - self._touched.get(key_id, 0.0) < LAST_USED_EVERY_SECONDS:
            return
        self._touched[key_id] = now
        with self._health.writing():
            self._db.execute("UPDATE api_keys SET last_used_at = ? WHERE id = ?", (now, key_id))

    # -- sessions (the page's sign-in) ---------------------------------------

    def create_session(self, user: str) -> tuple[SessionRecord, str]:
        """A new session for `user`: its record and the cookie's value (never stored; only its HMAC is).
        Sessions past their expiry are dropped here, so the table holds live ones only."""
        value = secrets.token_urlsafe(SESSION_BYTES)
        now = time.time()
        record = SessionRecord("ses_" + secrets.token_hex(8), user, now, now + SESSION_SECONDS)
        with self._health.writing(), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM sessions WHERE expires_at <= ?", (now,))
            self._db.execute(
                "INSERT INTO sessions (id, digest, user_name, created_at, expires_at) VALUES (?, ?, ?, ?, ?)",
                (record.id, self.digest(value), user, record.created_at, record.expires_at),
            )
        return record, value

    def session(self, value: str) -> Optional[tuple[SessionRecord, bool]]:
        """The live session a cookie's value names and whether its user is an admin (one HMAC and
        one indexed read), or None (an unknown or expired one: an expired row is dropped)."""
        row = self._db.execute(
            "SELECT sessions.*, users.is_admin FROM sessions JOIN users ON users.name = sessions.user_name"
            " WHERE digest = ?",
            (self.digest(value),),
        ).fetchone()
        if row is None:
            return None
        record = SessionRecord(row["id"], row["user_name"], row["created_at"], row["expires_at"])
        if time.time() >= record.expires_at:
            self.end_session(record.id)
            return None
        return record, bool(row["is_admin"])

    def end_session(self, session_id: str) -> None:
        with self._health.writing():
            self._db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))

    def sessions_of(self, user: str) -> list[str]:
        """The ids of `user`'s sessions."""
        return [str(row[0]) for row in self._db.execute("SELECT id FROM sessions WHERE user_name = ?", (user,))]

    def csrf_token(self, value: str) -> str:
        """The CSRF token of the session whose cookie holds `value`: derived, so stored nowhere."""
        return hmac.new(self._secret, b"csrf\0" + value.encode(), hashlib.sha256).hexdigest()

    # -- audit --------------------------------------------------------------

    def audit(
        self, actor: Optional[str], action: str, target: Optional[str] = None, address: Optional[str] = None,
        detail: Optional[str] = None,
    ) -> None:
        with self._health.writing():
            self._db.execute(
                "INSERT INTO audit (at, actor, action, target, address, detail) VALUES (?, ?, ?, ?, ?, ?)",
                (time.time(), actor, action, target, address, detail),
            )

    def audit_rows(self, after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT seq, at, actor, action, target, address, detail FROM audit WHERE seq > ? ORDER BY seq LIMIT ?",
            (after, limit),
        )
        return [dict(row) for row in rows]


def _key(row: sqlite3.Row) -> KeyRecord:
    return record(KeyRecord, row, user=lambda row: row["user_name"], scopes=lambda row: tuple(json.loads(row["scopes_json"])))
