"""A real server, real training children, the tiny model: the seed's API end to end.

What is the server's and not the child's is proven elsewhere with stand-in workers,
which cost no torch start-up: reconnecting with Last-Event-ID
(tests/reliability/test_reconnect.py), first-in first-out one at a time
(tests/reliability/test_load.py, with real children too), a SIGKILLed worker
(tests/reliability/test_faults.py). Stopping a queued job and a training one, with
the adapter saved, is tests/reliability/test_stop.py; bad data,
tests/integration/test_datasets.py.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import load_file

from finetune_studio.wire import last_checkpoint
from tests.helpers.jobs import collect, job_request, phases
from tests.helpers.polling import wait_for
from tests.helpers.servers import ServerProcess

pytestmark = pytest.mark.train

SEED_ORDER = ["idle", "loading_model", "loading_dataset", "configuring", "training", "completed"]


@pytest.fixture(scope="module")
def missing_then_trained(
    shared_server: ServerProcess, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, str, Path]:
    """A job on a model that cannot be loaded (a folder without config.json: the server
    refuses a path that does not exist before queueing), and a good one (6 steps) queued
    behind it, both run to their end: (the failed job, the trained job, the model's path)."""
    missing = tmp_path_factory.mktemp("nothing") / "not-a-model"
    missing.mkdir()
    with shared_server.client() as client:
        failed = client.start(job_request(missing))
        trained = client.start(job_request(tiny_model, max_steps=6))
        for job_id in (failed, trained):
            collect(client, job_id)
    return failed, trained, missing


def test_a_job_trains_to_completed_and_moves_the_weights(
    shared_server: ServerProcess, missing_then_trained: tuple[str, str, Path]
) -> None:
    server = shared_server
    job_id = missing_then_trained[1]
    with server.client() as client:
        events = collect(client, job_id)

        assert [e.id for e in events] == list(range(1, len(events) + 1))
        assert phases(events) == SEED_ORDER
        training_at = next(i for i, e in enumerate(events) if e.kind == "status" and e.data["phase"] == "training")
        # The six steps follow; among them, only training's compile decision (compile: auto) is said.
        during = [e for e in events[training_at + 1:] if not (e.kind == "status" and e.data["phase"] == "training")]
        assert [e.kind for e in during[:6]] == ["progress"] * 6
        again = [e.data["message"] for e in events[training_at + 1:] if e.kind == "status" and e.data["phase"] == "training"]
        assert all(message.startswith("Training: not compiled: ") for message in again), again
        assert all(e.data["is_training_running"] == (e.data["phase"] == "training") for e in events if e.kind == "status")

        steps = [e.data for e in events if e.kind == "progress"]
        assert [p["step"] for p in steps] == [1, 2, 3, 4, 5, 6]
        assert {p["total_steps"] for p in steps} == {6}
        assert steps[-1]["progress_percent"] == 100.0
        assert all(math.isfinite(p["loss"]) and p["loss"] > 0 for p in steps)
        assert all(p["learning_rate"] > 0 for p in steps[:-1])
        assert all(p["elapsed_seconds"] >= 0 and p["eta_seconds"] >= 0 for p in steps)
        assert steps[-1]["eta_seconds"] == 0
        # The live metrics (issue 17): a recent token rate, TRL's token accuracy, the child's memory.
        assert all(p["tokens_per_second"] > 0 for p in steps)
        assert all(0 <= p["mean_token_accuracy"] <= 1 for p in steps)
        assert all(p["memory_bytes"] > 10_000_000 for p in steps)
        assert all(p.get("gpu_memory_bytes", 0) >= 0 for p in steps)

        final = events[-1].data
        adapter = Path(final["details"]["adapter_dir"])
        assert adapter.parent == server.data_dir / "jobs" / job_id
        weights = load_file(str(adapter / "adapter_model.safetensors"))
        lora_b = {name: w for name, w in weights.items() if "lora_B" in name}
        assert lora_b, f"no LoRA B matrices in {sorted(weights)}"
        # LoRA starts with B = 0, so the adapter equals the base model until training moves B.
        assert all(np.abs(w).max() > 0 for w in lora_b.values())
        assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4

        status = client.status(job_id)
        assert status["phase"] == "completed" and status["is_training_running"] is False
        assert client.progress(job_id)["step"] == 6


def test_a_missing_model_ends_in_error_and_the_server_keeps_serving(
    shared_server: ServerProcess, missing_then_trained: tuple[str, str, Path], tiny_model: Path
) -> None:
    server = shared_server
    failed, trained, missing = missing_then_trained
    with server.client() as client:
        model_events = collect(client, failed)
        assert phases(model_events) == ["idle", "loading_model", "error"]
        error = model_events[-1].data
        assert error["details"]["error_code"] == "model_not_found"
        assert str(missing) in error["error"] and "no config.json" in error["error"]
        # A model path that does not exist is refused before it is queued, naming the field.
        gone = httpx.post(f"{server.url}/train/start", json=job_request(missing / "gone"))
        assert gone.status_code == 400 and gone.json()["field"] == "model_name" and "does not exist" in gone.json()["error"]
        # The job queued behind it trained (its events: the test above).
        assert client.status(trained)["phase"] == "completed"

        # A dataset path that does not exist is refused at once, with the reason.
        refused = httpx.post(f"{server.url}/train/start", json=job_request(tiny_model, local_datasets=["/nope.jsonl"]))
        assert refused.status_code == 400
        assert refused.json()["status"] == "error" and "/nope.jsonl" in refused.json()["error"]

        assert client.health() == {"status": "ok"}


def test_a_restarted_server_serves_old_jobs_and_ends_orphans(start_server, tiny_model: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = start_server()
    with server.client() as client:
        done = client.start(job_request(tiny_model, max_steps=3))
        done_events = collect(client, done)
        orphan = client.start(job_request(tiny_model, max_steps=3000, save_steps=2))
        waiting = client.start(job_request(tiny_model, max_steps=2))
        orphan_dir = server.data_dir / "jobs" / orphan
        saved = wait_for(lambda: last_checkpoint(orphan_dir), what="the orphan's first checkpoint")
        pid = client.status(orphan)["details"]["worker_pid"]
    persisted = _events_on_disk(server.data_dir / "studio.db", orphan)

    server.kill()  # SIGKILL: no clean shutdown, the child is left behind
    # The child notices (its stdin closes), stops after its step, saves, and exits by itself.
    wait_for(lambda: not _alive(pid), timeout=120, what="the orphaned child to notice and exit")
    assert (orphan_dir / "adapter" / "adapter_model.safetensors").is_file()
    server.start()
    with server.client() as client:
        # Old jobs and their full event logs survive.
        assert [(e.id, e.data) for e in collect(client, done)] == [(e.id, e.data) for e in done_events]
        orphan_events = collect(client, orphan)
        assert [(e.id, e.data) for e in orphan_events[: len(persisted)]] == persisted
        orphan_final = orphan_events[-1].data
        assert orphan_final["phase"] == "error"
        assert orphan_final["details"]["error_code"] == "server_restarted"
        assert orphan_final["details"]["adapter_dir"] == str(orphan_dir / "adapter")
        # Its last complete checkpoint is kept and named, with what the trainer needs to resume from it.
        checkpoint = Path(orphan_final["details"]["last_checkpoint"])
        assert checkpoint.parent == orphan_dir / "checkpoints"
        assert int(checkpoint.name.split("-")[1]) >= int(saved.name.split("-")[1])
        for name in ("adapter_model.safetensors", "trainer_state.json", "optimizer.pt", "scheduler.pt"):
            assert (checkpoint / name).is_file(), name
        assert str(checkpoint) in orphan_final["error"]
        # The queued job runs after the restart.
        assert phases(collect(client, waiting)) == SEED_ORDER
        assert all(s["phase"] in ("completed", "error", "stopped") for s in client.jobs())
        # And the orphan's checkpoint resumes: training goes on from the step after it.
        step = int(checkpoint.name.split("-")[1])
        resumed = client.start(job_request(tiny_model, max_steps=step + 2, resume_from_checkpoint=str(checkpoint)))
        resumed_events = collect(client, resumed)
        assert phases(resumed_events) == SEED_ORDER
        assert [e.data["step"] for e in resumed_events if e.kind == "progress"] == [step + 1, step + 2]


def _events_on_disk(db_path: Path, job_id: str) -> list[tuple[int, dict]]:
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT id, data FROM events WHERE job_id = ? ORDER BY id", (job_id,)).fetchall()
    finally:
        db.close()
    return [(int(event_id), json.loads(data)) for event_id, data in rows]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_a_clean_server_shutdown_stops_and_saves_the_running_job(start_server, tiny_model: Path) -> None:  # type: ignore[no-untyped-def]
    server = start_server()
    with server.client() as client:
        running = client.start(job_request(tiny_model, max_steps=3000))
        waiting = client.start(job_request(tiny_model, max_steps=2))
        wait_for(lambda: client.progress(running), what="the first training step")
    server.stop()  # SIGTERM: the supervisor stops the child, which saves
    # uvicorn re-raises the signal once its graceful shutdown is done.
    assert server.process is not None and server.process.returncode in (0, -signal.SIGTERM)
    server.start()
    with server.client() as client:
        final = collect(client, running)[-1].data
        assert final["phase"] == "stopped"
        assert (Path(final["details"]["adapter_dir"]) / "adapter_model.safetensors").is_file()
        assert phases(collect(client, waiting)) == SEED_ORDER


def test_the_job_list_carries_a_finished_runs_summary(
    shared_server: ServerProcess, missing_then_trained: tuple[str, str, Path], tiny_model: Path
) -> None:
    failed, trained, _ = missing_then_trained
    with shared_server.client() as client:
        listed = {job["job_id"]: job for job in client.jobs()}
        steps = [e.data for e in collect(client, trained) if e.kind == "progress"]
    summary = listed[trained]["details"]["summary"]
    assert summary["method"] == "lora" and summary["model"] == str(tiny_model)
    assert summary["steps"] == 6 and summary["tokens"] == steps[-1]["num_tokens"] > 0
    assert summary["final_loss"] == pytest.approx(steps[-1]["loss"], rel=1e-4)
    assert summary["loss_sparkline"] == pytest.approx([p["loss"] for p in steps], rel=1e-4)
    assert summary["best_eval_loss"] is None  # no evaluation data
    assert 0 < summary["duration_seconds"] < 600
    # A job that failed before training has a summary too, with nothing trained.
    assert listed[failed]["details"]["summary"]["steps"] == 0
