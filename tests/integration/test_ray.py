"""Jobs on a real Ray cluster (DESIGN.md section 11): two nodes on this machine, started here.

The cluster is `ray start --head` and `ray start --address` with one CPU each, on
127.0.0.1, each in a session of its own (stopped by process group at the end), with
a short temp dir (Ray's unix sockets allow ~107 characters). A real server runs
each job's Ray driver; Ray Train runs the recipe in two workers, one per node.

What is proven: a 2-worker LoRA job streams one event per step and saves its
adapter, and its losses are those of a 1-worker job with the same global batch (the
second job also waits for the cluster's resources in Ray's queue, and says so); a
stop ends `stopped` with a checkpoint saved by every rank; a killed worker makes Ray
Train restart from the last checkpoint and finish (max_failures 1), or ends the job
`error` naming the lost worker (max_failures 0).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from finetune_studio.cli.local_server import free_port
from finetune_studio.wire import last_checkpoint
from tests.conftest import ServerProcess, collect, job_request, phases, wait_for

pytest.importorskip("ray", reason="the Ray tests need finetune-studio[ray]")
pytestmark = [pytest.mark.train, pytest.mark.slow]

RAY = str(Path(sys.executable).with_name("ray"))
# Two workers of one CPU each: the whole cluster. A job that asks for more waits.
WORKERS = {"num_workers": 2, "resources_per_worker": {"CPU": 1}}


class Node:
    """One `ray start --block` process group."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [RAY, "start", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats",
                 f"--dashboard-agent-listen-port={free_port()}", *args],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def started(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"ray start exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
        return "Ray runtime started" in self.log.read_text(errors="replace")

    def stop(self) -> None:
        """End the node's process group, then what it started in sessions of their own (Ray's
        worker processes, and helper actors that outlive their job): every process it started."""
        try:
            started = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            started = []
        for signum, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.process.pid, signum)
            except ProcessLookupError:
                break
            try:
                self.process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        for process in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(started, timeout=10)


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The address of a 2-node cluster (1 CPU each) on 127.0.0.1."""
    temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    logs = tmp_path_factory.mktemp("ray-logs")
    port = free_port()
    address = f"127.0.0.1:{port}"
    nodes = [Node(["--head", f"--port={port}", f"--temp-dir={temp}", "--include-dashboard=false"], logs / "head.log")]
    try:
        wait_for(nodes[0].started, timeout=120, interval=0.2, what="the Ray head node")
        nodes.append(Node([f"--address={address}", f"--temp-dir={temp}"], logs / "worker.log"))
        wait_for(nodes[1].started, timeout=120, interval=0.2, what="the second Ray node")
        yield address
    finally:
        for node in reversed(nodes):
            node.stop()
        shutil.rmtree(temp, ignore_errors=True)


def ray_server(start_server: Any, address: str, max_failures: int) -> ServerProcess:
    env = {"FINETUNE_STUDIO_RAY_ADDRESS": address, "FINETUNE_STUDIO_RAY_MAX_FAILURES": str(max_failures)}
    return start_server(env=env)  # type: ignore[no-any-return]


def progress(events: list[Any]) -> list[dict[str, Any]]:
    return [e.data for e in events if e.kind == "progress"]


def messages(events: list[Any]) -> list[str]:
    return [str(e.data["message"]) for e in events if e.kind == "status"]


def test_two_workers_train_as_one_with_the_same_global_batch(ray_cluster: str, start_server: Any, tiny_model: Path) -> None:
    server = ray_server(start_server, ray_cluster, max_failures=0)
    with server.client() as client:
        # Queued together: the 2-worker job takes the whole cluster, the 1-worker job waits in Ray's queue.
        two = client.start(job_request(tiny_model, max_steps=6, batch_size=1, **WORKERS))
        one = client.start(job_request(tiny_model, max_steps=6, batch_size=2, num_workers=1))
        events = {job: collect(client, job) for job in (two, one)}

    for job, run in events.items():
        assert [e.id for e in run] == list(range(1, len(run) + 1))
        assert phases(run)[-1] == "completed", messages(run)
        assert [p for p in phases(run) if p != "loading_model"] == [
            "idle", "loading_dataset", "configuring", "training", "completed"]
        assert [p["step"] for p in progress(run)] == [1, 2, 3, 4, 5, 6]  # one event per optimizer step
        waiting = [m for m in messages(run) if m.startswith("Waiting for the Ray cluster")]
        assert len(waiting) == 1 and "with CPU 1 each" in waiting[0]
        final = run[-1].data["details"]
        assert final["ray"]["num_workers"] == (2 if job == two else 1)
        adapter = Path(final["adapter_dir"])
        assert adapter == server.data_dir / "jobs" / job / "adapter"
        assert (adapter / "adapter_model.safetensors").is_file()
        assert (adapter.parent / "job.json").is_file()

    # The same samples make each global batch: two ranks of 1 row or one of 2 rows, in the
    # same order (one seed), with the loss averaged over the batch's tokens either way.
    # What may differ is only float rounding: the gradient is summed across ranks by
    # all-reduce in another order than within one batch. Over 6 steps that moves the
    # losses by far less than 1e-3 relative, while one step of training moves them by
    # more than 1e-3 (checked below), so the bound tells the two apart.
    losses = {job: [p["loss"] for p in progress(run)] for job, run in events.items()}
    for a, b in zip(losses[two], losses[one], strict=True):
        assert math.isclose(a, b, rel_tol=1e-4), (losses[two], losses[one])
    assert abs(losses[one][0] - losses[one][-1]) > 1e-3 * losses[one][0]


def test_a_stop_ends_stopped_with_a_checkpoint_from_every_rank(ray_cluster: str, start_server: Any, tiny_model: Path) -> None:
    server = ray_server(start_server, ray_cluster, max_failures=0)
    with server.client() as client:
        job = client.start(job_request(tiny_model, max_steps=2000, save_steps=0, **WORKERS))
        stream = client.stream(job)
        seen = []
        for event in stream:
            seen.append(event)
            if event.kind == "progress" and event.data["step"] >= 3:
                break
        client.stop(job)
        events = collect(client, job)

    final = events[-1].data
    assert final["phase"] == "stopped", final
    steps = [p["step"] for p in progress(events)]
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] < 2000
    checkpoint = last_checkpoint(server.data_dir / "jobs" / job)
    assert checkpoint is not None and checkpoint.name == f"checkpoint-{steps[-1]}"
    # Both ranks left the loop after the same step and saved their part of it.
    assert {p.name for p in checkpoint.glob("rng_state_*.pth")} == {"rng_state_0.pth", "rng_state_1.pth"}
    assert (Path(final["details"]["adapter_dir"]) / "adapter_model.safetensors").is_file()


def kill_rank_zero_after(client: Any, job: str, step: int) -> tuple[int, list[Any]]:
    """Kill rank 0's process once `step` is trained; (its pid, the events seen)."""
    seen = []
    pid = 0
    for event in client.stream(job):
        seen.append(event)
        if event.kind == "status" and event.data["phase"] == "training":
            pid = int(event.data["details"]["worker_pid"])
        if event.kind == "progress" and event.data["step"] >= step:
            break
    assert pid
    os.kill(pid, signal.SIGKILL)
    return pid, seen


