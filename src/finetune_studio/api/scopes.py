"""The one table of which scope each route needs, with accounts on (jobs/accounts.py SCOPES).

Every API route (method and path as the router declares it) has a row; a route with no
row is refused (500, naming it) rather than let through, and tests/unit/test_accounts.py
walks the app's routes so that a new route without a row fails there first. `read` reads;
`train` starts, stops, deletes, exports, evaluates and inspects; `chat` asks the served
models; `files` is /v1/files; `admin` is users, the audit log, /metrics and others' webhooks.
/health (OPEN_PATHS) and the page's sign-in (OPEN_ROUTES) need no key at all. A session
(the page's cookie) holds every scope its user has: an admin's include `admin`.
"""

from __future__ import annotations

from typing import Optional

# Paths answered without a key (no row needed).
OPEN_PATHS: frozenset[str] = frozenset({"/health"})
# Routes (method, path) answered without a key or a session: signing in, which makes one.
OPEN_ROUTES: frozenset[tuple[str, str]] = frozenset({("POST", "/auth/session")})

ROUTE_SCOPES: dict[tuple[str, str], str] = {
    ("POST", "/train/start"): "train",
    ("GET", "/train/status/{job_id}"): "read",
    ("GET", "/train/progress/{job_id}"): "read",
    ("GET", "/train/stream/{job_id}"): "read",
    ("POST", "/train/stop/{job_id}"): "train",
    ("GET", "/train/jobs"): "read",
    ("GET", "/train/jobs/{job_id}"): "read",
    ("PATCH", "/train/jobs/{job_id}"): "train",
    ("DELETE", "/train/jobs/{job_id}"): "train",
    ("GET", "/v1/models"): "read",
    ("POST", "/v1/chat/completions"): "chat",
    ("POST", "/v1/completions"): "chat",
    ("GET", "/system"): "read",
    ("POST", "/export/start"): "train",
    ("GET", "/export/status/{export_id}"): "read",
    ("GET", "/export/stream/{export_id}"): "read",
    ("POST", "/export/stop/{export_id}"): "train",
    ("GET", "/export/jobs"): "read",
    ("GET", "/export/download/{export_id}/{name:path}"): "read",
    ("POST", "/datasets/inspect"): "train",
    ("POST", "/v1/files"): "files",
    ("GET", "/v1/files"): "files",
    ("GET", "/v1/files/{file_id}"): "files",
    ("GET", "/v1/files/{file_id}/content"): "files",
    ("DELETE", "/v1/files/{file_id}"): "files",
    ("POST", "/v1/fine_tuning/jobs"): "train",
    ("GET", "/v1/fine_tuning/jobs"): "read",
    ("GET", "/v1/fine_tuning/jobs/{job_id}"): "read",
    ("POST", "/v1/fine_tuning/jobs/{job_id}/cancel"): "train",
    ("POST", "/v1/fine_tuning/jobs/{job_id}/pause"): "train",
    ("POST", "/v1/fine_tuning/jobs/{job_id}/resume"): "train",
    ("GET", "/v1/fine_tuning/jobs/{job_id}/events"): "read",
    ("GET", "/v1/fine_tuning/jobs/{job_id}/checkpoints"): "read",
    ("POST", "/eval/start"): "train",
    ("GET", "/eval/status/{eval_id}"): "read",
    ("GET", "/eval/stream/{eval_id}"): "read",
    ("POST", "/eval/stop/{eval_id}"): "train",
    ("GET", "/eval/jobs"): "read",
    ("GET", "/eval/results/{eval_id}"): "read",
    ("GET", "/eval/results/{eval_id}/samples"): "read",
    # A webhook is its maker's (jobs/webhooks.py): it is told of its maker's objects; an admin's, of everyone's.
    ("POST", "/webhooks"): "train",
    ("GET", "/webhooks"): "read",
    ("GET", "/webhook-events"): "read",
    ("DELETE", "/webhooks/{webhook_id}"): "train",
    ("GET", "/webhooks/{webhook_id}/deliveries"): "read",
    ("POST", "/webhooks/{webhook_id}/test"): "train",
    ("POST", "/sweeps"): "train",
    ("GET", "/sweeps"): "read",
    ("GET", "/sweeps/{sweep_id}"): "read",
    ("GET", "/sweeps/{sweep_id}/stream"): "read",
    ("POST", "/sweeps/{sweep_id}/stop"): "train",
    ("GET", "/metrics"): "admin",
    # Accounts (api/routes/auth.py). A key manages its user's keys with `read`; a new key's
    # scopes are at most its maker's.
    ("GET", "/auth/me"): "read",
    # Signing out (the page's session; POST /auth/session, signing in, is open).
    ("DELETE", "/auth/session"): "read",
    ("POST", "/auth/keys"): "read",
    ("GET", "/auth/keys"): "read",
    ("DELETE", "/auth/keys/{key_id}"): "read",
    ("POST", "/auth/users"): "admin",
    ("GET", "/auth/users"): "admin",
    ("DELETE", "/auth/users/{name}"): "admin",
    ("GET", "/auth/audit"): "admin",
}


def scope_of(method: str, path: str) -> Optional[str]:
    """The scope the route `path` (as declared, with its parameters) needs for `method`."""
    return ROUTE_SCOPES.get(("GET" if method == "HEAD" else method, path))
