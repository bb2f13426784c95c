"""Errors under /v1/ in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

The app's error handlers (api/app.py) answer through here for every path under the
OpenAI prefix, so an OpenAI client raises its own exception types (`BadRequestError`
with `param`, `NotFoundError`, `AuthenticationError`, ...) and never meets FastAPI's
`{"detail": ...}`. Schema errors are OpenAI's 400 `invalid_request_error` (FastAPI
says 422), with `param` naming the field as OpenAI does (`messages[0].content`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

from fastapi.responses import JSONResponse

from finetune_studio.errors import OpenAIError, StorageFailed, StudioError
from finetune_studio.openai_wire import error_body
from finetune_studio.text import clean_text

# The most schema errors one answer names (the first one's field is `param`).
_NAMED_ERRORS = 3
# Where FastAPI says a request's field came from, as the first part of its location.
_SOURCES = ("body", "query", "header", "path", "cookie")


# The OpenAI-compatible routes' paths: chat, files and fine-tuning jobs (api/routes/).
OPENAI_PREFIX = "/v1/"


def is_openai_path(path: str) -> bool:
    """Whether an error answered for `path` takes OpenAI's shape: the one rule for the app's
    error handlers, the token guard, the body limit and the Host/Origin guards."""
    return path.startswith(OPENAI_PREFIX)


# Said with every StorageFailed answer: the openai SDK (and others that follow it) retries
# every 5xx unless told not to, and a full disk would take the same 512 MiB upload three times.
NO_RETRY = {"x-should-retry": "false"}


def retry_headers(exc: StudioError) -> Optional[dict[str, str]]:
    """The headers an error's answer carries to tell clients not to retry it, if any."""
    return dict(NO_RETRY) if isinstance(exc, StorageFailed) else None


def studio_error(exc: StudioError) -> JSONResponse:
    text = clean_text(str(exc))
    if isinstance(exc, OpenAIError):
        return JSONResponse(error_body(text, exc.error_type, exc.param, exc.code), status_code=exc.status_code)
    if isinstance(exc, StorageFailed):
        body = error_body(text, "server_error", None, exc.error_code)
        return JSONResponse(body, status_code=exc.status_code, headers=retry_headers(exc))
    return _by_status(exc.status_code, text)


def http_error(status_code: int, detail: Any, method: str, path: str, headers: Optional[Mapping[str, str]] = None) -> JSONResponse:
    text = clean_text(str(detail))
    if status_code in (404, 405):
        text = (
            f"{text}: {method} {clean_text(path)}. This server's OpenAI-compatible routes are GET /v1/models,"
            " POST /v1/chat/completions, POST /v1/completions, /v1/files and /v1/fine_tuning/jobs (see /docs)"
        )
    return _by_status(status_code, text, headers)


def validation_error(errors: Sequence[Any]) -> JSONResponse:
    """A request that does not fit the schema: 400 `invalid_request_error`, `param` = the first field."""
    named = [(_param(error.get("loc") or ()), _message(error)) for error in errors]
    param = next((field for field, _ in named if field), None)
    parts = [f"{field}: {message}" if field else message for field, message in named[:_NAMED_ERRORS]]
    if len(named) > _NAMED_ERRORS:
        parts.append(f"and {len(named) - _NAMED_ERRORS} more")
    text = "; ".join(parts) or "the request body does not fit OpenAI's chat completion request"
    return JSONResponse(error_body(text, "invalid_request_error", param, "invalid_request_error"), status_code=400)


def not_json(reason: str) -> JSONResponse:
    return JSONResponse(
        error_body(f"the body is not JSON text ({clean_text(reason)})", "invalid_request_error", None, "invalid_request_error"),
        status_code=400,
    )


def _by_status(status_code: int, text: str, headers: Optional[Mapping[str, str]] = None) -> JSONResponse:
    kind = "server_error" if status_code >= 500 else "invalid_request_error"
    return JSONResponse(error_body(text, kind, None, None), status_code=status_code, headers=headers)


def _message(error: Any) -> str:
    text = clean_text(str(error.get("msg", "invalid value")))
    given = error.get("input")
    # A number is worth quoting back; text is not (a prompt could be long, or private).
    if isinstance(given, (int, float)) and not isinstance(given, bool) and str(given) not in text:
        text += f" (got {given})"
    return text


def _param(loc: Sequence[Any]) -> Optional[str]:
    """A pydantic location as OpenAI names a parameter: ("body", "messages", 0, "content") -> "messages[0].content",
    ("query", "limit") -> "limit" (where a parameter came from is no part of its name)."""
    parts = list(loc[1:] if loc and loc[0] in _SOURCES else loc)
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{clean_text(str(part))}" if text else clean_text(str(part))
    return text or None
