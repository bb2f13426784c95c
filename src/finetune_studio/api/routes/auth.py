"""/auth: the page's sign-in, the caller, API keys, users and the audit log (with accounts on
only; docs/API.md, Accounts).

POST /auth/session (open: it needs no key) checks a name and password and sets the session
cookie (api/accounts.py SESSION_COOKIE: HttpOnly, SameSite=Strict, Path=/, Secure over https),
answering the session's CSRF token, which the page keeps in memory and sends with every
write; DELETE /auth/session signs out. A key is shown once, in POST /auth/keys' answer;
lists show its prefix. A user sees and revokes their own keys (another user's key is the 404
of an unknown id); admins see all, manage users and read the audit log. The scope of each
route is in api/scopes.py.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Optional

from fastapi import APIRouter, Query, Request, status
from fastapi.responses import JSONResponse, Response

from finetune_studio.api.accounts import SESSION_COOKIE, Accounts, AuthorizedRoute, Forbidden
from finetune_studio.api.deps import ParamInt
from finetune_studio.bounds import MAX_PAGE_ITEMS
from finetune_studio.jobs.accounts import (
    ACTING,
    SESSION_SECONDS,
    AccountNotFound,
    AccountRefused,
    Principal,
    SessionRecord,
    user_scopes,
)
from finetune_studio.schemas import KeyCreate, SessionCreate, UserCreate

router = APIRouter(prefix="/auth", tags=["auth"], route_class=AuthorizedRoute)


def _accounts(request: Request) -> Accounts:
    return request.app.state.accounts  # type: ignore[no-any-return]


def _caller() -> Principal:
    principal = ACTING.get()
    assert principal is not None  # noqa: S101 (the guard sets one for every /auth route)
    return principal


def _address(request: Request) -> Optional[str]:
    return request.client.host if request.client else None


# Why a sign-in is refused: the same words for an unknown name and a wrong password (a message, not a password).
WRONG_PASSWORD = "wrong name or password"  # noqa: S105


@router.post("/session")
async def sign_in(body: SessionCreate, request: Request) -> JSONResponse:
    """Sign in with a name and password: the session cookie is set, and the answer holds its
    csrf_token (for X-CSRF-Token on every write). Failures count towards the address's and the
    account's limits (429 with Retry-After) and are audited; neither the password nor the
    session is ever written in clear."""
    accounts = _accounts(request)
    address = _address(request) or "unknown"
    # Only an existing user's name is counted and audited: a password typed as the name is never kept.
    account = body.name if accounts.table.user(body.name) is not None else None
    wait = accounts.blocked(address, account)
    if wait is not None:
        message = f"too many failed sign-ins from {address} or for this account: try again in {wait} s"
        return JSONResponse({"detail": message}, status_code=429, headers={"Retry-After": str(wait)})
    stored = accounts.table.password_hash(body.name)
    # argon2id costs tens of milliseconds of CPU: off the event loop, which serves every poll.
    if not await asyncio.to_thread(accounts.table.verify_password, stored, body.password):
        accounts.failed(address, WRONG_PASSWORD, account, action="signin_failed")
        return JSONResponse({"detail": f"{WRONG_PASSWORD}: the sign-in was refused"}, status_code=401)
    user = accounts.table.user(body.name)
    if user is None:  # removed while its password was checked
        return JSONResponse({"detail": f"{WRONG_PASSWORD}: the sign-in was refused"}, status_code=401)
    record, value = accounts.table.create_session(user.name)
    accounts.table.audit(user.name, "signed_in", record.id, address)
    response = JSONResponse(_session_answer(user.name, user.admin, record, accounts.table.csrf_token(value)))
    response.set_cookie(
        SESSION_COOKIE, value, max_age=int(SESSION_SECONDS), path="/", secure=request.url.scheme == "https",
        httponly=True, samesite="strict",
    )
    return response


def _session_answer(name: str, admin: bool, record: SessionRecord, csrf: str) -> dict[str, Any]:
    return {
        "name": name, "admin": admin, "scopes": sorted(user_scopes(admin)), "key_id": None, "session": True,
        "csrf_token": csrf, "expires_at": record.expires_at,
    }


@router.delete("/session", status_code=status.HTTP_204_NO_CONTENT)
async def sign_out(request: Request) -> Response:
    """Sign out: the session ends (its cookie's next request is a 401, its open streams close) and the cookie goes."""
    caller, accounts = _caller(), _accounts(request)
    if caller.session_id is None:
        raise AccountRefused(
            "DELETE /auth/session signs the page's session out, and this request was made with an API key"
            " (DELETE /auth/keys/{key_id} revokes a key)"
        )
    accounts.end_session(caller.session_id, spare=asyncio.current_task())
    accounts.table.audit(caller.name, "signed_out", caller.session_id, _address(request))
    response = Response(status_code=status.HTTP_204_NO_CONTENT)
    response.delete_cookie(SESSION_COOKIE, path="/", secure=request.url.scheme == "https", httponly=True, samesite="strict")
    return response


@router.get("/me")
async def me(request: Request) -> dict[str, Any]:
    """Who the request acts as: the user's name, whether an admin, the scopes, and the key's id;
    signed in on the page, the session's csrf_token and expiry too."""
    caller = _caller()
    answer: dict[str, Any] = {
        "name": caller.name, "admin": caller.admin, "scopes": sorted(caller.scopes), "key_id": caller.key_id,
        "session": caller.session_id is not None,
    }
    value = request.cookies.get(SESSION_COOKIE)
    if caller.session_id is not None and value:
        answer["csrf_token"] = _accounts(request).table.csrf_token(value)
        answer["expires_at"] = caller.expires_at
    return answer


@router.post("/keys", status_code=status.HTTP_201_CREATED)
async def create_key(body: KeyCreate, request: Request) -> dict[str, Any]:
    """A new key, shown once in `key` (only its HMAC is stored). Its scopes are at most the caller's."""
    caller, accounts = _caller(), _accounts(request)
    user = body.user or caller.name
    if user != caller.name and not caller.admin:
        raise Forbidden("user: only an admin makes keys for another user")
    extra = sorted(set(body.scopes) - caller.scopes)
    if extra or ("admin" in body.scopes and accounts.table.user(user) is not None and not _is_admin(accounts, user)):
        why = f"this key does not hold {', '.join(extra)}" if extra else f"{user} is not an admin"
        raise Forbidden(f"scopes: a new key holds at most its maker's scopes, and admin only for an admin ({why})")
    record, key = accounts.table.create_key(user, body.name, body.scopes, body.expires_in_days)
    accounts.table.audit(caller.name, "key_created", record.id, _address(request), f"for {user}: {','.join(record.scopes)}")
    return {**record.to_json(), "key": key}


def _is_admin(accounts: Accounts, name: str) -> bool:
    user = accounts.table.user(name)
    return user is not None and user.admin


@router.get("/keys")
async def list_keys(request: Request) -> dict[str, Any]:
    """The keys not revoked: the caller's own (an admin's: everyone's), newest first."""
    caller = _caller()
    keys = _accounts(request).table.keys(None if caller.admin else caller.name)
    return {"data": [key.to_json() for key in keys], "count": len(keys)}


@router.delete("/keys/{key_id}", status_code=status.HTTP_204_NO_CONTENT)
async def revoke_key(key_id: str, request: Request) -> Response:
    """Revoke a key: its next request is a 401, and its open streams end now."""
    caller, accounts = _caller(), _accounts(request)
    record = accounts.table.key(key_id)
    if record is None or record.revoked_at is not None or not caller.sees(record.user):
        raise AccountNotFound(f"no key {key_id!r}: GET /auth/keys lists them")
    accounts.revoke(key_id)
    accounts.table.audit(caller.name, "key_revoked", key_id, _address(request), f"of {record.user}")
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/users", status_code=status.HTTP_201_CREATED)
async def add_user(body: UserCreate, request: Request) -> dict[str, Any]:
    """Add a user (admins). There is no sign-up: only an admin adds users."""
    accounts = _accounts(request)
    user = accounts.table.add_user(body.name, body.password, admin=body.admin)
    accounts.table.audit(_caller().name, "user_added", user.name, _address(request), "admin" if user.admin else None)
    return user.to_json()


@router.get("/users")
async def list_users(request: Request) -> dict[str, Any]:
    users = _accounts(request).table.users()
    return {"data": [user.to_json() for user in users], "count": len(users)}


@router.delete("/users/{name}", status_code=status.HTTP_204_NO_CONTENT)
async def remove_user(name: str, request: Request) -> Response:
    """Remove a user: their keys are revoked and their sessions end, with their open streams
    (their jobs and files stay, seen by admins)."""
    accounts = _accounts(request)
    accounts.remove_user(name)
    accounts.table.audit(_caller().name, "user_removed", name, _address(request))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/audit")
async def audit(
    request: Request, after: Annotated[ParamInt, Query(ge=0)] = 0, limit: Annotated[ParamInt, Query(ge=1, le=MAX_PAGE_ITEMS)] = 100
) -> dict[str, Any]:
    """The audit log, oldest first, after row `after`: who started, stopped, deleted and exported what,
    keys made and revoked, users added and removed, and failed keys."""
    rows = _accounts(request).table.audit_rows(after, limit)
    return {"data": rows, "count": len(rows)}