def test_a_killed_worker_is_restarted_from_the_last_checkpoint(ray_cluster: str, start_server: Any, tiny_model: Path) -> None:
    server = ray_server(start_server, ray_cluster, max_failures=1)
    with server.client() as client:
        job = client.start(job_request(tiny_model, max_steps=30, save_steps=4, **WORKERS))
        pid, _ = kill_rank_zero_after(client, job, step=6)
        events = collect(client, job)

    final = events[-1].data
    assert final["phase"] == "completed", final
    lost = [m for m in messages(events) if m.startswith("A worker was lost")]
    assert len(lost) == 1 and f"pid {pid}" in lost[0] and "restart 1 of at most 1" in lost[0]
    assert any("resuming after step 4" in m for m in messages(events))
    steps = [p["step"] for p in progress(events)]
    assert steps[-1] == 30 and set(steps) == set(range(1, 31))
    assert final["details"]["restarts"] == [lost[0]]
    assert (Path(final["details"]["adapter_dir"]) / "adapter_model.safetensors").is_file()


def test_past_max_failures_the_job_ends_in_error_naming_the_lost_worker(
    ray_cluster: str, start_server: Any, tiny_model: Path
) -> None:
    server = ray_server(start_server, ray_cluster, max_failures=0)
    with server.client() as client:
        job = client.start(job_request(tiny_model, max_steps=2000, save_steps=2, **WORKERS))
        pid, _ = kill_rank_zero_after(client, job, step=3)
        events = collect(client, job)

    final = events[-1].data
    assert final["phase"] == "error", final
    assert final["details"]["error_code"] == "worker_died"
    assert f"pid {pid}" in final["error"] and "on node " in final["error"]
    assert "max_failures is 0" in final["error"]
    assert final["details"]["last_checkpoint"].endswith("checkpoint-2")
