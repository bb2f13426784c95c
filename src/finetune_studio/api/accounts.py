"""Accounts on the server's side (with `accounts` on; jobs/accounts.py holds the tables).

`AccountGuard` (ASGI middleware, in front of the routes like api/auth.py's TokenGuard,
which it replaces) turns a request's `Authorization: Bearer <key>`, or else the page's
session cookie (SESSION_COOKIE, set by signing in: POST /auth/session), into the `Principal`
it acts as, set in `ACTING` for the request's own context: a key (one HMAC and one indexed
read), FINETUNE_STUDIO_TOKEN, which is the first admin's key, or a session, which holds every
scope its user has. A missing, unknown, revoked or expired key or session is a 401; an
address with too many failed keys, sessions or sign-ins in a minute gets 429 with
Retry-After (and so does an account with too many failed sign-ins). A write made with the
cookie must carry the session's CSRF token in CSRF_HEADER (403 otherwise): the cookie goes
with any request the browser sends, the header only with the page's own. A key's or a
session's streams (and its writes) run in a task of their own, which a revocation, a
sign-out, the user's removal or the expiry cancels: the stream ends there.

`authorize` (run before every API route's handler: `AuthorizedRoute`) then asks the route's scope (api/scopes.py)
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
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, Optional

from fastapi import Request, Response
from fastapi.routing import APIRoute, APIRouter
from starlette.requests import cookie_parser
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from finetune_studio.api.auth import under_prefixes
from finetune_studio.api.deps import Studio
from finetune_studio.api.openai_errors import is_openai_path
from finetune_studio.api.origin import SAFE_METHODS
from finetune_studio.api.scopes import OPEN_PATHS, OPEN_ROUTES, scope_of
from finetune_studio.errors import FileNotFound, JobNotFound, StudioError
from finetune_studio.files.store import file_not_found
from finetune_studio.jobs.accounts import ACTING, SCOPES, AccountTable, KeyRecord, Principal, user_scopes
from finetune_studio.openai_wire import error_body

log = logging.getLogger("finetune_studio")

# Failures (wrong keys, sessions, passwords) an address, or an account (sign-ins), may have in
# FAILURE_WINDOW_SECONDS before it is refused (429) until the window moves.
MAX_FAILURES = 10
FAILURE_WINDOW_SECONDS = 60.0
# The page's session: the cookie that names it, and the header a write made with it must carry.
SESSION_COOKIE = "finetune_studio_session"
CSRF_HEADER = "X-CSRF-Token"
_CSRF_HEADER_KEY = CSRF_HEADER.lower().encode()
MISSING = (
    "missing API key or session: send Authorization: Bearer <key> (a key from POST /auth/keys),"
    " or sign in on the page (POST /auth/session)"
)
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
            return MISSING if not header else "malformed Authorization header: send Authorization: Bearer <key>"
        if self._token is not None and hmac.compare_digest(given, self._token):
            return Principal(self.table.first_admin(), True, frozenset(SCOPES))
        found = self.table.lookup(given.decode("latin-1"))
        if found is None:
            return "unknown API key: send a key made by POST /auth/keys (or `finetune-studio users` for the first)"
        record, _, principal = found
        now = time.time()
        if record.revoked_at is not None:
            return f"API key {record.prefix}... was revoked: make a new one (POST /auth/keys)"
        if record.expires_at is not None and now >= record.expires_at:
            return f"API key {record.prefix}... has expired: make a new one (POST /auth/keys)"
        self.table.touch(record.id, now)
        return principal

    def authenticate_session(self, value: str) -> Principal | str:
        """The principal of a session cookie's value (every scope its user has), or why there is none."""
        found = self.table.session(value)
        if found is None:
            return "unknown or expired session: sign in again (POST /auth/session)"
        record, admin = found
        return Principal(record.user, admin, user_scopes(admin), None, record.expires_at, record.id)

    def blocked(self, address: str, account: Optional[str] = None) -> Optional[int]:
        """Seconds until `address` (and `account`, for a sign-in) may try again, or None when they may now."""
        if not self._failures:  # the polling path: nobody has failed lately
            return None
        waits = [wait for wait in (self._wait(address), self._wait(_account_bucket(account))) if wait is not None]
        return max(waits) if waits else None

    def _wait(self, bucket: Optional[str]) -> Optional[int]:
        failures = self._failures.get(bucket) if bucket is not None else None
        if not failures:
            return None
        now = time.monotonic()
        while failures and failures[0] <= now - FAILURE_WINDOW_SECONDS:
            failures.popleft()
        if len(failures) < MAX_FAILURES:
            return None
        return max(1, int(failures[0] + FAILURE_WINDOW_SECONDS - now + 0.999))

    def failed(self, address: str, reason: str, account: Optional[str] = None, action: str = "key_failed") -> None:
        """Count a failure of `address` (and of `account`, an existing user's sign-in), and audit it."""
        now = time.monotonic()
        counts = []
        for bucket in (address, _account_bucket(account)):
            if bucket is not None:
                failures = self._failures.setdefault(bucket, deque())
                failures.append(now)
                counts.append(len(failures))
        if min(counts) <= MAX_FAILURES:  # past the limit the 429s say it; the log is not flooded
            self.table.audit(None, action, account, address, reason.split(":")[0])

    # -- open requests of a key --------------------------------------------------

    def watch(self, principal: Principal, task: asyncio.Future[None]) -> _Watch:
        watch = _Watch(principal, task)
        if principal.credential is not None:
            self._watches.setdefault(principal.credential, set()).add(watch)
            if principal.expires_at is not None:
                delay = max(0.0, principal.expires_at - time.time())
                watch.timer = asyncio.get_running_loop().call_later(delay, watch.close)
        return watch

    def unwatch(self, watch: _Watch) -> None:
        if watch.timer is not None:
            watch.timer.cancel()
        credential = watch.principal.credential
        if credential is not None:
            watches = self._watches.get(credential, set())
            watches.discard(watch)
            if not watches:
                self._watches.pop(credential, None)

    def _close(self, credential: str, spare: Optional[asyncio.Future[Any]] = None) -> None:
        for watch in list(self._watches.get(credential, ())):
            if watch.task is not spare:
                watch.close()

    def revoke(self, key_id: str) -> KeyRecord:
        """Revoke the key: its next request is a 401, and what it has open now ends."""
        record = self.table.revoke_key(key_id)
        self._close(key_id)
        return record

    def end_session(self, session_id: str, spare: Optional[asyncio.Future[Any]] = None) -> None:
        """Sign a session out: its cookie's next request is a 401, and what it has open now ends
        (but `spare`: the sign-out's own request, which answers)."""
        self.table.end_session(session_id)
        self._close(session_id, spare)

    def remove_user(self, name: str) -> None:
        """Remove a user: their keys are revoked and their sessions end, with what either has open."""
        for key in self.table.keys(name):
            self.revoke(key.id)
        sessions = self.table.sessions_of(name)
        self.table.remove_user(name)
        for session_id in sessions:
            self._close(session_id)


