"""Entry point of a training child: `python -m finetune_studio.worker.child --job-id ID`.

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

from finetune_studio.worker.protocol import Channel, JobFailure, StopRequested, StopSignal


def classify(exc: BaseException) -> tuple[str, str]:
    """An error code and a sentence that says what to do, for an unexpected failure."""
    text = str(exc) or type(exc).__name__
    lowered = text.lower()
    if isinstance(exc, MemoryError) or "out of memory" in lowered or type(exc).__name__ == "OutOfMemoryError":
        return (
            "out_of_memory",
            f"Out of memory ({text.splitlines()[0][:200]}). Try a smaller batch_size with more"
            " gradient_accumulation_steps, a shorter max_seq_length, load_in_4bit, or a smaller model.",
        )
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return "disk_full", f"The disk is full ({text}). Free space under the data directory, or lower save_steps."
    return "training_failed", f"Training failed: {type(exc).__name__}: {text}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="finetune_studio.worker.child")
    parser.add_argument("--job-id", required=True)
    parser.parse_args(argv)

    # Keep stdout for messages only: anything a library prints goes to the log.
    events = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    stop = StopSignal()
    channel = Channel(events, stop)
    spec = json.loads(sys.stdin.readline())
    stop.listen(sys.stdin)

    from finetune_studio.worker.recipe import Recipe  # after the wire is up

    recipe = Recipe(spec, channel, stop)
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
