"""The child's side of the wire: messages to the server, and the stop signal from it.

Kept free of torch so that it can be imported and tested on its own.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from typing import IO, Any, Optional


class JobFailure(Exception):
    """A failure the user can act on: ends the job in `error` with this code and text."""

    def __init__(self, error_code: str, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message


class StopRequested(Exception):
    """Raised between phases when the server asked the job to stop."""


class StopSignal:
    """Set when the server sends `stop`, or when the server goes away (stdin EOF)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def set(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Block until a stop arrives (True) or timeout seconds pass (False)."""
        return self._event.wait(timeout)

    def check(self) -> None:
        if self._event.is_set():
            raise StopRequested(self.reason)

    def listen(self, stream: IO[str]) -> threading.Thread:
        """Read commands from the server on a daemon thread."""

        def read() -> None:
            for line in stream:
                if line.strip() == "stop":
                    self.set("a stop was requested")
            self.set("the server went away")

        thread = threading.Thread(target=read, name="stop-listener", daemon=True)
        thread.start()
        return thread


class Channel:
    """Writes one JSON message per line to the server. Never raises: a server that
    has gone away turns into a stop request instead."""

    def __init__(self, stream: IO[str], stop: StopSignal) -> None:
        self._stream = stream
        self._stop = stop
        self._lock = threading.Lock()
        self.warnings: list[str] = []

    def _send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, separators=(",", ":"), allow_nan=False, default=str)
        with self._lock:
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except (BrokenPipeError, OSError, ValueError):
                self._stop.set("the server went away")

    def warn(self, text: str) -> None:
        if text not in self.warnings:
            self.warnings.append(text)
            print(f"warning: {text}", file=sys.stderr)

    def status(
        self, phase: str, message: str, *, error: Optional[str] = None, details: Optional[dict[str, Any]] = None
    ) -> None:
        full = dict(details or {})
        if self.warnings:
            full["warnings"] = list(self.warnings)
        self._send({"type": "status", "phase": phase, "message": message, "error": error, "details": full})

    def progress(self, **fields: Any) -> None:
        clean = {k: v for k, v in fields.items() if v is not None and not (isinstance(v, float) and not math.isfinite(v))}
        self._send({"type": "progress", "progress": clean})
