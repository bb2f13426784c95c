"""The Ray scale-out's parts that run without a cluster: the sink's order and stop
decisions and how it reads a worker's death, the driver's relay of a restarted run, the settings, the launcher's
command line, and the refusal of workers on a server without Ray.

The cluster itself (real Ray, real training) is tests/integration/test_ray.py.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from finetune_studio.api.app import create_app
from finetune_studio.child.channel import Channel, StopSignal
from finetune_studio.config import RAY_CONCURRENT_JOBS, Settings, get_settings
from finetune_studio.ray_train.driver import Relay
from finetune_studio.ray_train.sink import EventSink
from finetune_studio.supervisor.launcher import RAY_DRIVER_MODULE, LocalProcessLauncher
from finetune_studio.supervisor.ray_launcher import ray_launcher
from tests.helpers.children import STAND_IN_WORKER
from tests.helpers.imports import HEAVY, WEB, loaded_by
from tests.helpers.paths import REPO


def test_the_sink_hands_lines_over_in_the_order_they_were_sent() -> None:
    async def run() -> list[tuple[int, str]]:
        sink = EventSink()
        await sink.push(1, 1, "b")  # came before its predecessor: held back
        assert await sink.pull(0.01) == []
        await sink.push(1, 0, "a")
        await sink.push(2, 0, "x")  # a restarted run numbers its lines from 0 again
        await sink.push(1, 2, "c")
        return await sink.pull(0.01)

    assert asyncio.run(run()) == [(1, "a"), (1, "b"), (2, "x"), (1, "c")]


def test_a_pull_waits_for_the_next_line_and_no_longer() -> None:
    async def run() -> list[tuple[int, str]]:
        sink = EventSink()
        later = asyncio.get_running_loop().call_later(0.05, lambda: asyncio.ensure_future(sink.push(1, 0, "a")))
        try:
            return await sink.pull(30)  # returns as the line arrives, not after 30 s
        finally:
            later.cancel()

    assert asyncio.run(run()) == [(1, "a")]


def test_every_rank_gets_the_same_stop_decision_for_a_step() -> None:
    async def run() -> list[bool]:
        sink = EventSink()
        rank0_step3 = await sink.stops_at(1, 3)
        await sink.request_stop()  # arrives between rank 0's question and rank 1's
        rank1_step3 = await sink.stops_at(1, 3)
        step4 = [await sink.stops_at(1, 4) for _rank in range(2)]
        restarted_step3 = await sink.stops_at(2, 3)  # a new attempt decides anew
        return [rank0_step3, rank1_step3, *step4, restarted_step3]

    assert asyncio.run(run()) == [False, False, True, True, True]


def test_workers_count_their_attempts_by_rank() -> None:
    async def run() -> list[int]:
        sink = EventSink()
        return [await sink.register(0, {}), await sink.register(1, {}), await sink.register(1, {}), await sink.register(0, {})]

    assert asyncio.run(run()) == [1, 1, 2, 2]


def test_the_sink_reads_why_each_worker_actor_died(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver asks the sink (inside the cluster: the actor table is not served through Ray
    Client) and tells a lost worker (WORKER_DIED) from one Ray Train ended (RAY_KILL)."""
    common = pytest.importorskip("ray.core.generated.common_pb2", reason="needs finetune-studio[ray]")
    import ray._private.state

    reason = common.ActorDiedErrorContext.Reason

    def died(why: str) -> Any:
        return common.ActorDeathCause(actor_died_error_context=common.ActorDiedErrorContext(reason=reason.Value(why)))

    table = {"lost": {"State": "DEAD", "DeathCause": died("WORKER_DIED")},
             "ended": {"State": "DEAD", "DeathCause": died("RAY_KILL")},
             "alive": {"State": "ALIVE", "DeathCause": common.ActorDeathCause()}}

    def actors(actor_id: str) -> dict[str, Any]:
        if actor_id not in table:
            raise KeyError(actor_id)
        return table[actor_id]

    monkeypatch.setattr(ray._private.state, "actors", actors)
    reasons = asyncio.run(EventSink().death_reasons(["lost", "ended", "alive", "unknown"]))
    assert reasons == {"lost": "WORKER_DIED", "ended": "RAY_KILL", "alive": "", "unknown": ""}


def status(phase: str, message: str = "m") -> str:
    return json.dumps({"type": "status", "phase": phase, "message": message, "error": None, "details": {}})


