"""TokenGuard: with a token configured, every request under the API's paths must carry it.

The check runs in front of the routes, as ASGI middleware, so it covers every API
route (present and future) and costs one header lookup and one constant-time
comparison, with no per-route dependency to resolve. `/health`, the OpenAPI page
and the web UI's static files stay open: they hold no job data, and the page must
load before it can ask its user for the token.

Under the OpenAI-compatible paths (`openai_errors.is_openai_path`), the 401 comes in
OpenAI's error shape, which OpenAI's clients turn into their authentication error.
"""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from finetune_studio.api.openai_errors import is_openai_path
from finetune_studio.openai_wire import error_body

UNAUTHORIZED = "missing or wrong API token: send Authorization: Bearer <FINETUNE_STUDIO_TOKEN>"
OPENAI_UNAUTHORIZED = (
    "missing or wrong API key: send the server's token (FINETUNE_STUDIO_TOKEN) as the API key"
    " (api_key=... in OpenAI's clients, or Authorization: Bearer <token>)"
)


def under_prefixes(path: str, prefixes: tuple[str, ...]) -> bool:
    """Whether path is one of the prefixes' folders ("/system") or under one ("/system/x");
    each prefix ends with "/"."""
    return path.startswith(prefixes) or (path + "/") in prefixes


class TokenGuard:
    def __init__(self, app: ASGIApp, token: str, prefixes: tuple[str, ...]) -> None:
        self.app = app
        self.expected = token.encode()
        self.prefixes = prefixes  # each ends with "/"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and under_prefixes(scope["path"], self.prefixes) and not self._authorized(scope):
            if is_openai_path(scope["path"]):
                body = error_body(OPENAI_UNAUTHORIZED, "invalid_request_error", code="invalid_api_key")
            else:
                body = {"detail": UNAUTHORIZED}
            response = JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        header = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
        scheme, _, given = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.expected)
