"""bf16 training and MFU in real training jobs on the tiny model (issue 26, items 2 and 4).

- `precision: auto` trains in bf16 on a CPU with AMX or AVX512-BF16 (fp32 elsewhere) and
  says so in `details.precision`; `precision: fp32` does not.
- Every step's progress event carries a finite `tokens_per_second` and an `mfu` in
  (0, 1]; the run summary keeps the medians of both.
- Loss parity: over 60 steps, the mean of the last 10 losses in bf16 is within 3% of fp32's.

The rule itself, and a CPU without native bf16, are tested in this process by
tests/unit/test_precision.py.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from finetune_studio.hardware import detect_cpu_bf16
from tests.helpers.jobs import collect, job_request, phases
from tests.helpers.servers import ServerProcess

pytestmark = pytest.mark.train

NATIVE = detect_cpu_bf16().native


def run(server: ServerProcess, body: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """The job's statuses by phase, and its progress events."""
    with server.client() as client:
        events = collect(client, client.start(body))
    assert phases(events)[-1] == "completed", events[-1].data
    statuses = {e.data["phase"]: e.data for e in events if e.kind == "status"}
    return statuses, [e.data for e in events if e.kind == "progress"]


def test_auto_trains_in_bf16_where_the_cpu_has_it_and_every_step_reports_its_mfu(
    shared_server: ServerProcess, tiny_model: Path
) -> None:
    common = {"max_steps": 8, "optim": "adamw_torch", "load_in_4bit": False}
    auto, auto_steps = run(shared_server, job_request(tiny_model, **common))
    fp32, fp32_steps = run(shared_server, job_request(tiny_model, precision="fp32", **common))

    expected = "bf16" if NATIVE else "fp32"
    for phase in ("configuring", "training", "completed"):
        assert auto[phase]["details"]["precision"]["dtype"] == expected, auto[phase]["details"]
        assert fp32[phase]["details"]["precision"] == {"dtype": "fp32", "asked": "fp32", "reason": "precision fp32 was asked for"}
    reason = auto["training"]["details"]["precision"]["reason"]
    assert reason == detect_cpu_bf16().describe() or reason.startswith(detect_cpu_bf16().describe())
    peak = auto["training"]["details"]["peak"]
    assert peak["dtype"] == expected and peak["flops_per_second"] > 0 and peak["measured"] in ("probe", "cache")
    assert fp32["training"]["details"]["peak"]["dtype"] == "fp32"

    for steps, statuses in ((auto_steps, auto), (fp32_steps, fp32)):
        assert [p["step"] for p in steps] == list(range(1, 9))
        for progress in steps:
            assert math.isfinite(progress["tokens_per_second"]) and progress["tokens_per_second"] > 0, progress
            assert math.isfinite(progress["mfu"]) and 0 < progress["mfu"] <= 1, progress
        summary = statuses["completed"]["details"]["summary"]
        assert summary["median_tokens_per_second"] == pytest.approx(statistics.median(p["tokens_per_second"] for p in steps),
                                                                    rel=1e-4)
        assert summary["median_mfu"] == pytest.approx(statistics.median(p["mfu"] for p in steps), rel=1e-3)


def test_bf16_loss_stays_within_3_percent_of_fp32_over_60_steps(shared_server: ServerProcess, tiny_model: Path) -> None:
    # A learning rate high enough that the tiny model's loss falls (from ~6.2 to ~5.4): a
    # bf16 run that did not learn, or learnt otherwise, would show here.
    common = {"max_steps": 60, "learning_rate": "1e-2", "lora_r": 8, "lora_alpha": 16, "random_seed": 1234,
              "optim": "adamw_torch", "load_in_4bit": False}
    losses = {}
    for precision in ("bf16", "fp32"):
        statuses, steps = run(shared_server, job_request(tiny_model, precision=precision, **common))
        assert statuses["training"]["details"]["precision"]["dtype"] == precision
        assert len(steps) == 60
        losses[precision] = [p["loss"] for p in steps]
    tail = {precision: sum(values[-10:]) / 10 for precision, values in losses.items()}
    assert tail["fp32"] < sum(losses["fp32"][:5]) / 5 - 0.3  # it learned
    assert abs(tail["bf16"] - tail["fp32"]) <= 0.03 * tail["fp32"], tail
