"""A stand-in child whose training diverges: python -m tests.helpers.nan_worker --job-id ID

It speaks through the real training Channel: every phase, then steps whose loss is
NaN, +inf and finite, then one line written as Python's `json.dumps` writes a NaN
(what a child without the Channel's care would send), then it completes.
"""

from __future__ import annotations

import json
import math
import sys

from finetune_studio.child.channel import Channel, StopSignal

STEPS = 4


def main() -> int:
    sys.stdin.readline()  # the spec
    channel = Channel(sys.stdout, StopSignal())
    for phase in ("loading_model", "loading_dataset", "configuring", "training"):
        channel.status(phase, phase)  # type: ignore[arg-type]
    for step, loss in ((1, math.nan), (2, math.inf), (3, 0.5)):
        channel.progress(step=step, total_steps=STEPS, loss=loss, learning_rate=1e-3,
                         progress_percent=100.0 * step / STEPS, grad_norm=math.nan)
    raw = {"step": 4, "total_steps": STEPS, "loss": math.nan, "learning_rate": 1e-3, "progress_percent": 100.0,
           "grad_norm": math.inf}
    sys.stdout.write(json.dumps({"type": "progress", "progress": raw}) + "\n")  # "loss": NaN, not JSON
    sys.stdout.flush()
    channel.status("completed", "done", details={"train_loss": math.nan})
    return 0


if __name__ == "__main__":
    sys.exit(main())
