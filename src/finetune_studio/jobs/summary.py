"""A job's run summary (`details.summary`): its final loss, best evaluation loss, steps,
tokens, duration, method, model, the medians of its tokens per second and MFU, and a
loss sparkline of at most SPARKLINE_POINTS points.

It lets a browser that never watched a job see its history in `GET /train/jobs`; the
full curves stay in the event stream. It is built from the job's progress events in
one query (`JobStore.progress_points`, which reads the few numbers in SQL without
parsing each event in Python), once when the job ends, so its size is fixed: a few
numbers and the sparkline.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any, Optional

from finetune_studio.schemas import method_of

SPARKLINE_POINTS = 64

# One progress event as the store reads it: (step, loss, eval_loss, num_tokens, tokens_per_second, mfu);
# None where unset.
ProgressPoint = tuple[int, Optional[float], Optional[float], Optional[int], Optional[float], Optional[float]]


def _round(value: float) -> float:
    """Five significant digits: enough for a curve, and the summary stays small."""
    return float(f"{value:.5g}")


def finite_median(values: Sequence[Optional[float]]) -> Optional[float]:
    """The median of the finite values, five significant digits; None when there are none."""
    kept = [value for value in values if value is not None and math.isfinite(value)]
    return _round(statistics.median(kept)) if kept else None


def sparkline(losses: Sequence[float], points: int = SPARKLINE_POINTS) -> list[float]:
    """At most `points` values: each the mean of an equal share of the losses, in order
    (so a spike is averaged into its neighbours, not dropped or picked at random)."""
    count = len(losses)
    if count <= points:
        return [_round(loss) for loss in losses]
    line = []
    for bucket in range(points):
        start, end = bucket * count // points, (bucket + 1) * count // points
        line.append(_round(sum(losses[start:end]) / (end - start)))
    return line


def summarize(
    points: Sequence[ProgressPoint],
    request: dict[str, Any],
    started: Optional[float],
    ended: Optional[float],
) -> dict[str, Any]:
    """The summary of a run from its progress points, its request, and the times (seconds
    since the epoch) it was queued and it ended (`ended` is None while it runs)."""
    losses = [point[1] for point in points if point[1] is not None and math.isfinite(point[1])]
    evals = [point[2] for point in points if point[2] is not None and math.isfinite(point[2])]
    last = points[-1] if points else None
    duration = round(ended - started, 3) if started is not None and ended is not None else None
    return {
        "method": method_of(request.get("training_type"), request.get("use_lora")),
        "model": request.get("model_name"),
        "steps": last[0] if last else 0,
        "tokens": last[3] if last else None,
        "final_loss": _round(losses[-1]) if losses else None,
        "best_eval_loss": _round(min(evals)) if evals else None,
        "duration_seconds": duration,
        # The steps' rates as the page showed them; the median, so a slow first step or an
        # evaluation's pause does not move it.
        "median_tokens_per_second": finite_median([point[4] for point in points]),
        "median_mfu": finite_median([point[5] for point in points]),
        "loss_sparkline": sparkline(losses),
    }
