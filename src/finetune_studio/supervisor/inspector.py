"""The server's side of dataset inspections: one short-lived child per inspection.

`Inspector.inspect(body)` starts `python -m finetune_studio.inspection.child`,
writes the request to its stdin as one JSON line, and reads its one answer line
(the wire is drawn in that module's docstring). It never waits behind a training
job: inspections have slots of their own (`max_concurrent_inspections`; one more is
refused at once with `InspectionBusy`, 429), and each is bounded in time
(`inspect_timeout_seconds`: the child is killed and the answer is
`InspectionFailed`, 503). A child that dies or answers nothing is an
`InspectionFailed` that says why, with the last lines of its log
(`<data-dir>/inspect.log`, every child's stderr). An inspection that is cancelled
kills and reaps its child and frees its slot before it ends; the route cancels it
when its client goes away (`POST /datasets/inspect` is `@request_scoped`:
api/request_scoped.py). When the server stops, `shutdown` kills and reaps every
running child, and a request still waiting on one answers `InspectionFailed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Any, Optional

from finetune_studio.config import Settings
from finetune_studio.errors import InspectionBusy, InspectionFailed, StorageFailed
from finetune_studio.failures import storage_fault
from finetune_studio.supervisor.inference import describe_exit
from finetune_studio.supervisor.launcher import log_tail, spawn_child

INSPECT_MODULE = "finetune_studio.inspection.child"
LOG_NAME = "inspect.log"
_START_MARK = "--- finetune-studio: dataset inspection"
RETRY_AFTER_SECONDS = 2


class Inspector:
    """Runs dataset inspections in children, a few at a time (see the module docstring)."""

    def __init__(self, settings: Settings, module: str = INSPECT_MODULE, python: Optional[str] = None) -> None:
        self.module = module
        self.python = python or settings.worker_python or sys.executable
        self.slots = settings.max_concurrent_inspections
        self.timeout = settings.inspect_timeout_seconds
        self.log_path = settings.data_dir / LOG_NAME
        self.running = 0
        self.processes: set[asyncio.subprocess.Process] = set()

    def pids(self) -> list[int]:
        """The inspection children running now (for /metrics' memory)."""
        return [process.pid for process in self.processes if process.returncode is None]

    async def inspect(self, body: dict[str, Any]) -> dict[str, Any]:
        """The child's `DatasetInspection` (as JSON) for a validated request body (secrets included)."""
        if self.running >= self.slots:
            raise InspectionBusy(
                f"{self.running} dataset inspections are running, as many as this server runs at once; try again in a"
                " moment (the operator sets the limit with FINETUNE_STUDIO_MAX_CONCURRENT_INSPECTIONS)"
            )
        self.running += 1
        try:
            return await self._run(body)
        finally:
            self.running -= 1

    async def shutdown(self) -> None:
        """Kill and reap every running inspection's child (the server is stopping: a request
        still waiting on one may never be cancelled)."""
        for process in list(self.processes):
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
        for process in list(self.processes):
            await process.wait()

    async def _run(self, body: dict[str, Any]) -> dict[str, Any]:
        process = await self._start()
        self.processes.add(process)
        try:
            try:
                out, _ = await asyncio.wait_for(
                    process.communicate(json.dumps(body).encode() + b"\n"), self.timeout
                )
            except asyncio.TimeoutError:
                raise InspectionFailed(
                    f"the dataset inspection took longer than {self.timeout:g} s and was stopped; inspect fewer or"
                    " smaller files, or the operator raises FINETUNE_STUDIO_INSPECT_TIMEOUT_SECONDS"
                ) from None
        finally:
            # Killed whatever ended the wait (a timeout, the client gone, the server stopping).
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(process.wait())
            self.processes.discard(process)
        answer = _answer(out)
        if answer is not None and answer.get("type") == "inspection" and isinstance(answer.get("inspection"), dict):
            inspection: dict[str, Any] = answer["inspection"]
            return inspection
        if answer is not None and answer.get("type") == "failed":
            raise InspectionFailed(f"the dataset inspection failed: {answer.get('message')}")
        tail = log_tail(self.log_path, after=_START_MARK)
        what = describe_exit(process.returncode).replace("the inference process", "the dataset inspection's process")
        raise InspectionFailed(f"{what} before it answered" + (f". Last lines of {self.log_path}:\n{tail}" if tail else ""))

    async def _start(self) -> asyncio.subprocess.Process:
        argv = [self.python, "-m", self.module]
        try:
            return await spawn_child(argv, self.log_path, mark=_START_MARK)
        except OSError as exc:
            fault = storage_fault(exc)
            if fault is not None:  # its log cannot be written: a full disk is a 507, and says what to free
                raise StorageFailed(fault.error_code, f"the dataset inspection could not start: {fault.message}") from exc
            raise InspectionFailed(f"the dataset inspection's process could not start ({' '.join(argv)}): {exc}") from exc


def _answer(out: bytes) -> Optional[dict[str, Any]]:
    """The child's answer: its last line that is a JSON object."""
    for line in reversed(out.splitlines()):
        try:
            message = json.loads(line)
        except (json.JSONDecodeError, RecursionError, UnicodeDecodeError):
            continue
        if isinstance(message, dict):
            return message
    return None
