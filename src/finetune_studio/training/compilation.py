"""torch.compile where it pays: the request's `compile` ("auto", true, false) and `details.compile`.

`true` compiles the model before the first step, `false` never does. `auto` trains the
first COMPILE_PROBE_STEPS optimizer steps eagerly, times them (the first is warm-up and
not counted), and compiles when the steps left would save more than the compile costs
(`decide_compile`, a pure function of those figures):

    saved = steps left x eager step time x (1 - 1 / speed-up)  >  compile time

The compile time is the one measured by an earlier run of the same shape on this machine
(kept in `<data-dir>/compile-cache/compile-times.json`, beside inductor's own caches), else
the documented figure COLD_COMPILE_SECONDS + COLD_COMPILE_SECONDS_PER_LAYER x layers; the
speed-up is the measured one of an earlier run of the same shape, else SPEEDUP's. The
figures, measured here (2 cores of a Xeon with AMX; bf16 LoRA, batch 4 x 256): SmolLM2-135M
trains at 520 tokens/s eagerly and 802 compiled (1.54x) after a one-off compile of 103 s
(30 layers); the tests' tiny model (2 layers) compiles in 52-67 s. So on this CPU a
SmolLM2 run breaks even after about 150 steps. On a GPU inductor still compiles on the
CPU, so the compile time is of the same order; its speed-up is taken lower (1.2x) until
a run has measured one.

The model is compiled in place (what `torch.nn.Module.compile` does: its call goes
through `torch.compile` of itself) with dynamic shapes, since the rows of a batch vary in
length and each new static shape would cost a recompile. Only training calls (the model in
train mode with gradients on) take the compiled path: evaluations and generation stay
eager, so they cost no compile of their own.

A compile that raises, at compile time or at any compiled step (inductor compiles the
backward at the first backward), falls back to eager: the model's compiled call is
removed, the step is run again eagerly, and a warning says why (`details.warnings`,
`details.compile.fallback`). If the eager step raises too, that error is the job's.

A stop that arrives during a compiled step (a compile takes a minute or two on a CPU,
longer than a stop's grace) interrupts it: `StepInterrupter` raises `CompileInterrupted`
into the training thread, which leaves the step unfinished (its optimizer step not
taken), and the recipe saves what the completed steps trained (`save_interrupted`),
as a stop at a step's end does. A run on several ranks is not interrupted (a rank that
left alone would hang the others in a collective): it stops at the step's end.

Compiled graphs are cached on disk (TORCHINDUCTOR_CACHE_DIR, the data dir's
`compile-cache/`: `wire.DataDir.compile_environment`, set by the recipe for the child),
so a second run of the same shape compiles in seconds.
"""

from __future__ import annotations

import ctypes
import json
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_studio.atomic import write_atomically
from finetune_studio.child.channel import StopSignal
from finetune_studio.schemas import CompileChoice
from finetune_studio.training.throughput import measured_numbers, read_measured

# Eager optimizer steps `auto` trains and times before it decides (the first is warm-up).
COMPILE_PROBE_STEPS = 4
# The documented cold compile time (no cache) on this project's CPU: tiny model 52 s at
# 2 layers, SmolLM2-135M 103 s at 30 layers.
COLD_COMPILE_SECONDS = 50.0
COLD_COMPILE_SECONDS_PER_LAYER = 1.8
# The documented steady-state speed-up of a compiled step over an eager one:
# 802 / 520 tokens/s on the CPU (rounded down); a conservative guess on a GPU.
SPEEDUP = {"cpu": 1.5, "cuda": 1.2}
RECORDS_FILE = "compile-times.json"


def documented_compile_seconds(layers: int) -> float:
    """The documented cold compile time of a model of `layers` decoder layers."""
    return COLD_COMPILE_SECONDS + COLD_COMPILE_SECONDS_PER_LAYER * max(layers, 0)


@dataclass(frozen=True)
class CompileFigures:
    """What `auto` weighs: the steps left after the eager ones, an eager step's time, the
    expected compile time and speed-up, and where the last two come from."""

    steps_left: int
    eager_step_seconds: float
    compile_seconds: float
    speedup: float
    source: str  # "documented figures" or "measured by an earlier run of this shape"

    @property
    def saved_seconds(self) -> float:
        """What compiling would save over the steps left."""
        return self.steps_left * self.eager_step_seconds * (1.0 - 1.0 / self.speedup) if self.speedup > 1 else 0.0

    @property
    def break_even_steps(self) -> Optional[int]:
        """The steps after which a compile has paid for itself; None if it never does."""
        per_step = self.eager_step_seconds * (1.0 - 1.0 / self.speedup) if self.speedup > 1 else 0.0
        return math.ceil(self.compile_seconds / per_step) if per_step > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {"steps_left": self.steps_left, "eager_step_seconds": round(self.eager_step_seconds, 4),
                "compile_seconds": round(self.compile_seconds, 1), "speedup": round(self.speedup, 3),
                "saved_seconds": round(self.saved_seconds, 1), "break_even_steps": self.break_even_steps,
                "source": self.source}


