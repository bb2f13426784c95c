"""The divergence guard, end to end: a real job on the tiny model with an absurd
learning rate ends `error` / `diverged` at its first non-finite loss or gradient
norm, instead of training on, and the diverged weights are not saved as the result."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from finetune_studio.wire import JobFolder
from tests.helpers.jobs import collect, job_request
from tests.helpers.servers import ServerProcess

pytestmark = pytest.mark.train


def _non_finite(progress: dict[str, Any]) -> bool:
    grad = progress.get("grad_norm")
    return progress.get("loss_finite") is False or (grad is not None and not math.isfinite(grad))


def test_an_absurd_learning_rate_ends_the_job_as_diverged_at_the_first_non_finite_step(
    server: ServerProcess, tiny_model: Path
) -> None:
    # Full fine-tuning with no gradient clipping and lr 1e6: the weights blow up within a few steps.
    request = job_request(
        tiny_model, training_type="Full Finetuning", use_lora=False, learning_rate="1e6",
        max_grad_norm=0.0, max_steps=40, save_steps=1,
    )
    with server.client() as client:
        job_id = client.start(request)
        events = collect(client, job_id)

    steps = [e.data for e in events if e.kind == "progress"]
    final = events[-1].data
    assert final["phase"] == "error", (final, steps)
    details = final["details"]
    assert details["error_code"] == "diverged"
    first_bad = details["diverged_at_step"]
    # Every step before it was finite; it is the last step reported (none after it was trained),
    # and its event shows the non-finite value (a null loss, or no gradient norm: JSON has no NaN).
    assert [p["step"] for p in steps] == list(range(1, first_bad + 1))
    assert not any(_non_finite(p) for p in steps[:-1])
    assert _non_finite(steps[-1]) or "grad_norm" not in steps[-1], steps[-1]
    assert first_bad < 40
    assert f"step {first_bad}" in final["error"]
    assert "learning rate" in final["error"].lower()
    # The diverged weights are not the result; the checkpoints kept are from before it.
    folder = JobFolder(Path(details["output_dir"]))
    assert not folder.model.exists() and not folder.adapter.exists()
    saved = sorted(int(p.name.rsplit("-", 1)[1]) for p in folder.checkpoints.glob("checkpoint-*"))
    assert all(step < first_bad for step in saved), saved
