"""report_to's experiment trackers end to end: a real training job logged to a local MLflow store
(sqlite) and a local Trackio project, read back with each library's own client and compared with
the job's events; and an MLflow server that does not answer, which costs a warning, not the run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.jobs import collect, job_request

pytestmark = [pytest.mark.train, pytest.mark.slow]

pytest.importorskip("mlflow", reason="the [trackers] extra (mlflow-skinny) is not installed")
pytest.importorskip("trackio", reason="the [trackers] extra (trackio) is not installed")


def as_parameter(value: Any) -> str:
    """A request setting as a tracker parameter (docs/API.md, report_to): text as it is, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def read_back(script: str, env: dict[str, str], *args: str) -> Any:
    """What `script` prints as JSON, run in a process of its own: a tracker's library reads its store
    there as any of its users would (Trackio reads TRACKIO_DIR once, when imported; MLflow's store
    raises deprecation warnings of SQLAlchemy's, which this test process turns into errors)."""
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, check=True,
                          env={**os.environ, **env})
    return json.loads(done.stdout.strip().splitlines()[-1])


MLFLOW_RUN = """
import json, sys
from mlflow.tracking import MlflowClient
client = MlflowClient(tracking_uri=sys.argv[1])
run = client.get_run(sys.argv[2])
print(json.dumps({"status": run.info.status, "name": run.info.run_name, "params": run.data.params,
                  "loss": [[m.step, m.value] for m in client.get_metric_history(run.info.run_id, "loss")],
                  "learning_rate": [[m.step, m.value] for m in client.get_metric_history(run.info.run_id, "learning_rate")]}))
"""

TRACKIO_RUN = """
import json, sys
from trackio.sqlite_storage import SQLiteStorage
project, run = sys.argv[1:3]
print(json.dumps({"runs": SQLiteStorage.get_runs(project), "logs": SQLiteStorage.get_logs(project, run),
                  "config": SQLiteStorage.get_run_config(project, run)}, default=str))
"""


def test_mlflow_and_trackio_hold_the_runs_parameters_and_every_steps_loss(
    start_server: Any, tiny_model: Path, tmp_path: Path
) -> None:
    store = tmp_path / "mlflow.db"
    trackio_dir = tmp_path / "trackio"
    uri = f"sqlite:///{store}"
    server = start_server(env={"MLFLOW_TRACKING_URI": uri, "TRACKIO_DIR": str(trackio_dir)})
    request = job_request(tiny_model, max_steps=4, project_name="trackers-test", report_to=["mlflow", "trackio"],
                          hf_token="hf_not_a_real_token")
    with server.client() as client:
        job_id = client.start(request)
        events = collect(client, job_id)
        record = client.http.get(f"/train/jobs/{job_id}").json()
    last = events[-1].data
    assert last["phase"] == "completed", last
    assert not [w for w in last["details"].get("warnings", []) if "report_to" in w], last["details"]["warnings"]
    losses = {e.data["step"]: e.data["loss"] for e in events if e.kind == "progress"}
    assert sorted(losses) == [1, 2, 3, 4]
    settings = record["request"]
    assert settings["report_to"] == ["mlflow", "trackio"] and "hf_token" not in settings

    where = {entry["name"]: entry for entry in last["details"]["trackers"]}
    assert set(where) == {"mlflow", "trackio"}

    # MLflow: the run named by details.trackers, read with MLflow's own client.
    assert where["mlflow"]["tracking_uri"] == uri and where["mlflow"]["experiment"] == "trackers-test"
    run = read_back(MLFLOW_RUN, {}, uri, where["mlflow"]["run_id"])
    assert run["status"] == "FINISHED" and run["name"] == job_id
    assert run["params"] == {name: as_parameter(value) for name, value in settings.items()}
    assert "hf_not_a_real_token" not in json.dumps(run["params"])
    assert dict(map(tuple, run["loss"])) == losses
    assert dict(map(tuple, run["learning_rate"])) == {e.data["step"]: e.data["learning_rate"] for e in events if e.kind == "progress"}

    # Trackio: the project is the job's label, the run its id.
    assert where["trackio"]["project"] == "trackers-test" and where["trackio"]["run"] == job_id
    stored = read_back(TRACKIO_RUN, {"TRACKIO_DIR": str(trackio_dir)}, "trackers-test", job_id)
    assert stored["runs"] == [job_id]
    assert {row["step"]: row["loss"] for row in stored["logs"]} == losses
    config = {name: value for name, value in stored["config"].items() if not name.startswith("_")}
    assert config == settings


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes connections and never answers: a tracking server that hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield listener.getsockname()[1]
    listener.close()


def test_an_mlflow_server_that_does_not_answer_is_a_warning_and_the_run_goes_on(
    start_server: Any, tiny_model: Path, silent_port: int
) -> None:
    # MLflow's defaults would retry 5 times with 120 s timeouts; the child's are no retry and 5 s.
    server = start_server(env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{silent_port}"})
    with server.client() as client:
        job_id = client.start(job_request(tiny_model, max_steps=2, report_to=["mlflow"]))
        last = collect(client, job_id)[-1].data
    assert last["phase"] == "completed", last
    assert "trackers" not in last["details"]
    warnings = [w for w in last["details"]["warnings"] if w.startswith("report_to mlflow")]
    assert len(warnings) == 1 and "could not be reached" in warnings[0], last["details"]["warnings"]