@dataclass(frozen=True)
class CompileDecision:
    """Whether the model is compiled, what was asked, why, and the figures behind `auto`."""

    compiled: bool
    asked: CompileChoice
    reason: str
    figures: Optional[CompileFigures] = None

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"compiled": self.compiled, "asked": self.asked, "reason": self.reason}
        if self.figures is not None:
            found["figures"] = self.figures.to_json()
        return found


def decide_compile(asked: CompileChoice, figures: Optional[CompileFigures] = None, *, total_steps: int = 0) -> CompileDecision:
    """The decision for a run: `true` and `false` as asked; `auto` compiles when the steps
    left save more than the compile costs. `figures` None under `auto`: the run ended
    within its eager steps (`total_steps` of them)."""
    if asked is False:
        return CompileDecision(False, asked, "compile false was asked for")
    if asked is True:
        return CompileDecision(True, asked, "compile true was asked for")
    if figures is None:
        return CompileDecision(False, asked, f"not compiled: the run's {total_steps} steps end within the"
                                             f" {COMPILE_PROBE_STEPS} steps trained eagerly to time it")
    saved, cost = figures.saved_seconds, figures.compile_seconds
    even = figures.break_even_steps
    pays = f"pays after {even} steps" if even is not None else "never pays"
    head = (f"the {figures.steps_left} steps left at {figures.eager_step_seconds:.3g} s each would save about"
            f" {saved:.0f} s at {figures.speedup:.2g}x, against a compile of about {cost:.0f} s"
            f" ({figures.source}; it {pays})")
    if saved > cost:
        return CompileDecision(True, asked, f"compiled: {head}", figures)
    return CompileDecision(False, asked, f"not compiled: {head}", figures)


# -- what earlier runs measured -------------------------------------------------------


def read_records(path: Path) -> dict[str, dict[str, float]]:
    return {key: measured_numbers(value) for key, value in read_measured(path).items() if isinstance(value, dict)}


def write_record(path: Path, key: str, record: dict[str, float]) -> None:
    """Keep what this run measured; a cache that cannot be written costs only the record."""
    found = {**read_records(path), key: record}
    try:
        with write_atomically(path, unique=True) as partial:
            partial.write_text(json.dumps(found, indent=1, sort_keys=True))
    except OSError:
        pass


def describe_failure(exc: BaseException) -> str:
    """'BackendCompilerFailed: RuntimeError: what the compiler said' (dynamo wraps what its
    backend raised: the cause is named too), in one bounded line."""
    def line(error: BaseException) -> str:
        text = str(error).strip()
        return f"{type(error).__name__}: {text.splitlines()[0][:300]}" if text else type(error).__name__

    cause = getattr(exc, "inner_exception", None) or exc.__cause__
    return f"{type(exc).__name__}: {line(cause)}" if isinstance(cause, BaseException) else line(exc)


# -- a stop during a compiled step ----------------------------------------------------


class CompileInterrupted(BaseException):
    """Raised into the training thread by a stop that arrived during a compiled step. A
    BaseException, so that no `except Exception` in the compiler takes it for its own."""


class StepInterrupter:
    """Interrupts the training thread's compiled step once a stop has arrived.

    The step `arm`s it on entry and `disarm`s it on exit; a watcher thread, once the stop
    is set, raises CompileInterrupted into the armed thread, and again every RETRY_SECONDS
    while that thread stays armed (in case something swallowed it). Python delivers it at
    the thread's next bytecode: inductor's compile is mostly Python, and a wait on a
    compile worker ends within one kernel's compile. Arming, disarming and raising share
    one lock, and disarming withdraws a raise not yet delivered, so the exception surfaces
    within the step, never in the optimizer's update after it. Whoever catches it calls
    `settle`, which disarms for good (a retry that lands meanwhile is caught there)."""

    RETRY_SECONDS = 5.0

    def __init__(self, stop: StopSignal) -> None:
        self.stop = stop
        self.lock = threading.Lock()
        self.thread_id: Optional[int] = None  # the armed thread, None when disarmed
        self.closed = False
        self.raised = 0

    def start(self) -> None:
        threading.Thread(target=self._watch, name="compile-interrupter", daemon=True).start()

    def arm(self) -> None:
        with self.lock:
            self.thread_id = threading.get_ident()

    def disarm(self) -> None:
        with self.lock:
            if self.thread_id is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id), None)
            self.thread_id = None

    def close(self) -> None:
        """No interruption from now on (the steps are over)."""
        with self.lock:
            self.closed = True
        self.disarm()

    def settle(self) -> None:
        """After CompileInterrupted was caught: disarmed for good, whatever lands meanwhile."""
        while True:
            try:
                self.close()
                return
            except CompileInterrupted:
                continue

    def _watch(self) -> None:
        while not self.closed and not self.stop.wait(1.0):
            pass
        while not self.closed:
            with self.lock:
                if self.thread_id is not None and not self.closed:
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id),
                                                               ctypes.py_object(CompileInterrupted))
                    self.raised += 1
            time.sleep(self.RETRY_SECONDS if self.raised else 0.05)


