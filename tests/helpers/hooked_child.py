"""The real training child with test hooks: `python -m tests.helpers.hooked_child --job-id ID`.

It runs `finetune_studio.training.child.main` unchanged, with a Channel that can

- hold the child in one phase once it has announced it (`pause_in`), or after it
  has reported one training step (`pause_at_step`), until a stop arrives, so that
  a test can stop it at an exact point; or
- fail at the first training step (or at `fault_at_step`), as if memory or the disk
  had run out (`fault`: `out_of_memory` or `disk_full`), so that the classifier's real
  path is taken; with `fault_mid_checkpoint`, the disk fills while that step's
  checkpoint is being written, which leaves it half-written; or
- make every torch.compile fail (`compile_fault`): its backend raises when dynamo hands
  it the first graph, at the first compiled step, as a compiler bug would; or make it
  take as long as a cold compile on a slow machine, and more (`compile_stall`: the
  backend works in Python for up to PAUSE_LIMIT_SECONDS); or
- make `compile: auto` compile after its timed eager steps, whatever its figures say
  (`auto_compiles`).

`HookedLauncher` starts this module instead of the production child and writes the
hooks for each job to `<output_dir>/test_hooks.json` before the child starts; a
child whose job has no such file behaves exactly as the production one. The hooks
live here, on the tests' side: the product knows nothing of them.
"""

from __future__ import annotations

import errno
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Literal, Optional

from finetune_studio.child.channel import Channel, StopSignal
from finetune_studio.schemas import Phase
from finetune_studio.supervisor.launcher import LocalProcessHandle, LocalProcessLauncher
from finetune_studio.training.child import main
from finetune_studio.wire import WorkerSpec
from tests.helpers.children import HOOKED_CHILD

HOOKS_FILE = "test_hooks.json"
# A held child waits at most this long for its stop, so a broken test cannot leave it behind.
PAUSE_LIMIT_SECONDS = 300.0

Fault = Literal["", "out_of_memory", "disk_full"]


@dataclass(frozen=True)
class Hooks:
    pause_in: str = ""  # a phase: once announced, wait there until a stop arrives
    pause_at_step: int = 0  # a step: once reported, wait there until a stop arrives
    fault: Fault = ""  # raised when the first training step reports (or step fault_at_step)
    fault_at_step: int = 0  # the step whose report raises the fault (0: the first)
    # With fault disk_full: the disk fills while the trainer writes this step's checkpoint,
    # so checkpoints/checkpoint-<step>/ is left half-written (no trainer_state.json).
    fault_mid_checkpoint: bool = False
    compile_fault: bool = False  # torch.compile's backend raises (at the first compiled step)
    compile_stall: bool = False  # torch.compile's backend takes PAUSE_LIMIT_SECONDS (then runs the graph eagerly)
    auto_compiles: bool = False  # compile auto decides to compile once it has timed its eager steps


class HookedChannel(Channel):
    """A Channel that pauses after announcing one phase or reporting one step, or fails
    on the first progress report."""

    def __init__(self, stream: IO[str], stop: StopSignal, hooks: Hooks, output_dir: Optional[Path] = None) -> None:
        super().__init__(stream, stop)
        self.stop = stop
        self.hooks = hooks
        self.output_dir = output_dir

    def status(
        self, phase: Phase, message: str, *, error: Optional[str] = None, details: Optional[dict[str, Any]] = None
    ) -> None:
        super().status(phase, message, error=error, details=details)
        if phase == self.hooks.pause_in:
            self._hold(phase)

    def progress(self, **fields: Any) -> None:
        at = self.hooks.fault_at_step
        if self.hooks.fault and (not at or fields.get("step") == at):
            self._fail(int(fields.get("step") or 0))
        super().progress(**fields)
        if fields.get("step") == self.hooks.pause_at_step:
            self._hold(f"step {self.hooks.pause_at_step}")

    def _fail(self, step: int) -> None:
        if self.hooks.fault == "out_of_memory":
            import torch

            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected by a test hook)")
        if self.hooks.fault_mid_checkpoint and self.output_dir is not None:
            # What a save cut short by a full disk leaves: the weights begun, no trainer state.
            folder = self.output_dir / "checkpoints" / f"checkpoint-{step}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "adapter_model.safetensors").write_bytes(b"\0" * 4096)
        raise OSError(errno.ENOSPC, "No space left on device (injected by a test hook)")

    def _hold(self, where: str) -> None:
        print(f"test hook: holding at {where} until a stop arrives", file=sys.stderr)
        self.stop.wait(PAUSE_LIMIT_SECONDS)


def hooked_channel(events: IO[str], stop: StopSignal, spec: WorkerSpec) -> Channel:
    """The channel for this job: hooked when its launcher wrote hooks for it."""
    path = spec.output_dir / HOOKS_FILE
    if not path.is_file():
        return Channel(events, stop)
    hooks = Hooks(**json.loads(path.read_text()))
    if hooks.compile_fault or hooks.compile_stall:
        replace_torch_compile_backend(failing_backend if hooks.compile_fault else stalling_backend)
    if hooks.auto_compiles:
        make_auto_compile()
    return HookedChannel(events, stop, hooks, spec.output_dir)


def failing_backend(graph: Any, example_inputs: Any) -> Any:
    raise RuntimeError("the compiler failed on this graph (injected by a test hook)")


def stalling_backend(graph: Any, example_inputs: Any) -> Any:
    """A compile that takes PAUSE_LIMIT_SECONDS, in Python as inductor's mostly is."""
    print("test hook: compiling for a long time", file=sys.stderr, flush=True)
    deadline = time.monotonic() + PAUSE_LIMIT_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.01)
    return graph.forward


def replace_torch_compile_backend(backend: Callable[[Any, Any], Any]) -> None:
    """Every torch.compile in this process gets `backend`."""
    import torch

    real_compile = torch.compile

    def compile_with_backend(model: Any, **options: Any) -> Any:
        options.pop("backend", None)
        return real_compile(model, backend=backend, **options)

    torch.compile = compile_with_backend  # type: ignore[assignment]


def make_auto_compile() -> None:
    """`compile: auto` compiles once it has timed its eager steps (its figures kept, its rule not)."""
    from finetune_studio.training import compilation

    rule = compilation.decide_compile

    def decide(asked: Any, figures: Any = None, **options: Any) -> Any:
        if asked == "auto" and figures is not None:
            return compilation.CompileDecision(True, asked, "compiled: a test hook decided so", figures)
        return rule(asked, figures, **options)

    compilation.decide_compile = decide


class HookedLauncher:
    """Starts every job in this module, with the hooks it holds when the job starts
    (a test may change `hooks` between jobs)."""

    def __init__(self, hooks: Hooks) -> None:
        self.hooks = hooks
        self._launcher = LocalProcessLauncher(module=HOOKED_CHILD)

    async def launch(self, spec: WorkerSpec) -> LocalProcessHandle:
        spec.output_dir.mkdir(parents=True, exist_ok=True)
        (spec.output_dir / HOOKS_FILE).write_text(json.dumps(asdict(self.hooks)))
        return await self._launcher.launch(spec)


if __name__ == "__main__":
    sys.exit(main(make_channel=hooked_channel))
