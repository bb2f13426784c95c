"""Sweeps on the tiny model with real training children: TPE over the learning rate, and the
median pruner stopping a trial in an obviously bad region (it ends `stopped`, `pruned`, saved).
The stand-in sweeps (checks at creation, parallel trials, a SIGKILLed server) are in
tests/reliability/test_sweeps.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from finetune_studio.cli.client import StudioClient
from finetune_studio.demo import __file__ as demo_init
from tests.helpers.jobs import job_request
from tests.helpers.polling import wait_for
from tests.helpers.servers import ServerProcess

pytestmark = pytest.mark.train
DEMO = Path(demo_init).parent / "tiny_alpaca.jsonl"


def _ended(client: StudioClient, sweep_id: str) -> dict[str, Any]:
    return wait_for(  # type: ignore[no-any-return]
        lambda: (s := client.http.get(f"/sweeps/{sweep_id}").json())["status"] in ("completed", "stopped", "error") and s,
        timeout=1800, interval=0.5, what=f"sweep {sweep_id} to end",
    )


def test_six_tpe_trials_over_the_learning_rate_report_the_best_and_carry_optunas_values(
    server: ServerProcess, tiny_model: Path
) -> None:
    request = job_request(tiny_model, max_steps=4, local_eval_datasets=[str(DEMO)], eval_steps=0.5)
    body = {"request": request, "space": {"learning_rate": {"type": "float", "low": 1e-5, "high": 5e-2, "log": True}},
            "objective": {"metric": "eval_loss", "direction": "minimize"}, "trials": 6, "sampler": "tpe", "seed": 3}
    with server.client() as client:
        created = client.http.post("/sweeps", json=body)
        assert created.status_code == 200, created.text
        final = _ended(client, created.json()["sweep_id"])
        assert final["status"] == "completed", final
        trials = final["trials"]
        assert len(trials) == 6 and all(t["state"] == "complete" for t in trials)
        for trial in trials:
            job = client.http.get(f"/train/jobs/{trial['job_id']}").json()
            assert job["request"]["learning_rate"] == trial["params"]["learning_rate"]
            status = client.http.get(f"/train/status/{trial['job_id']}").json()
            assert status["phase"] == "completed" and status["details"]["sweep"]["trial"] == trial["number"]
            assert trial["value"] == pytest.approx(status["details"]["summary"]["best_eval_loss"], rel=0.5)
        best = min(trials, key=lambda t: t["value"])
        assert final["best"] == {"number": best["number"], "job_id": best["job_id"], "params": best["params"],
                                 "value": best["value"]}
        assert set(final["importances"]) <= {"learning_rate"}


def test_the_median_pruner_stops_a_trial_in_a_bad_region_which_ends_stopped_pruned_and_saved(
    server: ServerProcess, tiny_model: Path
) -> None:
    # With seed 6 Optuna's random sampler picks 0.01, 0.01, then 1e-9: a learning rate that learns nothing,
    # whose evaluation loss stays above the median of the two completed trials at the same step.
    request = job_request(tiny_model, max_steps=8, local_eval_datasets=[str(DEMO)], eval_steps=0.125)
    body = {"request": request, "space": {"learning_rate": {"type": "categorical", "choices": [0.01, 1e-9]}},
            "objective": {"metric": "eval_loss"}, "trials": 3, "sampler": "random", "seed": 6,
            "pruner": {"type": "median", "n_startup_trials": 2, "n_warmup_steps": 1}}
    with server.client() as client:
        created = client.http.post("/sweeps", json=body)
        assert created.status_code == 200, created.text
        final = _ended(client, created.json()["sweep_id"])
        assert final["status"] == "completed", final
        pruned = [t for t in final["trials"] if t["state"] == "pruned"]
        assert pruned, final["trials"]
        (trial,) = pruned
        assert trial["params"]["learning_rate"] == 1e-9
        status = client.http.get(f"/train/status/{trial['job_id']}").json()
        details = status["details"]
        assert status["phase"] == "stopped" and details["pruned"] is True
        assert details.get("adapter_dir") and Path(details["adapter_dir"]).is_dir()  # it saved what it trained
        others = [client.http.get(f"/train/status/{t['job_id']}").json()["details"]["summary"]["steps"]
                  for t in final["trials"] if t["state"] == "complete"]
        assert details["summary"]["steps"] < min(others) == 8
        assert details["pruned_at_step"] <= details["summary"]["steps"]
        assert final["counted"] == 3