def _account_bucket(account: Optional[str]) -> Optional[str]:
    """The failure count of an account's sign-ins (no address has a space in it)."""
    return f"account {account}" if account is not None else None


def session_value(scope: Scope) -> Optional[str]:
    """The session cookie's value in a request's headers, or None."""
    for name, value in scope["headers"]:
        if name == b"cookie":
            found = cookie_parser(value.decode("latin-1")).get(SESSION_COOKIE)
            if found:
                return found
    return None


_CODES = {401: "invalid_api_key", 403: "csrf_token_invalid", 429: "rate_limit_exceeded"}


def _refusal(path: str, status: int, message: str, headers: dict[str, str]) -> JSONResponse:
    if is_openai_path(path):
        body: dict[str, Any] = error_body(message, "invalid_request_error", code=_CODES[status])
    else:
        body = {"detail": message}
    return JSONResponse(body, status_code=status, headers=headers)


def _csrf_refusal(scope: Scope, accounts: Accounts, value: str) -> Optional[str]:
    """Why a write made with the session cookie `value` is refused for its CSRF token, or None."""
    given = next((header for name, header in scope["headers"] if name == _CSRF_HEADER_KEY), b"").strip()
    if not given:
        return (
            f"missing CSRF token: a {scope['method']} signed in with the session cookie must carry the header"
            f" {CSRF_HEADER} (its value is csrf_token in the answer of POST /auth/session and GET /auth/me)"
        )
    if not hmac.compare_digest(given, accounts.table.csrf_token(value).encode()):
        return (
            f"wrong CSRF token: {CSRF_HEADER} is not this session's csrf_token (GET /auth/me answers it);"
            " signing in again makes a new session with a new token"
        )
    return None


