"""Request bodies over `max_request_bytes` get a 413 that says the limit and what to do.

FastAPI's own `max_body_size` (set on the API routes in create_app) counts every
body as it is read, chunked ones included, and its 413 goes through the app's error
handler. A request that declares a `Content-Length` over the limit, though, would
get a bare "Content Too Large" from it; `DeclaredBodyLimit` answers those first,
before reading anything.

Under the OpenAI-compatible paths the 413 comes in OpenAI's error shape (what its
clients read), and says what a chat request must fit; elsewhere it is FastAPI's
`{"detail": ...}`. `too_large_body` is the one answer for both ways of noticing.
"""

from __future__ import annotations

from typing import Any, Optional

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from finetune_studio.api.openai_errors import is_openai_path
from finetune_studio.errors import FileTooLarge
from finetune_studio.openai_wire import error_body


def too_large_message(limit: int, chat: bool = False) -> str:
    what = (
        "a chat request carries the whole conversation, which must fit in it: shorten or drop earlier messages"
        if chat
        else "a training request is a small JSON document that names dataset files by path"
    )
    return (
        f"the request body is over this server's limit of {limit} bytes; {what} (the operator sets the limit with"
        " FINETUNE_STUDIO_MAX_REQUEST_BYTES)"
    )


def too_large_upload(limit: int) -> dict[str, Any]:
    """The 413 of an upload (POST /v1/files) over `max_file_bytes`, in OpenAI's shape (the
    same answer as the store's own FileTooLarge, for a file the form's room let through)."""
    refused = FileTooLarge(limit)
    return error_body(str(refused), refused.error_type, refused.param, refused.code)


def too_large_body(limit: int, path: str) -> dict[str, Any]:
    """The 413's body for a request to `path`: OpenAI's error shape under its paths, FastAPI's elsewhere."""
    if is_openai_path(path):
        return error_body(too_large_message(limit, chat=True), "invalid_request_error", None, "request_too_large")
    return {"detail": too_large_message(limit)}


class DeclaredBodyLimit:
    """`uploads`: a path prefix whose bodies are files, and their own limit (the file's, with room for the form)."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        uploads: Optional[tuple[str, int, int]] = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.uploads = uploads  # (prefix, body limit, file limit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            declared = dict(scope["headers"]).get(b"content-length", b"")
            upload = self.uploads is not None and scope["path"].startswith(self.uploads[0])
            limit = self.uploads[1] if self.uploads is not None and upload else self.max_bytes
            if declared.isdigit() and int(declared) > limit:
                if self.uploads is not None and upload:
                    body = too_large_upload(self.uploads[2])
                else:
                    body = too_large_body(self.max_bytes, scope["path"])
                response = JSONResponse(body, status_code=413, headers={"Connection": "close"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
