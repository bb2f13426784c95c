"""Accounts on the server's side (with `accounts` on; jobs/accounts.py holds the tables).

`AccountGuard` (ASGI middleware, in front of the routes like api/auth.py's TokenGuard,
which it replaces) turns a request's `Authorization: Bearer <key>` into the `Principal` it
acts as, set in `ACTING` for the request's own context: a key (one HMAC and one indexed
read), or FINETUNE_STUDIO_TOKEN, which is the first admin's key. A missing, unknown,
revoked or expired key is a 401; an address with too many failures in a minute gets 429
with Retry-After. A key's streams (and its writes) run in a task of their own, which a
revocation, or the key's expiry, cancels: the stream ends there.

`authorize` (a dependency of every API router) then asks the route's scope (api/scopes.py)
and, for a user who is not an admin, the owner of every id in the path: another user's
object answers exactly what an unknown id answers (404, never 403).

Writes that went through are recorded in the audit log (who, what, the id made).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from fastapi import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from finetune_studio.api.auth import under_prefixes
from finetune_studio.api.deps import Studio, studio_of
from finetune_studio.api.openai_errors import is_openai_path
from finetune_studio.api.scopes import OPEN_PATHS, scope_of
from finetune_studio.errors import FileNotFound, JobNotFound, StudioError
from finetune_studio.files.store import file_not_found
from finetune_studio.jobs.accounts import ACTING, SCOPES, AccountTable, KeyRecord, Principal
from finetune_studio.openai_wire import error_body

log = logging.getLogger("finetune_studio")

# Key failures an address may have in FAILURE_WINDOW_SECONDS before it is refused (429) until the window moves.
MAX_FAILURES = 10
FAILURE_WINDOW_SECONDS = 60.0
# Writes not recorded in the audit log: they start, stop, delete or export nothing.
NOT_AUDITED = ("/v1/chat/completions", "/v1/completions", "/datasets/inspect")
# The ids a write's answer may name (what it made), for the audit log; never a key.
_MADE_IDS = ("job_id", "export_id", "eval_id", "sweep_id", "id")
_SNIFFED_BYTES = 16 * 1024


class Forbidden(StudioError):
    """A key without the scope a route needs (403)."""

    status_code = 403


@dataclass(eq=False)  # one per request, kept in sets by identity
class _Watch:
    principal: Principal
    task: asyncio.Future[None]
    fired: bool = False
    timer: Optional[asyncio.TimerHandle] = field(default=None, repr=False)

    def close(self) -> None:
        self.fired = True
        self.task.cancel()


class Accounts:
    """What the guard and the /auth routes share: the table, the token, failures, open requests per key."""

    def __init__(self, table: AccountTable, token: Optional[str]) -> None:
        self.table = table
        self._token = token.encode() if token else None
        self._failures: dict[str, deque[float]] = {}
        self._watches: dict[str, set[_Watch]] = {}

    def authenticate(self, header: bytes) -> Principal | str:
        """The principal of an Authorization header's value, or why there is none (never quoting the key)."""
        scheme, _, given = header.partition(b" ")
        given = given.strip()
        if scheme.lower() != b"bearer" or not given:
            return "missing API key: send Authorization: Bearer <key> (a key from POST /auth/keys)"
        if self._token is not None and hmac.compare_digest(given, self._token):
            return Principal(self.table.first_admin(), True, frozenset(SCOPES))
        found = self.table.lookup(given.decode("latin-1"))
        if found is None:
            return "unknown API key: send a key made by POST /auth/keys (or `finetune-studio users` for the first)"
        record, admin = found
        now = time.time()
        if record.revoked_at is not None:
            return f"API key {record.prefix}... was revoked: make a new one (POST /auth/keys)"
        if record.expires_at is not None and now >= record.expires_at:
            return f"API key {record.prefix}... has expired: make a new one (POST /auth/keys)"
        self.table.touch(record.id, now)
        return _principal(record, admin)

    def blocked(self, address: str) -> Optional[int]:
        """Seconds until `address` may try a key again, or None when it may now."""
        failures = self._failures.get(address)
        if not failures:
            return None
        now = time.monotonic()
        while failures and failures[0] <= now - FAILURE_WINDOW_SECONDS:
            failures.popleft()
        if len(failures) < MAX_FAILURES:
            return None
        return max(1, int(failures[0] + FAILURE_WINDOW_SECONDS - now + 0.999))

    def failed(self, address: str, reason: str) -> None:
        failures = self._failures.setdefault(address, deque())
        failures.append(time.monotonic())
        if len(failures) <= MAX_FAILURES:  # past the limit the 429s say it; the log is not flooded
            self.table.audit(None, "key_failed", address=address, detail=reason.split(":")[0])

    # -- open requests of a key --------------------------------------------------

    def watch(self, principal: Principal, task: asyncio.Future[None]) -> _Watch:
        watch = _Watch(principal, task)
        if principal.key_id is not None:
            self._watches.setdefault(principal.key_id, set()).add(watch)
            if principal.expires_at is not None:
                delay = max(0.0, principal.expires_at - time.time())
                watch.timer = asyncio.get_running_loop().call_later(delay, watch.close)
        return watch

    def unwatch(self, watch: _Watch) -> None:
        if watch.timer is not None:
            watch.timer.cancel()
        key_id = watch.principal.key_id
        if key_id is not None:
            watches = self._watches.get(key_id, set())
            watches.discard(watch)
            if not watches:
                self._watches.pop(key_id, None)

    def revoke(self, key_id: str) -> KeyRecord:
        """Revoke the key: its next request is a 401, and what it has open now ends."""
        record = self.table.revoke_key(key_id)
        for watch in list(self._watches.get(key_id, ())):
            watch.close()
        return record


