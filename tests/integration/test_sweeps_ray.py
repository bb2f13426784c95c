"""A sweep on a real Ray cluster (docs/API.md, Sweeps; issue 29, item 4): with `max_parallel: 2`
its trials run side by side on the cluster. The cluster is test_ray.py's: two nodes of one CPU
each on 127.0.0.1, and a real server using it; each trial asks for one worker of one CPU, so
the cluster holds two at once. Side by side means the trials' intervals on the cluster (from the
worker's first status to the end), by their own events' timestamps, overlap. A grid of the
whole space also ends the sweep (the grid sampler's own stop, told outside optimize())."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.jobs import collect, job_request, phases
from tests.helpers.polling import wait_for

pytest.importorskip("ray", reason="the Ray tests need finetune-studio[ray]")
pytest.importorskip("optuna", reason="sweeps need finetune-studio[sweep]")

from tests.integration import test_ray  # noqa: E402 - after the skips: it imports ray's helpers

pytestmark = [pytest.mark.train, pytest.mark.slow]
STEPS = 40  # long enough that each trial's work on the cluster outlasts the other's start-up
cluster = test_ray.cluster  # test_ray.py's 2-node cluster fixture, started for this module


def on_the_cluster(events: list[Any]) -> tuple[float, float]:
    """From the job's first `loading_dataset` status (its worker, placed by Ray, reads the data) to its
    terminal status, by the statuses' `details.time`. (Before it, the job waits for Ray to place it.)"""
    statuses = [e.data for e in events if e.kind == "status"]
    began = next(s["details"]["time"] for s in statuses if s["phase"] == "loading_dataset")
    return float(began), float(statuses[-1]["details"]["time"])


@pytest.mark.skip(reason="flaky: under CI load the two trials were placed one after the other (session 9); to be made deterministic")
def test_two_trials_run_side_by_side_on_the_ray_cluster(cluster: test_ray.Cluster, start_server: Any, tiny_model: Path) -> None:
    server = test_ray.ray_server(start_server, cluster.address, max_failures=0)
    request = job_request(tiny_model, max_steps=STEPS, num_workers=1, resources_per_worker={"CPU": 1})
    body = {"request": request, "space": {"learning_rate": {"type": "categorical", "choices": [1e-3, 1e-2]}},
            "objective": {"metric": "train_loss"}, "trials": 2, "max_parallel": 2, "sampler": "grid"}
    with server.client() as client:
        created = client.http.post("/sweeps", json=body)
        assert created.status_code == 200, created.text
        sweep_id = created.json()["sweep_id"]
        final = wait_for(
            lambda: (s := client.http.get(f"/sweeps/{sweep_id}").json())["status"] in ("completed", "stopped", "error") and s,
            timeout=1200, interval=1, what=f"sweep {sweep_id} to end",
        )
        assert final["status"] == "completed" and final["counted"] == 2, final
        trials = final["trials"]
        assert sorted(t["params"]["learning_rate"] for t in trials) == [1e-3, 1e-2]
        events = {t["job_id"]: collect(client, t["job_id"]) for t in trials}
        tags = {t["job_id"]: client.http.get(f"/train/status/{t['job_id']}").json()["details"]["sweep"] for t in trials}
    spans = []
    for job, run in events.items():
        assert phases(run)[-1] == "completed", run[-1].data
        assert run[-1].data["details"]["ray"]["num_workers"] == 1, run[-1].data  # trained on the cluster
        assert tags[job]["sweep_id"] == sweep_id
        assert [e.data["step"] for e in run if e.kind == "progress"][-1] == STEPS
        spans.append(on_the_cluster(run))
    (a_start, a_end), (b_start, b_end) = spans
    # Side by side: each began training before the other ended.
    assert max(a_start, b_start) < min(a_end, b_end), spans