class AccountGuard:
    """Every request under `prefixes` (but OPEN_PATHS) acts as the principal its key names."""

    def __init__(self, app: ASGIApp, prefixes: tuple[str, ...]) -> None:
        self.app = app
        self.prefixes = prefixes  # each ends with "/"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (
            scope["type"] != "http" or path in OPEN_PATHS or (scope["method"], path) in OPEN_ROUTES
            or not under_prefixes(path, self.prefixes)
        ):
            await self.app(scope, receive, send)
            return
        accounts: Accounts = scope["app"].state.accounts
        client = scope.get("client")
        address = str(client[0]) if client else "unknown"
        wait = accounts.blocked(address)
        if wait is not None:
            message = f"too many failed API keys, sessions or sign-ins from {address}: try again in {wait} s"
            await _refusal(path, 429, message, {"Retry-After": str(wait)})(scope, receive, send)
            return
        # A key wins over the cookie: a page of another site cannot send an Authorization header.
        header = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                header = value
                break
        cookie = None if header else session_value(scope)
        principal = accounts.authenticate(header) if cookie is None else accounts.authenticate_session(cookie)
        if isinstance(principal, str):
            if header or cookie is not None:  # a request naming no key or session guesses nothing
                accounts.failed(address, principal)
            refusal = _refusal(path, 401, principal, {"WWW-Authenticate": "Bearer"})
            if cookie is not None:  # the page stops sending a dead session
                refusal.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
            await refusal(scope, receive, send)
            return
        if cookie is not None and str(scope["method"]).upper() not in SAFE_METHODS:
            why = _csrf_refusal(scope, accounts, cookie)
            if why is not None:
                await _refusal(path, 403, why, {})(scope, receive, send)
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
                text = "this API key or session was revoked, signed out or has expired while the request was served"
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


_OwnedParam = tuple[str, tuple[Callable[[Studio, str], Optional[str]], Callable[[str], StudioError]]]


def authorize(
    principal: Principal, request: Request, template: str, needed: Optional[str], owned: tuple[_OwnedParam, ...]
) -> None:
    """The route's scope (`needed`, for the request's method: ROUTE_SCOPES), and the owner of each
    id in its path (`owned`: its parameters that OWNED_PARAMS knows): StudioError (403 Forbidden,
    or the 404 of an unknown id for another user's object) when `principal` may not go on."""
    if needed is None:
        raise StudioError(f"{request.method} {template} has no scope in api/scopes.py ROUTE_SCOPES: the server refuses it")
    if needed not in principal.scopes or (needed == "admin" and not principal.admin):
        held = ", ".join(sorted(principal.scopes))
        raise Forbidden(f"this key lacks the {needed!r} scope that {request.method} {template} needs (its scopes: {held})")
    if principal.admin or not owned:
        return
    scope = request.scope
    studio: Studio = scope["app"].state.studio
    params = scope["path_params"]
    for name, (owner_of, unknown) in owned:
        value = str(params[name])
        owner = owner_of(studio, value)
        if owner is not None and not principal.sees(owner or None):
            raise unknown(value)


class AuthorizedRoute(APIRoute):
    """The route class of every API router: with accounts on (a principal set by the guard), its
    handler first asks `authorize`, with the route's scopes and owned parameters found once, when
    the route is made. A wrapper rather than a dependency: the polling path stays one call from
    its handler, with no dependency to solve; with no principal (single-user mode) it costs one
    context-variable read."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        template = self.path
        needs = {method: scope_of(method, template) for method in (*(self.methods or ()), "HEAD")}
        owned = tuple((name, OWNED_PARAMS[name]) for name in self.param_convertors if name in OWNED_PARAMS)

        async def authorized(request: Request) -> Response:
            principal = ACTING.get()
            if principal is not None:
                authorize(principal, request, template, needs.get(request.scope["method"]), owned)
            return await handler(request)

        return authorized


def check_authorized(routers: Iterable[APIRouter]) -> None:
    """Refuse an API route that would not ask `authorize` (its router's route_class is another)."""
    for router in routers:
        for route in router.routes:
            if isinstance(route, APIRoute) and not isinstance(route, AuthorizedRoute):
                raise TypeError(f"{sorted(route.methods or ())} {route.path}: its router's route_class is"
                                f" {type(route).__name__}; give the router route_class=AuthorizedRoute (api/accounts.py)")
