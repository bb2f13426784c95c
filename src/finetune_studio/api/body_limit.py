"""Request bodies over `max_request_bytes` get a 413 that says the limit and what to do.

FastAPI's own `max_body_size` (set on the API routes in create_app) counts every
body as it is read, chunked ones included, and its 413 goes through the app's error
handler. A request that declares a `Content-Length` over the limit, though, would
get a bare "Content Too Large" from it; `DeclaredBodyLimit` answers those first,
before reading anything.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send


def too_large_message(limit: int) -> str:
    return (
        f"the request body is over this server's limit of {limit} bytes; a training request is a small JSON"
        " document that names dataset files by path (the operator sets the limit with"
        " FINETUNE_STUDIO_MAX_REQUEST_BYTES)"
    )


class DeclaredBodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            declared = dict(scope["headers"]).get(b"content-length", b"")
            if declared.isdigit() and int(declared) > self.max_bytes:
                response = JSONResponse(
                    {"detail": too_large_message(self.max_bytes)}, status_code=413, headers={"Connection": "close"}
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