# -- the trainer's side ---------------------------------------------------------------


class Compilation:
    """Compiles a trainer's model as its request asks, times its steps, falls back to eager
    when a compile fails, and keeps `details.compile` (in `facts`) up to date.

    `attach(trainer)` wraps the trainer's `training_step` (the guard) and adds this object's
    callback; `say(message)` sends a `training` status (the recipe's)."""

    def __init__(self, asked: CompileChoice, *, cuda: bool, layers: int, shape_key: str, records: Path,
                 facts: dict[str, Any], warn: Callable[[str], None], say: Callable[[str], None], ranks: int = 1,
                 stop: Optional[StopSignal] = None) -> None:
        self.asked = asked
        self.cuda = cuda
        self.layers = layers
        self.shape_key = shape_key
        self.records = records
        self.facts = facts
        self.warn = warn
        self.say = say
        self.model: Any = None
        self.active = False  # the model's call is compiled now
        self.step_began = 0.0
        self.eager_steps: list[float] = []  # seconds per optimizer step, eager (the first left out)
        self.compiled_steps: list[float] = []
        self.first_step: Optional[int] = None  # the first step this process trained (above 1 when resumed)
        # One rank alone is interrupted (see the module's docstring); a run that never compiles needs no watcher.
        self.interrupter = StepInterrupter(stop) if stop is not None and ranks == 1 and asked is not False else None
        # auto has yet to decide; a data-parallel run (Ray Train's ranks) does not decide: each rank
        # would by its own steps' times, and ranks that differ (or one that falls back) would
        # leave the others waiting in a collective. It compiles when asked (`compile: true`).
        self.pending = asked == "auto" and ranks == 1
        if asked == "auto" and ranks > 1:
            self.decision = CompileDecision(False, asked, f"not compiled: a run on {ranks} ranks compiles only when asked"
                                                          " (compile: true); each rank would decide by its own timing")
        elif self.pending:
            self.decision = CompileDecision(False, asked, f"decided after the first {COMPILE_PROBE_STEPS} steps, trained eagerly")
        else:
            self.decision = decide_compile(asked)
        self._publish()

    def _publish(self, **extra: Any) -> None:
        self.facts["compile"] = {**self.decision.to_json(), **extra}

    # -- wiring ---------------------------------------------------------------

    def attach(self, trainer: Any) -> None:
        from transformers import TrainerCallback

        compilation = self
        original = trainer.training_step

        interrupter = self.interrupter

        def guarded_training_step(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            if not compilation.active:
                return original(model, inputs, *args, **kwargs)
            try:
                try:
                    if interrupter is not None:
                        interrupter.arm()
                    return original(model, inputs, *args, **kwargs)
                finally:
                    if interrupter is not None:
                        interrupter.disarm()
            except Exception as exc:  # noqa: BLE001 - a failed compile costs the speed-up, never the job
                compilation.uncompile()
                result = original(model, inputs, *args, **kwargs)  # eagerly; its own error is the job's
                compilation.fell_back(exc)
                return result

        trainer.training_step = guarded_training_step
        if interrupter is not None:
            interrupter.start()

        class Callback(TrainerCallback):
            def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                compilation.begin(kw.get("model"))

            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                compilation.step_began = time.perf_counter()

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                compilation.step_ended(time.perf_counter() - compilation.step_began, int(state.global_step),
                                       int(state.max_steps))

            def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                compilation.end()

        trainer.add_callback(Callback())

    def begin(self, model: Any) -> None:
        self.model = model
        if self.decision.compiled:
            self.compile()

    # -- compile and uncompile ------------------------------------------------

    def compile(self) -> None:
        """Compile the model's training calls in place (torch.nn.Module.compile's way)."""
        import torch

        model = self.model
        if model is None or not hasattr(model, "_compiled_call_impl"):
            self.decision = CompileDecision(False, self.asked, "not compiled: this torch cannot compile a module in place")
            self.warn("compile: this torch cannot compile a module in place; the job trains eagerly")
            self._publish()
            return
        compiled = torch.compile(model._call_impl, dynamic=True)

        def call(*args: Any, **kwargs: Any) -> Any:
            if model.training and torch.is_grad_enabled():
                return compiled(*args, **kwargs)
            return model._call_impl(*args, **kwargs)  # evaluation and generation stay eager

        model._compiled_call_impl = call
        self.active = True

    def uncompile(self) -> None:
        if self.model is not None:
            self.model._compiled_call_impl = None
        self.active = False

    def fell_back(self, exc: BaseException) -> None:
        what = describe_failure(exc)
        message = f"compile: torch.compile failed ({what}); the job trains eagerly"
        self.pending = False
        self.decision = CompileDecision(False, self.asked, f"not compiled: torch.compile failed ({what})",
                                        self.decision.figures)
        self._publish(fallback=what)
        self.warn(message)
        self.say(f"Training eagerly: {message}")

    # -- timing and the decision ---------------------------------------------

    def step_ended(self, seconds: float, step: int, total_steps: int) -> None:
        if self.first_step is None:
            self.first_step = step  # resumed runs start above 1
            if not self.active:
                return  # eager warm-up: not counted (compiled, this step holds the compile)
        (self.compiled_steps if self.active else self.eager_steps).append(seconds)
        if self.pending and step - self.first_step + 1 >= COMPILE_PROBE_STEPS and step < total_steps:
            self.decide(total_steps - step)  # a run whose timed steps are its last has nothing to decide: `end` says so

    def decide(self, steps_left: int) -> None:
        self.pending = False
        record = read_records(self.records).get(self.shape_key, {})
        compile_seconds = record.get("compile_seconds")
        speedup = record.get("speedup")
        source = "measured by an earlier run of this shape" if compile_seconds else "documented figures"
        figures = CompileFigures(
            steps_left=steps_left,
            eager_step_seconds=statistics.median(self.eager_steps),
            compile_seconds=compile_seconds or documented_compile_seconds(self.layers),
            speedup=speedup or SPEEDUP["cuda" if self.cuda else "cpu"],
            source=source,
        )
        self.decision = decide_compile("auto", figures)
        self._publish()
        self.say(f"Training: {self.decision.reason}")
        if self.decision.compiled:
            self.compile()

    def save_interrupted(self, trainer: Any) -> None:
        """After CompileInterrupted left `trainer.train()`: what the completed steps trained
        is kept as a stop at a step's end keeps it (the trainer's callbacks end the run, and a
        checkpoint of the last completed step is written, unless none was completed); the
        recipe then saves the adapter or model."""
        if self.interrupter is not None:
            self.interrupter.settle()
        self.uncompile()
        state, args = trainer.state, trainer.args
        step = int(state.global_step)
        trainer.callback_handler.on_train_end(args, state, trainer.control)  # this object's `end` among them
        self.facts["compile"]["interrupted"] = f"a stop arrived during compiled step {step + 1}; it was left unfinished"
        if step > 0 and not any(Path(args.output_dir).glob(f"checkpoint-{step}")):
            # The trainer's own checkpoint writer (optimizer, scheduler, RNG and trainer state),
            # which the stop's `should_save` would have called at the step's end.
            trainer._save_checkpoint(trainer.model, trial=None)

    def end(self) -> None:
        """Say what compiling measured (details.compile) and keep it for the next run of this shape."""
        if self.interrupter is not None:
            self.interrupter.close()  # the steps are over: a stop now has nothing to interrupt
        if self.pending:  # the run ended before auto could time it
            self.pending = False
            total = len(self.eager_steps) + (1 if self.first_step is not None else 0)
            self.decision = decide_compile("auto", None, total_steps=total)
            self._publish()
        if not self.active or not self.compiled_steps:
            return
        measured: dict[str, Any] = {}
        first, rest = self.compiled_steps[0], self.compiled_steps[1:]
        eager = statistics.median(self.eager_steps) if self.eager_steps else None
        steady = statistics.median(rest) if rest else None
        # The first compiled step holds the compile (forward and backward), less a step's own time.
        compile_seconds = max(first - (steady or eager or 0.0), 0.0)
        measured["compile_seconds"] = round(compile_seconds, 2)
        if steady is not None:
            measured["compiled_step_seconds"] = round(steady, 4)
        if eager is not None:
            measured["eager_step_seconds"] = round(eager, 4)
        record = {"compile_seconds": compile_seconds}
        if steady and eager:
            measured["speedup"] = round(eager / steady, 3)
            record["speedup"] = eager / steady
        self._publish(measured=measured)
        if compile_seconds > 0:
            write_record(self.records, self.shape_key, record)
