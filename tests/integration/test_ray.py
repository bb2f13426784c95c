"""Jobs on a real Ray cluster (docs/SCALE-OUT.md): two nodes on this machine, started here.

The cluster is `ray start --head` and `ray start --address` with one CPU each, on
127.0.0.1, each in a session of its own (stopped by process group at the end), with
a short temp dir (Ray's unix sockets allow ~107 characters). A real server runs
each job's Ray driver; Ray Train runs the recipe in two workers, one per node.

What is proven: a 2-worker LoRA job streams one event per step and saves its
adapter, and its losses are those of a 1-worker job with the same global batch (the
second job also waits for the cluster's resources in Ray's queue, and says so); a
stop ends `stopped` with a checkpoint saved by every rank; a killed worker makes Ray
Train restart from the last checkpoint and finish (max_failures 1), or ends the job
`error` naming the lost worker (max_failures 0); a stop sent while the run restarts
ends it after one step of the new attempt; a job through a Ray Client address
(`ray://`, the head node's client server) streams its steps and stops; and the job's
files travel through an s3:// URI when the nodes share no folder.
"""

from __future__ import annotations

import json
import math
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from finetune_studio.wire import last_checkpoint
from tests.helpers.jobs import collect, job_request, phases
from tests.helpers.polling import wait_for
from tests.helpers.ray_cluster import Cluster, ray_server, two_node_cluster
from tests.helpers.s3 import CREDENTIALS, S3, s3_server
from tests.helpers.servers import ServerProcess

pytest.importorskip("ray", reason="the Ray tests need finetune-studio[ray]")
pytestmark = [pytest.mark.train, pytest.mark.slow]

