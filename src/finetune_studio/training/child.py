"""Entry point of a training child: `python -m finetune_studio.training.child --job-id ID`.

Reads its spec from stdin, runs the recipe, and reports every phase on stdout (see
`launcher.py` for the wire). Whatever happens, the last thing it reports is a
terminal status: `completed`, `stopped`, or `error` with an error code.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from finetune_studio import failures
from finetune_studio.child.channel import (
    JobFailure,
    MakeChannel,
    StopRequested,
    open_child_wire,
    plain_channel,
)
from finetune_studio.schemas import ErrorCode
from finetune_studio.wire import JobFolder

if TYPE_CHECKING:
    from finetune_studio.training.recipe import Recipe

def classify(exc: BaseException) -> tuple[ErrorCode, str]:
    """An error code and a sentence that says what to do, for an unexpected failure
    (the causes and their advice: finetune_studio/failures.py)."""
    known = failures.classify(exc, "train")
    if known is not None:
        return known
    text = str(exc) or type(exc).__name__
    return "training_failed", f"Training failed: {type(exc).__name__}: {text}"


# -- the child -----------------------------------------------------------------


def main(argv: list[str] | None = None, make_channel: MakeChannel = plain_channel) -> int:
    """Runs one job; `make_channel` is how the tests' hooked child
    (tests/helpers/hooked_child.py) holds or fails a real child."""
    parser = argparse.ArgumentParser(prog="finetune_studio.training.child")
    parser.add_argument("--job-id", required=True)
    parser.parse_args(argv)

    spec, channel, stop, _ = open_child_wire(make_channel)

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
        details, _ = failed_details(recipe, exc.error_code)
        channel.status("error", "Training failed", error=exc.message, details=details)
        return 1
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the user
        traceback.print_exc()
        code, text = classify(exc)
        details, kept = failed_details(recipe, code)
        if kept is not None:
            text += (
                f" The last complete checkpoint is kept ({kept.name}): a job started with resume_from_checkpoint"
                f" {kept} goes on from it."
            )
        channel.status("error", "Training failed", error=text, details=details)
        return 1
    return 0


def failed_details(recipe: Recipe, code: ErrorCode) -> tuple[dict[str, Any], Optional[Path]]:
    """The details of a job that ended in error, and its last complete checkpoint: a
    checkpoint the failure cut short (a full disk mid-save) is removed, so that it takes
    no space and nothing resumes from it, and `last_checkpoint` names the newest one
    that is whole (or is left out when there is none)."""
    folder = JobFolder(recipe.output_dir)
    for removed in folder.remove_partial_checkpoints():
        print(f"removed the partial checkpoint {removed}", file=sys.stderr)
    details = {**recipe.details(), "error_code": code}
    kept = folder.last_checkpoint()
    details.pop("last_checkpoint", None)
    if kept is not None:
        details["last_checkpoint"] = str(kept)
    return details, kept


if __name__ == "__main__":
    sys.exit(main())
