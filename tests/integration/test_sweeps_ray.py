"""A sweep on a real Ray cluster (docs/API.md, Sweeps; issue 29, item 4): with `max_parallel: 2`
its trials run side by side on the cluster. The cluster is tests/helpers/ray_cluster.py's: two nodes of one
CPU each on 127.0.0.1, and a real server using it; each trial asks for one worker of one CPU, so
the cluster holds two at once.

Side by side is seen, not inferred from timings: the test watches both trials' statuses until,
at one moment, both are training on the cluster (phase `training`, a step past 0), then stops
the sweep. Each trial is far longer than a worker's start-up (STEPS), so a first trial cannot
end before the second is placed unless the cluster really runs them one after the other; a
timing-based check (their intervals overlap) failed under CI load when the second worker's
start-up outlasted the first trial's 40 steps. That a grid of the whole space ends the sweep
is tests/unit/test_sweep_study.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.jobs import collect, job_request, phases
from tests.helpers.polling import wait_for
from tests.helpers.ray_cluster import Cluster, ray_server, two_node_cluster

pytest.importorskip("ray", reason="the Ray tests need finetune-studio[ray]")
pytest.importorskip("optuna", reason="sweeps need finetune-studio[sweep]")

pytestmark = [pytest.mark.train, pytest.mark.slow]
STEPS = 5000  # far longer than a worker's start-up: the sweep is stopped once both are seen training


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with two_node_cluster(tmp_path_factory.mktemp("ray-logs")) as started:
        yield started


def on_the_cluster(client: Any, job_id: str) -> bool:
    """The trial's worker, placed by Ray, is training: phase `training` and at least one step done."""
    status = client.http.get(f"/train/status/{job_id}").json()
    progress = client.http.get(f"/train/progress/{job_id}")
    return bool(status["phase"] == "training" and progress.status_code == 200 and progress.json()["step"] > 0)


def test_two_trials_run_side_by_side_on_the_ray_cluster(cluster: Cluster, start_server: Any, tiny_model: Path) -> None:
    server = ray_server(start_server, cluster.address, max_failures=0)
    request = job_request(tiny_model, max_steps=STEPS, num_workers=1, resources_per_worker={"CPU": 1})
    body = {"request": request, "space": {"learning_rate": {"type": "categorical", "choices": [1e-3, 1e-2]}},
            "objective": {"metric": "train_loss"}, "trials": 2, "max_parallel": 2, "sampler": "grid"}
    with server.client() as client:
        created = client.http.post("/sweeps", json=body)
        assert created.status_code == 200, created.text
        sweep_id = created.json()["sweep_id"]

        def both_training() -> bool:
            trials = client.http.get(f"/sweeps/{sweep_id}").json()["trials"]
            assert not any(t["state"] not in ("running", "queued") for t in trials), trials  # none ended first
            return len(trials) == 2 and all(on_the_cluster(client, t["job_id"]) for t in trials)

        wait_for(both_training, timeout=600, interval=0.5, what="both trials to train on the cluster at once")
        stopped = client.http.post(f"/sweeps/{sweep_id}/stop")
        assert stopped.status_code == 200, stopped.text
        final = wait_for(
            lambda: (s := client.http.get(f"/sweeps/{sweep_id}").json())["status"] in ("completed", "stopped", "error") and s,
            timeout=300, interval=1, what=f"sweep {sweep_id} to end",
        )
        assert final["status"] == "stopped", final
        trials = final["trials"]
        assert sorted(t["params"]["learning_rate"] for t in trials) == [1e-3, 1e-2]
        events = {t["job_id"]: collect(client, t["job_id"]) for t in trials}
        tags = {t["job_id"]: client.http.get(f"/train/status/{t['job_id']}").json()["details"]["sweep"] for t in trials}
    for job, run in events.items():
        assert phases(run)[-1] == "stopped", run[-1].data  # the sweep's stop reached each trial
        assert tags[job]["sweep_id"] == sweep_id
        ray_details = [e.data["details"].get("ray") for e in run if e.kind == "status" and e.data.get("details", {}).get("ray")]
        assert ray_details and ray_details[-1]["num_workers"] == 1, run[-1].data  # trained on the cluster
