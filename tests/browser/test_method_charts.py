"""Issue 16 in the page: a method's metrics (`TrainingProgress.metrics`) are charted beside
the loss, in a real Chromium, from a job's stored events; an SFT job shows no such chart."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.browser import open_ui, show_stored_job, status_event

pytestmark = pytest.mark.browser

# The legend labels of each method chart shown, by chart.
LEGENDS = """() => Object.fromEntries([...document.querySelectorAll("figure.method-chart")]
  .filter((figure) => !figure.hidden)
  .map((figure) => [figure.dataset.testid,
                    [...figure.querySelectorAll(".u-legend .u-series:not(:first-child) .u-label")].map((l) => l.textContent)]))"""


def progress_event(job_id: str, event_id: int, step: int, metrics: dict[str, float] | None) -> dict[str, Any]:
    data: dict[str, Any] = {"step": step, "total_steps": 3, "loss": 0.7 - step / 10, "learning_rate": 1e-3,
                            "progress_percent": 100 * step / 3}
    if metrics is not None:
        data["metrics"] = metrics
    return {"job_id": job_id, "id": event_id, "kind": "progress", "data": data}


def stored_run(job_id: str, metrics: list[dict[str, float] | None]) -> list[dict[str, Any]]:
    events = [status_event(job_id, 1, "training", 1000.0)]
    events += [progress_event(job_id, step + 1, step, m) for step, m in enumerate(metrics, 1)]
    return events


def test_method_metrics_are_charted_beside_the_loss(server: Any, page: Any) -> None:
    open_ui(page, server.url)
    dpo = "6d0000000001"
    show_stored_job(page, dpo, stored_run(dpo, [
        {"rewards/chosen": 0.1 * s, "rewards/rejected": -0.1 * s, "rewards/margins": 0.2 * s, "rewards/accuracies": 0.5 + s / 10,
         "logps/chosen": -20.0} for s in (1, 2, 3)
    ]))
    assert page.evaluate(LEGENDS) == {
        "chart-method-rewards": ["chosen", "rejected", "margins"],
        "chart-method-accuracy": ["accuracies"],
    }

    grpo = "6d0000000002"
    show_stored_job(page, grpo, stored_run(grpo, [
        {"reward": 0.2, "reward_std": 0.1, "rewards/regex/mean": 0.2, "completions/mean_length": 4.0, "kl": 0.0},
        {"completions/mean_length": 3.0},  # a step that did not sample: no rewards logged
        {"reward": 0.9, "reward_std": 0.2, "rewards/regex/mean": 0.9, "completions/mean_length": 2.0, "kl": 0.1},
    ]))
    assert page.evaluate(LEGENDS) == {
        "chart-method-rewards": ["reward", "regex"],
        "chart-method-accuracy": ["reward std"],
        "chart-method-length": ["mean length"],
        "chart-method-kl": ["kl"],
    }

    sft = "6d0000000003"
    show_stored_job(page, sft, stored_run(sft, [None, None, None]))
    assert page.evaluate(LEGENDS) == {}
