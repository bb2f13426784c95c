"""`compile` in real training jobs on the tiny model (issue 26, item 3).

- `compile: auto` on a short run times its first steps eagerly, does not compile, and
  says why with its figures (a `training` status and `details.compile`).
- A compile that raises (the hooked child's torch.compile backend fails at the first
  compiled step) falls back to eager with a warning, and the job completes.
- A stop, a pause or a clean shutdown that arrives while a step compiles (the hooked
  child's compile takes minutes, longer than the stop's grace) interrupts the compile:
  the job ends `stopped` at the last completed step, with its adapter and that step's
  checkpoint saved, well within the grace.
- `compile: true` really compiles and trains; its graphs are cached under the data dir,
  and a second run of the same shape reuses them (it compiles no new graph).

`auto`'s rule on a long run, with the documented figures, is tested in
tests/unit/test_compilation.py.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from finetune_studio.config import Settings
from finetune_studio.training.compilation import COMPILE_PROBE_STEPS, RECORDS_FILE, read_records
from finetune_studio.wire import COMPILE_CACHE_DIR_ENV, DataDir
from tests.helpers.hooked_child import HookedLauncher, Hooks
from tests.helpers.jobs import collect, job_request, phases
from tests.helpers.servers import LiveServer, ServerProcess

pytestmark = pytest.mark.train

COMMON = {"optim": "adamw_torch", "load_in_4bit": False}


def run(server: Any, body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The job's statuses and its progress events."""
    with server.client() as client:
        events = collect(client, client.start(body))
    assert phases(events)[-1] == "completed", events[-1].data
    return [e.data for e in events if e.kind == "status"], [e.data for e in events if e.kind == "progress"]


def test_auto_does_not_compile_a_short_run_and_says_why(shared_server: ServerProcess, tiny_model: Path) -> None:
    statuses, steps = run(shared_server, job_request(tiny_model, max_steps=8, compile="auto", **COMMON))
    assert len(steps) == 8
    said = [s for s in statuses if s["phase"] == "training" and "compiled" in s["message"]]
    assert len(said) == 1, [s["message"] for s in statuses]
    message = said[0]["message"]
    # Decided after the warm-up step and the timed ones: 8 - COMPILE_PROBE_STEPS steps were left.
    assert message.startswith(f"Training: not compiled: the {8 - COMPILE_PROBE_STEPS} steps left at "), message
    # Documented figures, or those an earlier compile of this shape on the shared server measured.
    assert "against a compile of about" in message
    assert "documented figures" in message or "measured by an earlier run of this shape" in message
    final = statuses[-1]["details"]["compile"]
    assert final["compiled"] is False and final["asked"] == "auto" and final["reason"] == message.removeprefix("Training: ")
    figures = final["figures"]
    assert figures["steps_left"] == 8 - COMPILE_PROBE_STEPS and figures["eager_step_seconds"] > 0
    assert figures["saved_seconds"] < figures["compile_seconds"] and figures["break_even_steps"] > 8
    began = next(s for s in statuses if s["phase"] == "training")  # "Training for 8 steps": not decided yet
    assert began["details"]["compile"] == {
        "compiled": False, "asked": "auto", "reason": f"decided after the first {COMPILE_PROBE_STEPS} steps, trained eagerly"}


def test_a_compile_that_raises_falls_back_to_eager_with_a_warning(tmp_path: Path, tiny_model: Path) -> None:
    with LiveServer(Settings(data_dir=tmp_path / "data"), HookedLauncher(Hooks(compile_fault=True))) as server:
        statuses, steps = run(server, job_request(tiny_model, max_steps=4, compile=True, **COMMON))
    assert [p["step"] for p in steps] == [1, 2, 3, 4] and all(math.isfinite(p["loss"]) for p in steps)
    final = statuses[-1]["details"]
    assert final["compile"]["compiled"] is False and final["compile"]["asked"] is True
    assert "injected by a test hook" in final["compile"]["fallback"]
    assert final["compile"]["reason"].startswith("not compiled: torch.compile failed (")
    warning = next(w for w in final["warnings"] if w.startswith("compile: torch.compile failed ("))
    assert warning.endswith("; the job trains eagerly") and "injected by a test hook" in warning
    assert any(s["message"] == f"Training eagerly: {warning}" for s in statuses if s["phase"] == "training")


