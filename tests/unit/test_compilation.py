"""`compile: "auto" | true | false` (issue 26, item 3), in this process: the request's field,
`auto`'s rule with the documented figures on a short and a long run, what earlier runs
measured, where the child's compile cache lives, and the interrupter that a stop during a
compiled step sets off.

The real training jobs (a short `auto` run that is not compiled, a failing compile that
falls back to eager, `compile: true` that compiles, caches and reuses its cache) are in
tests/integration/test_compilation.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from finetune_studio.child.channel import StopSignal
from finetune_studio.schemas import TrainingStartRequest
from finetune_studio.training.compilation import (
    COMPILE_PROBE_STEPS,
    SPEEDUP,
    CompileFigures,
    CompileInterrupted,
    StepInterrupter,
    decide_compile,
    documented_compile_seconds,
    read_records,
    write_record,
)
from finetune_studio.wire import COMPILE_CACHE_DIR_ENV, DataDir

# The measured figures of the module's docstring: SmolLM2-135M, bf16 LoRA, batch 4 x 256 on
# this project's 2-core CPU: 520 tokens/s eager (1024 tokens a step), 103 s to compile, 1.54x.
SMOLLM2_STEP = 1024 / 520
SMOLLM2_LAYERS = 30


def smollm2(steps_left: int) -> CompileFigures:
    return CompileFigures(steps_left, SMOLLM2_STEP, documented_compile_seconds(SMOLLM2_LAYERS), SPEEDUP["cpu"],
                          "documented figures")


def test_the_request_takes_auto_true_or_false_and_names_the_field_otherwise() -> None:
    base = {"model_name": "m", "training_type": "LoRA/QLoRA", "format_type": "auto", "local_datasets": ["d.jsonl"]}
    assert TrainingStartRequest.model_validate(base).compile == "auto"
    assert TrainingStartRequest.model_validate({**base, "compile": None}).compile == "auto"  # a null is the default
    assert TrainingStartRequest.model_validate({**base, "compile": True}).compile is True
    assert TrainingStartRequest.model_validate({**base, "compile": False}).compile is False
    with pytest.raises(ValidationError) as raised:
        TrainingStartRequest.model_validate({**base, "compile": "sometimes"})
    assert {error["loc"][0] for error in raised.value.errors()} == {"compile"}


def test_the_documented_compile_figure_matches_what_was_measured() -> None:
    assert documented_compile_seconds(SMOLLM2_LAYERS) == pytest.approx(103, abs=1)
    assert 50 <= documented_compile_seconds(2) <= 67  # the tiny model: 52-67 s measured


def test_auto_does_not_compile_a_short_run_and_says_why_with_its_figures() -> None:
    decision = decide_compile("auto", smollm2(100))
    assert not decision.compiled
    figures = decision.to_json()["figures"]
    assert figures["break_even_steps"] == 159  # 104 s / (1.97 s x (1 - 1/1.5))
    assert figures["saved_seconds"] == pytest.approx(65.6, abs=0.1) and figures["compile_seconds"] == 104
    assert decision.reason.startswith("not compiled: the 100 steps left")
    assert "save about 66 s" in decision.reason and "a compile of about 104 s" in decision.reason
    assert "pays after 159 steps" in decision.reason and "documented figures" in decision.reason


def test_auto_compiles_a_long_run() -> None:
    decision = decide_compile("auto", smollm2(400))
    assert decision.compiled and decision.reason.startswith("compiled: the 400 steps left")
    assert decision.to_json()["figures"]["saved_seconds"] == pytest.approx(262.6, abs=0.1)
    # the break-even point itself: one step short does not pay, one step past it does
    assert not decide_compile("auto", smollm2(158)).compiled and decide_compile("auto", smollm2(159)).compiled


def test_auto_never_compiles_without_a_speedup_and_true_false_are_as_asked() -> None:
    none = CompileFigures(10_000, 2.0, 10.0, 1.0, "measured by an earlier run of this shape")
    decision = decide_compile("auto", none)
    assert not decision.compiled and "never pays" in decision.reason and none.break_even_steps is None
    assert decide_compile(True).to_json() == {"compiled": True, "asked": True, "reason": "compile true was asked for"}
    assert decide_compile(False).to_json() == {"compiled": False, "asked": False, "reason": "compile false was asked for"}
    ended = decide_compile("auto", None, total_steps=3)
    assert not ended.compiled
    assert ended.reason == f"not compiled: the run's 3 steps end within the {COMPILE_PROBE_STEPS} steps trained eagerly to time it"


def test_what_a_run_measured_is_kept_by_shape_and_bad_records_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "compile-cache" / "compile-times.json"
    assert read_records(path) == {}
    write_record(path, "shape a", {"compile_seconds": 4.5, "speedup": 1.4})
    write_record(path, "shape b", {"compile_seconds": 60.0})
    assert read_records(path) == {"shape a": {"compile_seconds": 4.5, "speedup": 1.4}, "shape b": {"compile_seconds": 60.0}}
    path.write_text('{"shape a": {"compile_seconds": "x", "speedup": -1}, "shape c": 3}')
    assert read_records(path) == {"shape a": {}}
    path.write_text("not json")
    assert read_records(path) == {}


def test_the_compile_cache_lives_in_the_data_dir(tmp_path: Path) -> None:
    data = DataDir(tmp_path / "data")
    assert data.compile_cache == tmp_path / "data" / "compile-cache"
    assert DataDir.of_jobs(data.jobs).compile_environment() == {
        COMPILE_CACHE_DIR_ENV: str(data.compile_cache), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}


@pytest.mark.parametrize(("asked", "compiled"), [("auto", False), (True, True), (False, False)])
def test_a_data_parallel_run_compiles_only_when_asked(tmp_path: Path, asked: object, compiled: bool) -> None:
    # Each rank would decide `auto` by its own steps' times; ranks that differed would wait on each
    # other in a collective. So on more than one rank `auto` stays eager, and decides nothing later.
    from finetune_studio.training.compilation import Compilation

    facts: dict[str, object] = {}
    said: list[str] = []
    compilation = Compilation(asked, cuda=False, layers=2, shape_key="k", records=tmp_path / "r.json",  # type: ignore[arg-type]
                              facts=facts, warn=said.append, say=said.append, ranks=2)
    assert compilation.pending is False and compilation.decision.compiled is compiled
    if asked == "auto":
        assert facts["compile"]["reason"].startswith("not compiled: a run on 2 ranks compiles only when asked")  # type: ignore[index]
    for step in range(1, 9):
        compilation.step_ended(0.1, step, 2000)
    assert compilation.decision.compiled is compiled and said == []


def _busy(interrupter: StepInterrupter, armed: bool, seconds: float, outcome: list[str], ready: threading.Event) -> None:
    """A step's work in Python (as inductor's compile is), armed or not; says how it ended."""
    try:
        ready.set()
        try:
            if armed:
                interrupter.arm()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                sum(range(1000))
        finally:
            interrupter.disarm()
        outcome.append("finished")
        deadline = time.monotonic() + 0.5  # after the step: nothing may arrive
        while time.monotonic() < deadline:
            sum(range(1000))
        outcome.append("after")
    except CompileInterrupted:
        interrupter.settle()  # as the recipe does
        outcome.append("interrupted")


@pytest.mark.parametrize("armed", [True, False])
def test_a_stop_interrupts_an_armed_step_at_once_and_nothing_else(armed: bool) -> None:
    stop = StopSignal()
    interrupter = StepInterrupter(stop)
    interrupter.start()
    outcome: list[str] = []
    ready = threading.Event()
    worker = threading.Thread(target=_busy, args=(interrupter, armed, 4.0 if armed else 1.0, outcome, ready))
    worker.start()
    ready.wait(10)
    stop.set("a stop was requested")
    worker.join(30)
    interrupter.close()
    # Armed, the step never finishes: it is interrupted (well before its 4 s, though no bound is asserted).
    assert outcome == (["interrupted"] if armed else ["finished", "after"])
    assert (interrupter.raised > 0) is armed


def test_a_step_that_ends_as_the_stop_arrives_is_never_interrupted_past_its_end() -> None:
    # Many short armed steps while the stop is set: each one either finishes (and nothing follows it)
    # or is interrupted inside itself; an interruption never lands in the code after a step.
    for _ in range(20):
        stop = StopSignal()
        interrupter = StepInterrupter(stop)
        interrupter.RETRY_SECONDS = 0.02
        interrupter.start()
        stop.set("a stop was requested")
        outcome: list[str] = []
        ready = threading.Event()
        worker = threading.Thread(target=_busy, args=(interrupter, True, 0.002, outcome, ready))
        worker.start()
        worker.join(30)
        interrupter.close()
        assert outcome in (["interrupted"], ["finished", "after"]), outcome
