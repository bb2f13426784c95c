"""What a restart does with the jobs the last server left behind, without torch.

The database is written as a server that died mid-run leaves it: a job in
`training` whose worker is still alive, a job whose recorded pid now belongs to an
unrelated process, and a queued job. The SIGKILLed real server, with a real child
and real checkpoints, is in tests/integration/test_training_jobs.py
(test_a_restarted_server_serves_old_jobs_and_ends_orphans).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient

from finetune_studio.api.app import create_app
from finetune_studio.config import Settings
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobStore
from finetune_studio.wire import last_checkpoint
from tests.helpers.jobs import InstantLauncher
from tests.helpers.polling import wait_for
from tests.helpers.processes import alive


def _leave_job(service: JobService, phase_path: list[str]) -> str:
    job = service.create_job({"model_name": "m"}, "Queued", {})
    for phase in phase_path:
        service.transition(job.id, phase, phase)
    return job.id


def _checkpoint(folder: Path, step: int, complete: bool = True) -> Path:
    path = folder / "checkpoints" / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"weights")
    if complete:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


def test_a_restart_kills_its_orphans_spares_reused_pids_and_runs_the_queue(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    settings.jobs_dir.mkdir(parents=True)
    store = JobStore(settings.db_path)
    service = JobService(store, settings.jobs_dir)
    to_training = ["loading_model", "loading_dataset", "configuring", "training"]
    orphan = _leave_job(service, to_training)
    reused = _leave_job(service, to_training[:3])
    queued = _leave_job(service, [])

    # The orphan's worker, as the kernel shows it: our child module and its job id on the command line.
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "finetune_studio.training.child", "--job-id", orphan]
    )
    stranger = subprocess.Popen(["sleep", "120"])  # took the pid the other job's worker had
    try:
        store.set_worker_pid(orphan, worker.pid)
        store.set_worker_pid(reused, stranger.pid)
        orphan_dir = settings.jobs_dir / orphan
        _checkpoint(orphan_dir, 2)
        kept = _checkpoint(orphan_dir, 10)
        _checkpoint(orphan_dir, 12, complete=False)  # the worker died while writing it
        (orphan_dir / "adapter").mkdir()
        store.close()

        with TestClient(create_app(settings, launcher=InstantLauncher()), base_url="http://127.0.0.1") as client:
            assert worker.wait(timeout=10) == -9
            assert alive(stranger.pid), "a process that is not our worker was killed"

            final = client.get(f"/train/status/{orphan}").json()
            assert final["phase"] == "error" and final["details"]["error_code"] == "server_restarted"
            assert final["details"]["last_checkpoint"] == str(kept)
            assert final["details"]["adapter_dir"] == str(orphan_dir / "adapter")
            assert f"Its last checkpoint is {kept}" in final["error"]
            assert f"resume_from_checkpoint {orphan!r}" in final["error"]

            other = client.get(f"/train/status/{reused}").json()
            assert other["phase"] == "error" and "It had saved no checkpoint yet" in other["error"]

            wait_for(lambda: client.get(f"/train/status/{queued}").json()["phase"] == "completed", timeout=30,
                     what="the queued job to run")
            assert {s["phase"] for s in client.get("/train/jobs").json()["data"]} == {"error", "completed"}
    finally:
        for process in (worker, stranger):
            process.kill()
            process.wait()


def test_last_checkpoint_is_the_newest_complete_one(tmp_path: Path) -> None:
    assert last_checkpoint(tmp_path) is None
    _checkpoint(tmp_path, 9)
    newest = _checkpoint(tmp_path, 10)  # 10 sorts before 9 as text
    _checkpoint(tmp_path, 11, complete=False)
    (tmp_path / "checkpoints" / "checkpoint-final").mkdir()
    assert last_checkpoint(tmp_path) == newest
