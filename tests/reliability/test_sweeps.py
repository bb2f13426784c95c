"""Sweeps (POST /sweeps, supervisor/sweeps.py) on the stand-in training child: the checks at
creation, trials as ordinary jobs, parallel trials, the stream's replay, and a SIGKILLed server
whose sweep completes after the restart with no trial counted twice. The real training runs
(TPE over the learning rate, pruning) are in tests/integration/test_sweeps.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from finetune_studio.api.app import create_app
from finetune_studio.cli.local_server import free_port
from finetune_studio.config import Settings
from finetune_studio.supervisor.launcher import LocalProcessLauncher
from tests.helpers.children import STAND_IN_WORKER
from tests.helpers.jobs import dataset, start_body
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for

pytestmark = pytest.mark.slow
LR = {"learning_rate": {"type": "float", "low": 1e-5, "high": 1e-2, "log": True}}


def sweep_body(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"request": start_body(dataset(tmp_path), max_steps=3), "space": LR,
                            "objective": {"metric": "train_loss"}, "trials": 4, "seed": 7}
    body.update(overrides)
    return body


def ended(client: Any, sweep_id: str) -> dict[str, Any]:
    return wait_for(  # type: ignore[no-any-return]
        lambda: (s := client.get(f"/sweeps/{sweep_id}").json())["status"] in ("completed", "stopped", "error") and s,
        what=f"sweep {sweep_id} to end",
    )


def test_a_space_that_can_make_an_invalid_request_is_refused_naming_the_field(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path / "data"), launcher=LocalProcessLauncher(module=STAND_IN_WORKER))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        refused = client.post("/sweeps", json=sweep_body(tmp_path, space={"lora_r": {"type": "int", "low": 0, "high": 8}}))
        assert refused.status_code == 400 and refused.json()["field"] == "space.lora_r"
        assert "lora_r=0" in refused.json()["detail"]
        cases = [
            ({"space": {"batch_size": {"type": "categorical", "choices": [2, -1]}}}, "space.batch_size"),
            ({"space": {"no_such_field": {"type": "int", "low": 1, "high": 2}}}, "space.no_such_field"),
            ({"sampler": "grid"}, "space.learning_rate"),  # a float without a step makes no grid
            ({"objective": {"metric": "heldout/loss"}}, "objective.metric"),  # no eval_after suite of that name
            ({"objective": {"metric": "eval_loss"}}, "objective.metric"),  # no evaluation data
        ]
        for overrides, field in cases:
            answer = client.post("/sweeps", json=sweep_body(tmp_path, **overrides))
            assert answer.status_code == 400 and answer.json()["field"] == field, (overrides, answer.json())
        suite = {"type": "heldout", "data": [str(dataset(tmp_path))]}
        pruned_on_a_suite = sweep_body(tmp_path, objective={"metric": "heldout/loss"}, pruner="median",
                                       request={**start_body(dataset(tmp_path)), "eval_after": [suite]})
        answer = client.post("/sweeps", json=pruned_on_a_suite)
        assert answer.status_code == 400 and answer.json()["field"] == "pruner", answer.json()
        shape = client.post("/sweeps", json=sweep_body(tmp_path, space={"lora_r": {"type": "int", "low": 8, "high": 4}}))
        assert shape.status_code == 422
        assert client.get("/sweeps").json()["sweeps"] == []  # nothing was created
        assert client.get("/train/jobs").json()["data"] == []


def test_two_trials_run_at_once_within_two_slots_and_every_trial_is_an_ordinary_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("FAKE_WORKER_STEP_S", "0.3")
    settings = Settings(data_dir=tmp_path / "data", max_concurrent_jobs=2)
    app = create_app(settings, launcher=LocalProcessLauncher(module=STAND_IN_WORKER))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        created = client.post("/sweeps", json=sweep_body(tmp_path, max_parallel=2, sampler="random")).json()
        sweep_id = created["sweep_id"]
        assert created["status"] == "queued"

        def training_now() -> int:
            jobs = client.get("/train/jobs").json()["data"]
            return sum(1 for job in jobs if job["phase"] == "training")

        wait_for(lambda: training_now() == 2, what="two trials training at once")
        final = ended(client, sweep_id)
        assert final["status"] == "completed" and final["counted"] == 4 and final["failed"] == 0
        assert [t["number"] for t in final["trials"]] == [0, 1, 2, 3]
        for trial in final["trials"]:
            status = client.get(f"/train/status/{trial['job_id']}").json()
            assert status["phase"] == "completed"
            assert status["details"]["sweep"] == {"sweep_id": sweep_id, "trial": trial["number"]}
            request = client.get(f"/train/jobs/{trial['job_id']}").json()["request"]
            assert request["learning_rate"] == trial["params"]["learning_rate"]  # exactly what Optuna chose
            assert trial["value"] == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)  # mean of the stand-in's losses
        assert final["best"]["value"] == min(t["value"] for t in final["trials"])

        # The stream: a replay from 0 ends with the terminal status; a cursor resumes after it.
        events = _events(client, sweep_id, 0)
        assert events[-1][1] == "status" and json.loads(events[-1][2])["status"] == "completed"
        assert [e[0] for e in events] == list(range(1, len(events) + 1))
        trial_events = [json.loads(data)["event"] for _, kind, data in events if kind == "trial"]
        assert trial_events.count("started") == 4 and trial_events.count("finished") == 4
        assert _events(client, sweep_id, events[-2][0]) == events[-1:]
        assert client.get(f"/sweeps/{sweep_id}/stream", headers={"Last-Event-ID": str(events[-1][0] + 1)}).status_code == 416


def _events(client: Any, sweep_id: str, after: int) -> list[tuple[int, str, str]]:
    found: list[tuple[int, str, str]] = []
    with client.stream("GET", f"/sweeps/{sweep_id}/stream", headers={"Last-Event-ID": str(after)}) as stream:
        event: dict[str, str] = {}
        for line in stream.iter_lines():
            if line.startswith(("event: ", "data: ", "id: ")):
                key, value = line.split(": ", 1)
                event[key] = value
            elif not line and event:
                found.append((int(event["id"]), event["event"], event["data"]))
                event = {}
    return found


def test_a_sweep_cut_by_sigkill_completes_after_the_restart_counting_no_trial_twice(tmp_path: Path) -> None:
    port = free_port()
    go = tmp_path / "go"
    env = {**os.environ, "FINETUNE_STUDIO_DATA_DIR": str(tmp_path / "data"), "FAKE_WORKER_GO": str(go)}

    def serve() -> subprocess.Popen[bytes]:
        process = subprocess.Popen([sys.executable, "-m", "tests.helpers.stand_in_server", str(port)], cwd=REPO, env=env)
        wait_for(lambda: _answers(port), what="the server to start")
        return process

    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        server = serve()
        try:
            go.touch()
            sweep_id = http.post("/sweeps", json=sweep_body(tmp_path, trials=3)).json()["sweep_id"]
            wait_for(lambda: http.get(f"/sweeps/{sweep_id}").json()["counted"] == 1, what="the first trial to end")
            go.unlink()  # the next trial holds before its first step: the kill finds it running
            wait_for(lambda: any(t["state"] == "running" for t in http.get(f"/sweeps/{sweep_id}").json()["trials"]),
                     what="the second trial to run")
            server.send_signal(signal.SIGKILL)
            server.wait()
        finally:
            server.kill()
            server.wait()
        go.touch()
        server = serve()
        try:
            final = ended(http, sweep_id)
            assert final["status"] == "completed", final
            counted = [t for t in final["trials"] if t["state"] == "complete"]
            assert len(counted) == 3 and final["counted"] == 3 and final["failed"] == 0
            (interrupted,) = [t for t in final["trials"] if t["requeued"]]
            assert interrupted["state"] == "failed" and interrupted["number"] == 1
            # Its values were queued again: the next trial ran them.
            assert any(t["params"] == interrupted["params"] for t in counted if t["number"] > interrupted["number"])
            assert http.get(f"/train/status/{interrupted['job_id']}").json()["details"]["error_code"] == "server_restarted"
            assert len({t["job_id"] for t in final["trials"]}) == len(final["trials"])
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait()


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_the_cli_runs_a_sweep_from_a_file_and_prints_the_best(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from finetune_studio.cli.main import main as cli_main
    from tests.helpers.servers import LiveServer

    monkeypatch.chdir(REPO)
    file = tmp_path / "sweep.json"
    file.write_text(json.dumps(sweep_body(tmp_path, trials=2)))
    settings = Settings(data_dir=tmp_path / "data")
    with LiveServer(settings, LocalProcessLauncher(module=STAND_IN_WORKER)) as server:
        assert cli_main(["sweep", str(file), "--server", server.url, "--output-json"]) == 0
        final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert final["status"] == "completed" and final["counted"] == 2 and final["best"] is not None
        assert cli_main(["sweep", str(file), "--server", server.url]) == 0
        shown = capsys.readouterr().out
        assert "best: trial" in shown and "complete" in shown
        file.write_text(json.dumps(sweep_body(tmp_path, space={"lora_r": {"type": "int", "low": 0, "high": 2}})))
        assert cli_main(["sweep", str(file), "--server", server.url]) == 2
        assert "space.lora_r" in capsys.readouterr().out
