"""The one error a request ends with when it cannot be served: a `failed` message."""

from __future__ import annotations

from typing import Optional

from finetune_studio.bounds import MAX_MESSAGE_CHARS, excerpt
from finetune_studio.wire import InferenceFailureCode


class RequestFailed(Exception):
    """Ends one request with `{"type": "failed", "code", "message", "param"}`; the
    message says what to change. The other requests go on."""

    def __init__(self, code: InferenceFailureCode, message: str, param: Optional[str] = None) -> None:
        super().__init__(message)
        self.code: InferenceFailureCode = code
        self.message = excerpt(message, MAX_MESSAGE_CHARS)
        self.param = param
