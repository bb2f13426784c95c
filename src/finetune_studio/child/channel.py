"""The child's side of the wire (`finetune_studio.wire`): messages to the server,
the stop signal from it, and `open_child_wire`, which sets both up at a child's start
(training, export, evaluation and Ray driver children alike).

Kept free of torch so that it can be imported and tested on its own.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import IO, Any, NamedTuple, Optional, Union

from finetune_studio.bounds import MAX_WARNING_CHARS, MAX_WARNINGS, bound_status, excerpt, fit, shrink
from finetune_studio.schemas import ErrorCode, EvalPhase, ExportPhase, Phase
from finetune_studio.wire import MAX_MESSAGE_BYTES, STOP_COMMAND, Message, WorkerSpec, status_message


class JobFailure(Exception):
    """A failure the user can act on: ends the job in `error` with this code and text."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
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

    def stops_at(self, step: int) -> bool:
        """Whether training leaves its loop after optimizer step `step`. Here: whenever a
        stop has arrived. Data-parallel workers (finetune_studio.ray_train) answer it
        the same on every rank, since a rank that leaves alone hangs the others."""
        return self.is_set()

    def listen(self, stream: IO[str]) -> threading.Thread:
        """Read commands from the server on a daemon thread."""

        def read() -> None:
            for line in stream:
                if line.strip() == STOP_COMMAND:
                    self.set("a stop was requested")
            self.set("the server went away")

        thread = threading.Thread(target=read, name="stop-listener", daemon=True)
        thread.start()
        return thread


class Channel:
    """Writes one JSON message per line to the server. Never raises: a server that
    has gone away turns into a stop request instead.

    Every message keeps to the wire's limits (`finetune_studio.bounds`): a status's
    text and details are bounded, warnings are capped, numbers JSON cannot carry
    become null, and a line that would still be over `MAX_MESSAGE_BYTES` (which the
    server would skip, losing the status) is shrunk first.
    """

    def __init__(self, stream: IO[str], stop: StopSignal) -> None:
        self._stream = stream
        self._stop = stop
        self._lock = threading.Lock()
        self.warnings: list[str] = []
        self._more_warnings = 0  # warnings past MAX_WARNINGS: counted, not kept (so a repeat of one counts again)

    def _send(self, message: Message) -> None:
        try:
            line = json.dumps(message, separators=(",", ":"), allow_nan=False, default=str)
        except (ValueError, RecursionError):  # a NaN somewhere, or nesting the encoder refuses
            line = json.dumps(shrink(message, MAX_MESSAGE_BYTES // 2), separators=(",", ":"), default=str)
        if len(line) >= MAX_MESSAGE_BYTES:  # ASCII (json.dumps escapes the rest): characters are bytes
            line = json.dumps(fit(dict(message), MAX_MESSAGE_BYTES // 8), separators=(",", ":"), default=str)
        with self._lock:
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except (BrokenPipeError, OSError, ValueError):
                self._stop.set("the server went away")

    def warn(self, text: str) -> None:
        text = excerpt(text, MAX_WARNING_CHARS)
        if text in self.warnings:
            return
        print(f"warning: {text}", file=sys.stderr)
        if len(self.warnings) < MAX_WARNINGS - 1:
            self.warnings.append(text)
        else:
            self._more_warnings += 1

    def status(
        self, phase: Union[Phase, ExportPhase, EvalPhase], message: str, *, error: Optional[str] = None, details: Optional[dict[str, Any]] = None
    ) -> None:
        full = dict(details or {})
        if self.warnings:
            full["warnings"] = list(self.warnings)
            if self._more_warnings:
                full["warnings"].append(f"... and {self._more_warnings:,} more warnings (see the job's worker.log)")
        message, error, full = bound_status(message, error, full)
        self._send(status_message(phase, message, error=error, details=full))

    def progress(self, **fields: Any) -> None:
        """One step's metrics. Unset and non-finite values are left out, except the
        loss: a step whose loss is NaN or infinite is still reported, with
        `loss: null` and `loss_finite: false`."""
        clean = {k: v for k, v in fields.items() if v is not None and not (isinstance(v, float) and not math.isfinite(v))}
        if "loss" in fields:
            loss = fields["loss"]
            finite = isinstance(loss, (int, float)) and math.isfinite(loss) and fields.get("loss_finite", True) is not False
            clean["loss"] = loss if finite else None
            clean.pop("loss_finite", None)
            if not finite:
                clean["loss_finite"] = False  # absent means true: most steps carry no flag
        self._send({"type": "progress", "progress": clean})


# -- a child's start -------------------------------------------------------------


def keep_stdout_for_messages() -> IO[str]:
    """A line-buffered stream on a copy of stdout, for the child's messages only; fd 1
    then points at stderr, so whatever a library prints goes to the log instead."""
    messages = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return messages


MakeChannel = Callable[[IO[str], StopSignal, WorkerSpec], Channel]


def plain_channel(events: IO[str], stop: StopSignal, spec: WorkerSpec) -> Channel:
    """The channel a child reports on; a child's `main` may take another maker (the tests'
    hooked child, tests/helpers/hooked_child.py, holds or fails a real child with it)."""
    return Channel(events, stop)


class ChildWire(NamedTuple):
    """What `open_child_wire` set up: the spec, the channel to report on, the stop
    signal, and the messages stream itself (for a child that relays lines as they are)."""

    spec: WorkerSpec
    channel: Channel
    stop: StopSignal
    events: IO[str]


def open_child_wire(make_channel: MakeChannel = plain_channel) -> ChildWire:
    """A child's start on the wire: stdout kept for messages, the `WorkerSpec` line read
    from stdin, the channel made, and then a daemon thread listening on stdin for `stop`.

    The spec is read before the listener starts: both read stdin, and the listener
    would otherwise take the spec line for a command.
    """
    events = keep_stdout_for_messages()
    stop = StopSignal()
    spec = WorkerSpec.from_line(sys.stdin.readline())
    channel = make_channel(events, stop, spec)
    stop.listen(sys.stdin)
    return ChildWire(spec, channel, stop, events)


def start_child(prog: str, what: str, argv: Optional[list[str]] = None) -> ChildWire:
    """The start of an export or evaluation child (`python -m PROG --job-id ID`): the wire
    opened, and SIGTERM (the supervisor's escalation after a stop's grace) made a stop, so
    the child ends as a stop does, its partial files removed ("the export was terminated")."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--job-id", required=True)
    parser.parse_args(argv)
    wire = open_child_wire()

    def on_terminate(signum: int, frame: Optional[FrameType]) -> None:
        wire.stop.set(f"the {what} was terminated")

    signal.signal(signal.SIGTERM, on_terminate)
    return wire