# Two workers of one CPU each: the whole cluster. A job that asks for more waits.
WORKERS = {"num_workers": 2, "resources_per_worker": {"CPU": 1}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """tests/helpers/ray_cluster.py's 2-node cluster, for this module's tests."""
    with two_node_cluster(tmp_path_factory.mktemp("ray-logs")) as started:
        yield started


@pytest.fixture(scope="module")
def ray_cluster(cluster: Cluster) -> str:
    """The cluster's address."""
    return cluster.address


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    with s3_server() as server:
        yield server


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
    stop_after_step_three(server, tiny_model)


def stop_after_step_three(server: ServerProcess, model: Path) -> list[Any]:
    """Start a long 2-worker job, stop it once step 3 is trained, and check that it ended
    `stopped` with a checkpoint of its last step from every rank, and its adapter; its events."""
    with server.client() as client:
        job = client.start(job_request(model, max_steps=2000, save_steps=0, **WORKERS))
        for event in client.stream(job):
            if event.kind == "progress" and event.data["step"] >= 3:
                break
        else:  # the job ended before its third step: say how, with the end of its worker's log
            status = client.status(job)
            log = server.data_dir / "jobs" / job / "worker.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no worker.log)"
            raise AssertionError(f"the job ended {status['phase']} before step 3: {status.get('error')}\n{tail}")
        client.stop(job)
        events = collect(client, job)

    final = events[-1].data
    assert final["phase"] == "stopped", final
    steps = [p["step"] for p in progress(events)]
    assert steps == list(range(1, steps[-1] + 1)) and 3 <= steps[-1] < 2000
    checkpoint = last_checkpoint(server.data_dir / "jobs" / job)
    assert checkpoint is not None and checkpoint.name == f"checkpoint-{steps[-1]}"
    # Both ranks left the loop after the same step and saved their part of it.
    assert {p.name for p in checkpoint.glob("rng_state_*.pth")} == {"rng_state_0.pth", "rng_state_1.pth"}
    assert (Path(final["details"]["adapter_dir"]) / "adapter_model.safetensors").is_file()
    return events


def test_through_ray_client_a_job_streams_its_steps_and_a_stop_saves(
    cluster: Cluster, start_server: Any, tiny_model: Path
) -> None:
    """A `ray://` address (the head node's Ray Client server): the driver is a Ray Client, the
    job streams one event per step, and a stop ends it `stopped` with every rank's part of
    its last checkpoint and the adapter."""
    server = ray_server(start_server, cluster.client_address, max_failures=0)
    events = stop_after_step_three(server, tiny_model)
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert f"Connecting to the Ray cluster at {cluster.client_address}" in messages(events)
    assert events[-1].data["details"]["ray"]["address"] == cluster.client_address


def run_killing_rank_zero(server: ServerProcess, request: dict[str, Any], step: int,
                          then_stop: bool = False) -> tuple[str, int, list[Any]]:
    """Start the job, kill rank 0's process once `step` is trained (and, with `then_stop`, ask
    for a stop right after), and follow the job to its end: (its id, the killed pid, its events)."""
    with server.client() as client:
        job = client.start(request)
        pid = 0
        for event in client.stream(job):
            if event.kind == "status" and event.data["phase"] == "training":
                pid = int(event.data["details"]["worker_pid"])
            if event.kind == "progress" and event.data["step"] >= step:
                break
        assert pid
        os.kill(pid, signal.SIGKILL)
        if then_stop:
            client.stop(job)
        return job, pid, collect(client, job)


def test_a_killed_worker_is_restarted_from_the_last_checkpoint(ray_cluster: str, start_server: Any, tiny_model: Path) -> None:
    server = ray_server(start_server, ray_cluster, max_failures=1)
    job, pid, events = run_killing_rank_zero(server, job_request(tiny_model, max_steps=30, save_steps=4, **WORKERS), step=6)

    final = events[-1].data
    assert final["phase"] == "completed", final
    lost = [m for m in messages(events) if m.startswith("A worker was lost")]
    assert len(lost) == 1 and f"pid {pid}" in lost[0] and "restart 1 of at most 1" in lost[0]
    assert any("resuming after step 4" in m for m in messages(events))
    steps = [p["step"] for p in progress(events)]
    assert steps[-1] == 30 and set(steps) == set(range(1, 31))
    assert final["details"]["restarts"] == [lost[0]]
    assert (Path(final["details"]["adapter_dir"]) / "adapter_model.safetensors").is_file()


def test_a_stop_while_the_run_restarts_ends_it_after_one_step_of_the_new_attempt(
    ray_cluster: str, start_server: Any, tiny_model: Path
) -> None:
    """The stop arrives right after rank 0 is killed, while Ray Train starts the workers again:
    the new attempt's first step is its last (the sink's first decision for it is `stop`), and
    it saves that step with every rank's part and the adapter. It never trains on to the step
    the lost attempt had reached."""
    # The stop's grace runs from the stop, sent right after the kill: it must cover Ray noticing the
    # lost worker, the restart and one step. The suite's 20 s did not under CI load (the new attempt
    # was terminated while it saved), so this test has the server's own default, 60 s.
    server = ray_server(start_server, ray_cluster, max_failures=1, FINETUNE_STUDIO_STOP_GRACE_SECONDS="60")
    job, pid, events = run_killing_rank_zero(server, job_request(tiny_model, max_steps=2000, save_steps=4, **WORKERS), step=6, then_stop=True)

    final = events[-1].data
    assert final["phase"] == "stopped", final
    restart = next(i for i, e in enumerate(events) if e.kind == "status" and e.data["message"].startswith("A worker was lost"))
    assert f"pid {pid}" in events[restart].data["message"]
    assert any("resuming after step 4" in m for m in messages(events[restart:])), messages(events)
    # Steps 5 and on were trained, and streamed, before the kill; the new attempt trains at most step 5 again.
    assert [p["step"] for p in progress(events[restart:])] == [5]
    checkpoint = last_checkpoint(server.data_dir / "jobs" / job)
    assert checkpoint is not None and checkpoint.name == "checkpoint-5"
    assert {p.name for p in checkpoint.glob("rng_state_*.pth")} == {"rng_state_0.pth", "rng_state_1.pth"}
    assert (Path(final["details"]["adapter_dir"]) / "adapter_model.safetensors").is_file()
    assert final["details"]["restarts"] == [events[restart].data["message"]]


def test_past_max_failures_the_job_ends_in_error_naming_the_lost_worker(
    ray_cluster: str, start_server: Any, tiny_model: Path
) -> None:
    server = ray_server(start_server, ray_cluster, max_failures=0)
    job, pid, events = run_killing_rank_zero(server, job_request(tiny_model, max_steps=2000, save_steps=2, **WORKERS), step=3)

    final = events[-1].data
    assert final["phase"] == "error", final
    assert final["details"]["error_code"] == "worker_died"
    assert f"pid {pid}" in final["error"] and "on node " in final["error"]
    assert "max_failures is 0" in final["error"]
    assert final["details"]["last_checkpoint"].endswith("checkpoint-2")


def test_with_no_shared_folder_the_files_travel_through_s3(
    cluster: Cluster, s3: S3, start_server: Any, tiny_model: Path
) -> None:
    """ray_storage_path an s3:// URI (a real S3 endpoint): the workers train in their nodes' own
    temporary folders, every rank uploads its part of each checkpoint, a restarted run fetches
    the last one from the bucket, and the server finds the results in the job folder for chat."""
    s3.make_bucket("studio")
    uri = s3.uri("studio", "cluster")
    server = ray_server(start_server, cluster.address, max_failures=1, FINETUNE_STUDIO_RAY_STORAGE_PATH=uri, **CREDENTIALS)
    job, pid, events = run_killing_rank_zero(server, job_request(tiny_model, max_steps=12, save_steps=4, **WORKERS), step=6)

    final = events[-1].data
    assert final["phase"] == "completed", final
    assert any("resuming after step 4" in m for m in messages(events)), messages(events)
    assert [p["step"] for p in progress(events)][-1] == 12
    assert final["details"]["storage"] == f"s3://studio/cluster/jobs/{job}"
    # What rank 0 said names the server's paths, not its node's.
    folder = server.data_dir / "jobs" / job
    assert final["details"]["adapter_dir"] == str(folder / "adapter")
    assert final["details"]["model_name"] == str(tiny_model)

    stored = s3.files("studio", f"cluster/jobs/{job}")
    for step in (4, 8, 12):
        part = f"cluster/jobs/{job}/checkpoints/checkpoint-{step}"
        # Both ranks' parts (each wrote its own RNG state on its own node), and the marker written after them.
        assert {f"{part}/rng_state_0.pth", f"{part}/rng_state_1.pth", f"{part}/.finetune-studio-stored",
                f"{part}/trainer_state.json"} <= set(stored), sorted(stored)
        assert (folder / "checkpoints" / f"checkpoint-{step}" / "rng_state_1.pth").is_file()  # copied to the server
    assert f"cluster/jobs/{job}/adapter/adapter_model.safetensors" in stored
    assert (folder / "adapter" / "adapter_model.safetensors").read_bytes() == _object(s3, f"cluster/jobs/{job}/adapter/adapter_model.safetensors")
    assert Path(json.loads((folder / "job.json").read_text())["base_model"]["location"]).resolve() == tiny_model.resolve()
    # The inputs went up once (the model folder and the data file) and each node used its own copy.
    inputs = s3.files("studio", "cluster/inputs")
    assert any(key.endswith("/config.json") for key in inputs) and any(key.endswith(".jsonl") for key in inputs)
    for node in cluster.nodes:
        cache = node.tmp / "finetune-studio-ray"
        assert list(cache.glob("inputs/*/*/config.json")), f"{node.tmp} has no copy of the model"
        assert not list(cache.glob(f"runs/{job}-*")), "a worker's scratch folder was left behind"
    # Ray Train's own run state lives under the same URI.
    assert s3.files("studio", "cluster/ray")

    # Chat finds the result where it finds a local job's: the real OpenAI SDK, through the server.
    import openai

    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300) as chat:
        assert job in [model.id for model in chat.models.list()]
        answer = chat.chat.completions.create(model=job, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert answer.choices[0].finish_reason in ("stop", "length")


def _object(s3: S3, key: str) -> bytes:
    from pyarrow import fs as pafs

    from tests.helpers.s3 import credentials

    with credentials():
        s3fs = pafs.S3FileSystem(endpoint_override=s3.endpoint, scheme="http", region="us-east-1")
        with s3fs.open_input_stream(f"studio/{key}") as stream:
            return bytes(stream.read())


def test_a_storage_the_server_cannot_write_ends_the_job_saying_what_to_check(
    ray_cluster: str, s3: S3, start_server: Any, tiny_model: Path
) -> None:
    """No credentials on the server's machine: the driver's upload of the inputs is refused, and
    the job ends at once with storage_unavailable naming the URI (without its query) and what to check."""
    s3.make_bucket("locked")
    env = {"FINETUNE_STUDIO_RAY_STORAGE_PATH": s3.uri("locked", "studio"), "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}
    server = ray_server(start_server, ray_cluster, max_failures=0, **env)
    with server.client() as client:
        job = client.start(job_request(tiny_model, **WORKERS))
        events = collect(client, job)
    final = events[-1].data
    assert final["phase"] == "error" and final["details"]["error_code"] == "storage_unavailable", final
    assert "s3://locked/studio" in final["error"] and "credentials" in final["error"]
    assert "endpoint_override" not in final["error"]
    assert not [p for p in phases(events) if p == "training"]


def test_a_server_killed_mid_job_ends_the_cluster_run_and_restarts_to_server_restarted(
    ray_cluster: str, start_server: Any, tiny_model: Path
) -> None:
    """docs/PROCESSES.md, How each process ends, on a cluster (the choice documented in SCALE-OUT.md: no re-attach). The
    server dies with SIGKILL: its driver child sees its stdin close and stops the run (every rank
    saves after the same step); the restarted server ends the job `server_restarted`, naming
    its last checkpoint, which holds every rank's part."""
    server = ray_server(start_server, ray_cluster, max_failures=0)
    with server.client() as client:
        job = client.start(job_request(tiny_model, max_steps=2000, save_steps=2, **WORKERS))
        for event in client.stream(job):
            if event.kind == "progress" and event.data["step"] >= 3:
                break
    folder = server.data_dir / "jobs" / job

    def driver_running() -> bool:
        return any(f"--job-id {job}" in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))

    assert driver_running()
    server.kill()
    wait_for(lambda: not driver_running(), timeout=120, what="the orphaned Ray driver to stop its run and exit")
    server.start()
    with server.client() as client:
        final = collect(client, job)[-1].data
    assert final["phase"] == "error" and final["details"]["error_code"] == "server_restarted", final
    checkpoint = Path(final["details"]["last_checkpoint"])
    assert checkpoint.parent == folder / "checkpoints" and str(checkpoint) in final["error"]
    assert {p.name for p in checkpoint.glob("rng_state_*.pth")} == {"rng_state_0.pth", "rng_state_1.pth"}
    assert (folder / "adapter" / "adapter_model.safetensors").is_file()