def _principal(record: KeyRecord, admin: bool) -> Principal:
    return Principal(record.user, admin, frozenset(record.scopes), record.id, record.expires_at)


def _refusal(path: str, status: int, message: str, headers: dict[str, str]) -> JSONResponse:
    if is_openai_path(path):
        code = "invalid_api_key" if status == 401 else "rate_limit_exceeded"
        body: dict[str, Any] = error_body(message, "invalid_request_error", code=code)
    else:
        body = {"detail": message}
    return JSONResponse(body, status_code=status, headers=headers)


class AccountGuard:
    """Every request under `prefixes` (but OPEN_PATHS) acts as the principal its key names."""

    def __init__(self, app: ASGIApp, prefixes: tuple[str, ...]) -> None:
        self.app = app
        self.prefixes = prefixes  # each ends with "/"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in OPEN_PATHS or not under_prefixes(path, self.prefixes):
            await self.app(scope, receive, send)
            return
        accounts: Accounts = scope["app"].state.accounts
        client = scope.get("client")
        address = str(client[0]) if client else "unknown"
        wait = accounts.blocked(address)
        if wait is not None:
            message = f"too many failed API keys from {address}: try again in {wait} s"
            await _refusal(path, 429, message, {"Retry-After": str(wait)})(scope, receive, send)
            return
        header = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
        principal = accounts.authenticate(header)
        if isinstance(principal, str):
            accounts.failed(address, principal)
            await _refusal(path, 401, principal, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        acting = ACTING.set(principal)
        try:
            method = scope["method"]
            if method in ("GET", "HEAD") and "/stream/" not in path:
                await self.app(scope, receive, send)  # a read ends by itself: the polling path stays as cheap as it was
            else:
                await self._watched(accounts, principal, scope, receive, send, address)
        finally:
            ACTING.reset(acting)

    async def _watched(
        self, accounts: Accounts, principal: Principal, scope: Scope, receive: Receive, send: Send, address: str
    ) -> None:
        """Run the request in a task that the key's revocation or expiry cancels; record a write that went through."""
        answer: dict[str, Any] = {"status": 0, "ended": False, "head": b""}

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
            elif message["type"] == "http.response.body":
                if len(answer["head"]) < _SNIFFED_BYTES:
                    answer["head"] += message.get("body", b"")[:_SNIFFED_BYTES]
                answer["ended"] = not message.get("more_body", False)
            await send(message)

        task = asyncio.ensure_future(self.app(scope, receive, tracked))
        watch = accounts.watch(principal, task)
        try:
            await task
        except asyncio.CancelledError:
            if not watch.fired:
                raise
            if not answer["status"]:
                text = "this API key was revoked or has expired while the request was served"
                await _refusal(scope["path"], 401, text, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
            elif not answer["ended"]:
                await send({"type": "http.response.body", "body": b"", "more_body": False})  # the stream ends here
            return
        finally:
            accounts.unwatch(watch)
        method, path = scope["method"], scope["path"]
        if method not in ("GET", "HEAD") and 200 <= answer["status"] < 400 and path not in NOT_AUDITED:
            try:
                accounts.table.audit(principal.name, f"{method} {path}", _made_id(answer["head"]), address)
            except StudioError as exc:  # the answer went out; a full disk must not turn it into a crash
                log.warning("the audit log could not record %s %s: %s", method, path, exc)


def _made_id(head: bytes) -> Optional[str]:
    try:
        body = json.loads(head)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    return next((str(body[name]) for name in _MADE_IDS if isinstance(body.get(name), str)), None)


# Path parameters that name an owned object: the owner's lookup (None for an unknown id: the
# route answers that itself) and what an unknown id answers (the body another user's gets).
def _job_owner(studio: Studio, job_id: str) -> Optional[str]:
    try:
        return studio.service.store.owner_of(job_id) or ""
    except JobNotFound:
        return None


def _file_owner(studio: Studio, file_id: str) -> Optional[str]:
    try:
        return studio.files.owner_of(file_id) or ""
    except FileNotFound:
        return None


OWNED_PARAMS: dict[str, tuple[Callable[[Studio, str], Optional[str]], Callable[[str], StudioError]]] = {
    "job_id": (_job_owner, JobNotFound),
    "export_id": (_job_owner, JobNotFound),
    "eval_id": (_job_owner, JobNotFound),
    "file_id": (_file_owner, file_not_found),
}


async def authorize(request: Request) -> None:
    """The route's scope, and the owner of each id in its path (a dependency of every API router)."""
    principal = ACTING.get()
    if principal is None:
        return  # not reached: the guard sets one for every API path but the open ones
    route = request.scope.get("route")
    template = str(getattr(route, "path", request.url.path))
    needed = scope_of(request.method, template)
    if needed is None:
        raise StudioError(f"{request.method} {template} has no scope in api/scopes.py ROUTE_SCOPES: the server refuses it")
    if needed not in principal.scopes or (needed == "admin" and not principal.admin):
        held = ", ".join(sorted(principal.scopes))
        raise Forbidden(f"this key lacks the {needed!r} scope that {request.method} {template} needs (its scopes: {held})")
    if principal.admin:
        return
    studio = studio_of(request)
    for name, value in request.path_params.items():
        owned = OWNED_PARAMS.get(name)
        if owned is None:
            continue
        owner = owned[0](studio, str(value))
        if owner is not None and not principal.sees(owner or None):
            raise owned[1](str(value))
