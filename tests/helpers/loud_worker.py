"""Stand-in workers that try to make a job's events large, for tests/reliability/test_memory.py.

`LoudLauncher` runs no process: its worker sends every phase with a status of
several megabytes (warnings, details, message and error far over the limits of
`finetune_studio.bounds`, a NaN, nesting 5,000 deep), then `steps` progress
events, then holds in `training` until a stop arrives. So a test gets a live job
with a long event log, in the server's own process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Optional

from finetune_studio.supervisor.launcher import WorkerExit
from finetune_studio.wire import WorkerSpec

MiB = 1024 * 1024


def loud_details(size: int) -> dict[str, Any]:
    """Status details of about `size` bytes (and more than one way to be too big)."""
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    return {
        "warnings": [f"warning {n}: " + "w" * 1000 for n in range(size // 2000)],
        "blob": "b" * (size // 2),
        "files": {f"/data/file-{n:06d}.jsonl": n for n in range(size // 100)},
        "not_a_number": float("nan"),
        "deep": deep,
    }


class LoudHandle:
    pid: Optional[int] = None

    def __init__(self, spec: WorkerSpec, steps: int, status_bytes: int) -> None:
        self.log_path = spec.output_dir / "worker.log"
        self.steps = steps
        self.status_bytes = status_bytes
        self.stopped: Optional[asyncio.Event] = None

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        self.stopped = asyncio.Event()
        huge = "m" * self.status_bytes
        for phase in ("loading_model", "loading_dataset", "configuring", "training"):
            yield {"type": "status", "phase": phase, "message": huge, "error": huge,
                   "details": loud_details(self.status_bytes)}
        for step in range(1, self.steps + 1):
            yield {"type": "progress", "progress": {"step": step, "total_steps": self.steps, "loss": 1.0 / step,
                                                    "learning_rate": 1e-4, "progress_percent": 100.0 * step / self.steps,
                                                    "epoch": step / self.steps, "elapsed_seconds": step * 0.01,
                                                    "eta_seconds": 1.0, "grad_norm": 0.5, "timestamp": 1.7e9}}
            if step % 500 == 0:
                await asyncio.sleep(0)  # let the server's other work run, as a pipe would
        await self.stopped.wait()
        yield {"type": "status", "phase": "stopped", "message": "stopped", "details": {}}

    async def request_stop(self) -> None:
        if self.stopped is not None:
            self.stopped.set()

    def terminate(self) -> None:
        pass

    def kill(self) -> None:
        pass

    async def wait(self) -> WorkerExit:
        return WorkerExit(0)


class LoudLauncher:
    def __init__(self, steps: int = 10, status_bytes: int = 4 * MiB) -> None:
        self.steps = steps
        self.status_bytes = status_bytes

    async def launch(self, spec: WorkerSpec) -> LoudHandle:
        return LoudHandle(spec, self.steps, self.status_bytes)