def test_the_relay_does_not_say_a_phase_again_out_of_order() -> None:
    out = io.StringIO()
    stop = StopSignal()
    relay = Relay(out, Channel(io.StringIO(), stop), {"ray": {"num_workers": 2}}, max_failures=1)
    relay.phase = "loading_model"
    for phase in ("loading_model", "loading_dataset", "configuring", "training"):
        relay.line(1, status(phase), sink=None)
    relay.line(1, json.dumps({"type": "progress", "progress": {"step": 1}}), sink=None)
    relay.line(1, status("configuring"), sink=None)  # never backwards
    relay.line(1, status("completed"), sink=None)
    sent = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [m.get("phase", "progress") for m in sent] == ["loading_model", "loading_dataset", "configuring", "training",
                                                          "progress", "completed"]
    assert all(m["details"]["ray"] == {"num_workers": 2} for m in sent if m["type"] == "status")  # the run's facts on each
    assert relay.training_started and relay.terminal == "completed"


def test_settings_hand_a_cluster_several_jobs_unless_told() -> None:
    assert get_settings().max_concurrent_jobs == 1
    assert get_settings(ray_address="auto").max_concurrent_jobs == RAY_CONCURRENT_JOBS
    assert get_settings(ray_address="auto", max_concurrent_jobs=1).max_concurrent_jobs == 1


def test_the_ray_launcher_starts_the_driver_with_the_cluster_settings(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, ray_address="10.0.0.1:6379", ray_max_failures=3)
    launcher = ray_launcher(settings)
    assert isinstance(launcher, LocalProcessLauncher) and launcher.module == RAY_DRIVER_MODULE
    assert launcher.args == ("--address", "10.0.0.1:6379", "--max-failures", "3", "--storage", str(tmp_path / "ray"))
    with pytest.raises(ValueError, match="ray_address"):
        ray_launcher(Settings(data_dir=tmp_path))


@pytest.mark.parametrize("extra", [{"num_workers": 2}, {"resources_per_worker": {"CPU": 2}}])
def test_workers_are_refused_by_a_server_without_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any]
) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "x"}\n')
    body = {"model_name": "m", "training_type": "LoRA/QLoRA", "format_type": "raw", "local_datasets": [str(data)], **extra}
    monkeypatch.chdir(REPO)  # the stand-in worker (it trains nothing) is imported from the repository
    app = create_app(Settings(data_dir=tmp_path / "data"), launcher=LocalProcessLauncher(module=STAND_IN_WORKER))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        answer = client.post("/train/start", json=body)
        assert answer.status_code == 400
        field = next(iter(extra))
        assert answer.json()["status"] == "error" and answer.json()["field"] == field
        assert "--ray-address" in answer.json()["error"]
        assert client.get("/train/jobs").json()["count"] == 0
        assert client.post("/train/start", json={**body, field: 1 if field == "num_workers" else None}).status_code != 400


def test_the_driver_says_its_first_status_before_it_imports_ray() -> None:
    # The server hears "Connecting to the Ray cluster" at once; ray (and torch, in the workers) come after.
    assert loaded_by(["finetune_studio.ray_train.driver", "finetune_studio.ray_train.sink"], HEAVY + WEB) == []


# Ray 2.60's words when Ray Train's controller could not create the run's folder in its
# storage (the nodes had no credentials for the bucket), cut from a job's worker.log.
CONTROLLER_DIED = """\
ray.exceptions.RayTaskError(ActorDiedError): ray::run_fit() (pid=28525, ip=192.0.2.2)
  File "/work/main/src/finetune_studio/ray_train/driver.py", line 85, in run_fit
    trainer.fit()
ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task, ray::TrainController.__init__() (pid=28579)
  File ".../ray/train/v2/_internal/execution/storage.py", line 438, in _create_validation_file
    self.storage_filesystem.create_dir(self.experiment_fs_path)
  File "pyarrow/error.pxi", line 92, in pyarrow.lib.check_status
OSError: When creating key 'studio/' in bucket 'bench': AWS Error ACCESS_DENIED during PutObject operation: No response body.
"""


def test_a_controller_that_died_as_it_started_is_told_by_its_own_cause() -> None:
    """Not "a worker was lost": no worker ever started; the storage's error is the cause."""
    from finetune_studio.ray_train.driver import controller_failure

    assert controller_failure(CONTROLLER_DIED) == (
        "OSError: When creating key 'studio/' in bucket 'bench': AWS Error ACCESS_DENIED during PutObject operation: No response body.")
    assert controller_failure(CONTROLLER_DIED.replace("OSError: When", "  (nothing)")) == (
        "ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task, ray::TrainController.__init__() (pid=28579)")
    # A worker's death is not the controller's.
    assert controller_failure("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
                              "class_name: RayTrainWorker") is None
