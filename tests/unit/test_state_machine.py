"""The state machine's edges: unknown targets, the time on every status, queue
positions read when asked, and restart recovery (a requested stop survives a crash)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune_studio.errors import InvalidTransition
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobStore
from finetune_studio.supervisor.recovery import recover_jobs
from finetune_studio.wire import JobFolder


@pytest.fixture
def service(tmp_path: Path) -> JobService:
    return JobService(JobStore(tmp_path / "studio.db"), tmp_path / "jobs")


def running_job(service: JobService) -> str:
    job = service.create_job({"model_name": "m"}, "Queued", {})
    for phase in ("loading_model", "loading_dataset", "configuring", "training"):
        service.transition(job.id, phase, phase)
    return job.id


def test_idle_is_entered_only_by_resuming_a_paused_job(service: JobService) -> None:
    # Resume (stopped with details.paused -> idle) is the one edge into idle; a queued
    # job cannot enter it again, and neither can a stopped job that was not paused.
    job = service.create_job({"model_name": "m"}, "Queued", {})
    with pytest.raises(InvalidTransition, match="from idle to idle"):
        service.transition(job.id, "idle", "x")
    service.transition(job.id, "stopped", "Stopped")
    with pytest.raises(InvalidTransition, match="only a paused job resumes"):
        service.transition(job.id, "idle", "x")
    assert service.store.get_job(job.id).last_event_id == 2  # nothing was written


@pytest.mark.parametrize("target", ["bogus", "", "COMPLETED"])
def test_an_unknown_or_unreachable_target_is_an_invalid_transition(service: JobService, target: str) -> None:
    job = service.create_job({"model_name": "m"}, "Queued", {})
    with pytest.raises(InvalidTransition, match=repr(target)):
        service.transition(job.id, target, "x")
    with pytest.raises(InvalidTransition):
        service.store.transition(job.id, {"phase": target, "message": "x"})
    assert service.store.get_job(job.id).phase == "idle"
    assert service.store.get_job(job.id).last_event_id == 1  # nothing was written


def test_every_status_event_carries_its_time(service: JobService) -> None:
    job_id = running_job(service)
    service.transition(job_id, "completed", "done")
    times = [json.loads(e.data)["details"]["time"] for e in service.store.events_after(job_id, 0)]
    assert len(times) == 6
    assert times == sorted(times) and all(isinstance(t, float) and t > 1.7e9 for t in times)


def test_the_queue_position_is_read_when_asked(service: JobService) -> None:
    job = service.create_job({"model_name": "m"}, "Queued", {})
    record = service.store.get_job(job.id)
    for position in (3, 1):
        status = service.status_of(record, queue_position=position)
        assert status.details is not None and status.details["queue_position"] == position
        assert status.message == f"Queued (position {position})"
    stored = json.loads(service.store.events_after(job.id, 0)[0].data)
    assert "queue_position" not in stored["details"] and "position" not in stored["message"]


def checkpoint(folder: Path, step: int) -> Path:
    path = JobFolder(folder).checkpoints / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text("{}")
    return path


def test_after_a_crash_a_job_that_was_stopping_ends_stopped_with_its_checkpoint(service: JobService) -> None:
    job_id = running_job(service)
    service.mark_stop_requested(job_id)
    saved = checkpoint(service.jobs_dir / job_id, 4)
    (JobFolder(service.jobs_dir / job_id).adapter).mkdir()

    recover_jobs(service)

    job = service.store.get_job(job_id)
    assert job.phase == "stopped"
    assert job.status["details"]["last_checkpoint"] == str(saved)
    assert job.status["details"]["adapter_dir"] == str(service.jobs_dir / job_id / "adapter")
    assert "error_code" not in job.status["details"]


def test_after_a_crash_a_running_job_ends_in_error_and_a_queued_one_stays(service: JobService) -> None:
    running = running_job(service)
    saved = checkpoint(service.jobs_dir / running, 2)
    queued = service.create_job({"model_name": "m"}, "Queued", {}).id

    recover_jobs(service)

    job = service.store.get_job(running)
    assert job.phase == "error"
    assert job.status["details"]["error_code"] == "server_restarted"
    assert job.status["details"]["last_checkpoint"] == str(saved)
    assert f"resume_from_checkpoint {running!r}" in job.status["error"]
    assert service.store.get_job(queued).phase == "idle"
    recover_jobs(service)  # a second recovery finds nothing left to do
    assert service.store.get_job(running).last_event_id == job.last_event_id


def test_a_queued_job_gets_its_stored_request_back_with_only_the_secrets_it_had(service: JobService, tmp_path: Path) -> None:
    import asyncio

    from finetune_studio.config import Settings
    from finetune_studio.supervisor.supervisor import Supervisor

    async def prepare() -> list[tuple[dict[str, object], list[str]]]:
        supervisor = Supervisor(service, launcher=None, settings=Settings(data_dir=tmp_path))  # type: ignore[arg-type]
        stored = {"model_name": "m", "withheld_secrets": ["hf_token", "wandb_token"], "queued_warnings": ["unknown field 'x' ignored"]}
        kept = service.create_job(stored, "Queued", {}).id
        lost = service.create_job(stored, "Queued", {}).id
        plain = service.create_job({"model_name": "m", "withheld_secrets": [], "queued_warnings": []}, "Queued", {}).id
        supervisor.submit(kept, {"hf_token": "hf-secret", "wandb_token": "wb-secret"})
        return [(active.request, active.notes) for active in
                (supervisor._prepare(service.store.get_job(job_id)) for job_id in (kept, lost, plain))]

    (kept_request, kept_notes), (lost_request, lost_notes), (plain_request, plain_notes) = asyncio.run(prepare())
    assert kept_request == {"model_name": "m", "hf_token": "hf-secret", "wandb_token": "wb-secret"}
    assert kept_notes == ["unknown field 'x' ignored"]
    assert lost_request == {"model_name": "m"}  # queued before a restart: the secrets were in memory only
    assert lost_notes[-1] == "this job was queued before a server restart and runs without hf_token and wandb_token"
    assert plain_request == {"model_name": "m"} and plain_notes == []  # it never had any: no warning