def fx_graphs(cache: Path) -> set[str]:
    """The compiled graphs inductor keeps in its FX graph cache."""
    return {str(path.relative_to(cache)) for path in (cache / "fxgraph").rglob("*") if path.is_file()}


@pytest.mark.slow
def test_compile_true_compiles_trains_and_a_second_run_reuses_the_cache(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A recipe run in this process before (the unit tests') may have named a cache folder in its
    # environment; the server's children would inherit it instead of the data dir's own.
    monkeypatch.delenv(COMPILE_CACHE_DIR_ENV, raising=False)
    data = DataDir(tmp_path / "data")
    server = ServerProcess(data.root)
    server.start()
    try:
        body = job_request(tiny_model, max_steps=6, compile=True, **COMMON)
        first, first_steps = run(server, body)
        cached = fx_graphs(data.compile_cache)
        second, second_steps = run(server, body)
    finally:
        server.stop()

    for statuses, steps in ((first, first_steps), (second, second_steps)):
        assert len(steps) == 6 and all(math.isfinite(p["loss"]) for p in steps)
        done = statuses[-1]["details"]
        assert done["compile"]["compiled"] is True and done["compile"]["reason"] == "compile true was asked for"
        assert "fallback" not in done["compile"] and not any("compile" in w for w in done.get("warnings", []))
        measured = done["compile"]["measured"]
        assert measured["compile_seconds"] >= 0 and measured["compiled_step_seconds"] > 0
    # The first run compiled into the data dir's cache; the second found every graph there.
    assert cached, sorted(p.name for p in data.compile_cache.iterdir())
    assert fx_graphs(data.compile_cache) == cached
    # What the runs measured is kept for `auto`'s next estimate of this shape.
    (record,) = read_records(data.compile_cache / RECORDS_FILE).values()
    assert record["compile_seconds"] > 0


@pytest.mark.parametrize("how", ["stop", "pause", "shutdown"])
def test_a_stop_while_a_step_compiles_saves_what_the_steps_before_it_trained(
    tmp_path: Path, tiny_model: Path, how: str
) -> None:
    # A grace shorter than the hooked compile: without the interrupt, the child would be killed unsaved.
    settings = Settings(data_dir=tmp_path / "data", stop_grace_seconds=45, kill_grace_seconds=5)
    hooks = Hooks(compile_stall=True, auto_compiles=True)
    server = LiveServer(settings, HookedLauncher(hooks))
    with server:
        with server.client() as client:
            job_id = client.start(job_request(tiny_model, max_steps=40, compile="auto", **COMMON))
            for event in client.stream(job_id):
                if event.kind == "status" and event.data["message"].startswith("Training: compiled: a test hook"):
                    break
            asked = time.monotonic()
            if how == "stop":
                client.stop(job_id)
            elif how == "pause":
                paused = httpx.post(f"{server.url}/v1/fine_tuning/jobs/{job_id}/pause", timeout=30)
                assert paused.status_code == 200, paused.text
    # Leaving the block shuts the server down cleanly: a running job is stopped, as a stop would.
    took = time.monotonic() - asked
    with LiveServer(settings) as again, again.client() as client:
        final = collect(client, job_id)[-1].data
    assert final["phase"] == "stopped", final
    details = final["details"]
    assert took < settings.stop_grace_seconds, took
    said = f"Paused after step {COMPILE_PROBE_STEPS}; resume" if how == "pause" else f"Stopped at step {COMPILE_PROBE_STEPS} of 40"
    assert final["message"].startswith(said), final["message"]
    assert details["compile"]["compiled"] is True
    assert details["compile"]["interrupted"] == (
        f"a stop arrived during compiled step {COMPILE_PROBE_STEPS + 1}; it was left unfinished")
    adapter = Path(details["adapter_dir"])
    assert (adapter / "adapter_model.safetensors").is_file() and (adapter / "adapter_config.json").is_file()
    checkpoint = Path(details["last_checkpoint"])
    assert checkpoint.name == f"checkpoint-{COMPILE_PROBE_STEPS}"
    for name in ("adapter_model.safetensors", "trainer_state.json", "optimizer.pt", "scheduler.pt"):
        assert (checkpoint / name).is_file(), name
    assert bool(details.get("paused")) is (how == "pause")
