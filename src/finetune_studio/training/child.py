"""Entry point of a training child: `python -m finetune_studio.training.child --job-id ID`.

Reads its spec from stdin, runs the recipe, and reports every phase on stdout (see
`launcher.py` for the wire). Whatever happens, the last thing it reports is a
terminal status: `completed`, `stopped`, or `error` with an error code.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import traceback
from collections.abc import Iterator
from typing import IO, Any, Optional

from finetune_studio.schemas import ErrorCode

from finetune_studio.wire import OUT_OF_MEMORY_ADVICE, WorkerSpec
from finetune_studio.training.channel import (
    Channel,
    JobFailure,
    StopRequested,
    StopSignal,
)

_MEMORY_WORDS = ("out of memory", "can't allocate memory", "cannot allocate memory")
_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_WORDS = ("no space left on device", "disk quota exceeded")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and those it was raised from (libraries often wrap an OSError)."""
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def classify(exc: BaseException) -> tuple[ErrorCode, str]:
    """An error code and a sentence that says what to do, for an unexpected failure."""
    text = str(exc) or type(exc).__name__
    first = text.strip().splitlines()[0][:200] if text.strip() else type(exc).__name__
    for cause in _chain(exc):
        lowered = str(cause).lower()
        if (
            isinstance(cause, MemoryError)
            or type(cause).__name__ == "OutOfMemoryError"
            or (isinstance(cause, OSError) and cause.errno == errno.ENOMEM)
            or any(word in lowered for word in _MEMORY_WORDS)
        ):
            return "out_of_memory", f"Out of memory ({first}). {OUT_OF_MEMORY_ADVICE}"
        if (isinstance(cause, OSError) and cause.errno in _DISK_ERRNOS) or any(word in lowered for word in _DISK_WORDS):
            return "disk_full", (
                f"The disk is full ({first}). Free space on the disk that holds the data directory (each job's"
                " checkpoints are written there), or raise save_steps (0 saves no checkpoints) so fewer are written."
            )
    return "training_failed", f"Training failed: {type(exc).__name__}: {text}"


# -- test hooks ----------------------------------------------------------------
# For the test suite only (tests/reliability): they hold a real child in a chosen
# phase, or make it fail at its first training step, so that a test can stop or
# break it at an exact point. They are read from the environment the server passes
# on to its children, and do nothing when unset, as they are in normal use.
PAUSE_ENV = "FINETUNE_STUDIO_TEST_PAUSE_IN"  # a phase: once announced, wait there until a stop arrives
FAULT_ENV = "FINETUNE_STUDIO_TEST_FAULT"  # out_of_memory | disk_full: raised when the first step reports
_PAUSE_LIMIT_SECONDS = 300.0


class HookedChannel(Channel):
    """A Channel that pauses after announcing one phase, or fails on the first progress report."""

    def __init__(self, stream: IO[str], stop: StopSignal, pause_in: str, fault: str) -> None:
        super().__init__(stream, stop)
        self.stop = stop
        self.pause_in = pause_in
        self.fault = fault

    def status(
        self, phase: str, message: str, *, error: Optional[str] = None, details: Optional[dict[str, Any]] = None
    ) -> None:
        super().status(phase, message, error=error, details=details)
        if phase == self.pause_in:
            print(f"test hook: holding in {phase} until a stop arrives", file=sys.stderr)
            self.stop.wait(_PAUSE_LIMIT_SECONDS)

    def progress(self, **fields: Any) -> None:
        if self.fault == "out_of_memory":
            import torch

            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 20.00 GiB (injected by {FAULT_ENV})")
        if self.fault == "disk_full":
            raise OSError(errno.ENOSPC, f"No space left on device (injected by {FAULT_ENV})")
        super().progress(**fields)


def _channel(events: IO[str], stop: StopSignal) -> Channel:
    pause_in, fault = os.environ.get(PAUSE_ENV, ""), os.environ.get(FAULT_ENV, "")
    if pause_in or fault:
        return HookedChannel(events, stop, pause_in, fault)
    return Channel(events, stop)


# -- the child -----------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="finetune_studio.training.child")
    parser.add_argument("--job-id", required=True)
    parser.parse_args(argv)

    # Keep stdout for messages only: anything a library prints goes to the log.
    events = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    stop = StopSignal()
    channel = _channel(events, stop)
    spec = WorkerSpec.from_line(sys.stdin.readline())
    stop.listen(sys.stdin)

    from finetune_studio.training.recipe import Recipe  # after the wire is up

    try:
        recipe = Recipe(spec, channel, stop)
    except JobFailure as exc:  # the request does not hold up: nothing started
        details = {"output_dir": str(spec.output_dir), "error_code": exc.error_code}
        channel.status("error", "Training failed", error=exc.message, details=details)
        return 1
    try:
        recipe.run()
    except StopRequested as exc:
        channel.status(
            "stopped",
            f"Stopped during {recipe.phase} ({exc}); nothing was trained",
            details=recipe.details(),
        )
    except JobFailure as exc:
        channel.status(
            "error",
            "Training failed",
            error=exc.message,
            details={**recipe.details(), "error_code": exc.error_code},
        )
        return 1
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the user
        traceback.print_exc()
        code, text = classify(exc)
        channel.status("error", "Training failed", error=text, details={**recipe.details(), "error_code": code})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
