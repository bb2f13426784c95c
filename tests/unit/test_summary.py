"""The run summary (`details.summary`): built from a job's progress events when it
ends, stored with its terminal status, read so far for a training job, and bounded."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobStore
from finetune_studio.jobs.summary import SPARKLINE_POINTS, sparkline


@pytest.fixture
def service(tmp_path: Path) -> JobService:
    return JobService(JobStore(tmp_path / "studio.db"), tmp_path / "jobs")


def training_job(service: JobService, request: dict[str, Any]) -> str:
    job = service.create_job(request, "Queued", {})
    for phase in ("loading_model", "loading_dataset", "configuring", "training"):
        service.transition(job.id, phase, phase)
    return job.id


def step(number: int, total: int, loss: float, **extra: Any) -> dict[str, Any]:
    return {"step": number, "total_steps": total, "loss": loss, "learning_rate": 1e-4,
            "progress_percent": 100.0 * number / total, "num_tokens": 100 * number, **extra}


def summary_of(service: JobService, job_id: str) -> dict[str, Any]:
    status = service.status_of(service.store.get_job(job_id), with_summary=True)
    assert status.details is not None
    return dict(status.details["summary"])


def test_a_completed_job_carries_its_summary(service: JobService) -> None:
    job_id = training_job(service, {"model_name": "tiny", "training_type": "LoRA/QLoRA", "use_lora": True})
    for n, loss in enumerate([3.0, 2.0, 1.5, 1.25], start=1):
        service.record_progress(job_id, step(n, 4, loss, **({"eval_loss": 2.5 - n * 0.1} if n % 2 == 0 else {})))
    service.transition(job_id, "completed", "done")

    stored = json.loads(service.store.status_json(job_id)[1])["details"]["summary"]
    assert stored == summary_of(service, job_id)  # as served by /train/status and /train/jobs
    assert stored["method"] == "lora" and stored["model"] == "tiny"
    assert stored["steps"] == 4 and stored["tokens"] == 400
    assert stored["final_loss"] == 1.25
    assert stored["best_eval_loss"] == pytest.approx(2.1)
    assert stored["loss_sparkline"] == [3.0, 2.0, 1.5, 1.25]
    first = json.loads(service.store.events_after(job_id, 0)[0].data)["details"]["time"]
    last = json.loads(service.store.status_json(job_id)[1])["details"]["time"]
    assert stored["duration_seconds"] == pytest.approx(last - first, abs=1e-3)
    assert stored["duration_seconds"] >= 0


def test_a_long_run_has_a_sparkline_of_at_most_64_bucket_means_and_skips_non_finite_losses(service: JobService) -> None:
    job_id = training_job(service, {"model_name": "big", "training_type": "Full Finetuning"})
    losses = [10.0 - 9.0 * n / 1000 for n in range(1000)]
    for n, loss in enumerate(losses, start=1):
        service.record_progress(job_id, step(n, 1001, loss))
    service.record_progress(job_id, step(1001, 1001, math.nan))  # reported as loss null, loss_finite false
    service.transition(job_id, "error", "Training failed", error="diverged", details={"error_code": "diverged"})

    summary = json.loads(service.store.status_json(job_id)[1])["details"]["summary"]
    assert summary["method"] == "full" and summary["steps"] == 1001
    assert summary["final_loss"] == pytest.approx(losses[-1])  # the last finite loss
    assert summary["best_eval_loss"] is None
    line = summary["loss_sparkline"]
    assert len(line) == SPARKLINE_POINTS
    assert line == sorted(line, reverse=True)  # the decreasing curve's shape is kept
    assert line[0] == pytest.approx(sum(losses[:15]) / 15, rel=1e-4)  # the mean of the first bucket
    assert len(json.dumps(summary)) < 1500


def test_a_training_job_shows_its_summary_so_far_only_when_asked(service: JobService) -> None:
    job_id = training_job(service, {"model_name": "m"})
    service.record_progress(job_id, step(1, 10, 4.0))
    assert "summary" not in (service.status_of(service.store.get_job(job_id)).details or {})
    so_far = summary_of(service, job_id)
    assert so_far["steps"] == 1 and so_far["loss_sparkline"] == [4.0] and so_far["duration_seconds"] >= 0


def test_a_job_that_never_trained_has_an_empty_summary(service: JobService) -> None:
    job = service.create_job({"model_name": "m"}, "Queued", {})
    service.transition(job.id, "stopped", "Stopped while queued")
    summary = json.loads(service.store.status_json(job.id)[1])["details"]["summary"]
    assert summary["steps"] == 0 and summary["tokens"] is None and summary["final_loss"] is None
    assert summary["loss_sparkline"] == []


def test_the_sparkline_keeps_short_runs_whole() -> None:
    assert sparkline([1.0, 2.0]) == [1.0, 2.0]
    assert sparkline([float(n) for n in range(128)]) == [n * 2 + 0.5 for n in range(64)]


def test_the_summary_keeps_the_medians_of_tokens_per_second_and_mfu(service: JobService) -> None:
    job_id = training_job(service, {"model_name": "m"})
    rates = [(None, None), (80.0, 0.2), (100.0, 0.25), (90.0, 0.3), (1000.0, 0.9)]  # the first step has no rate yet
    for n, (rate, mfu) in enumerate(rates, start=1):
        extra = {"tokens_per_second": rate, "mfu": mfu} if rate is not None else {}
        service.record_progress(job_id, step(n, 5, 2.0, **extra))
    service.transition(job_id, "completed", "done")
    summary = json.loads(service.store.status_json(job_id)[1])["details"]["summary"]
    assert summary["median_tokens_per_second"] == 95.0  # one fast step does not move it
    assert summary["median_mfu"] == pytest.approx(0.275)

    quiet = training_job(service, {"model_name": "m"})
    service.record_progress(quiet, step(1, 1, 2.0))
    assert summary_of(service, quiet)["median_tokens_per_second"] is None and summary_of(service, quiet)["median_mfu"] is None
