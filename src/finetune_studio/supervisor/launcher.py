"""The seam where a job's training process is started: local child processes today.

A launcher turns a `WorkerSpec` into a running `WorkerHandle`. The supervisor only
talks to the handle: it reads the worker's messages, asks it to stop, terminates or
kills it, and waits for its exit. Running the same jobs elsewhere (a Ray cluster)
means writing another launcher; nothing else changes.

The wire between server and child:

- the child's stdin carries one JSON line (the spec, secrets included, so they
  never touch disk or the process's environment), then commands (`stop`); EOF on
  stdin means the server is gone, and the child stops and saves;
- the child's stdout carries one JSON message per line (`training/channel.py`);
  the child moves everything else it prints to stderr at start-up;
- stderr goes to `worker.log` in the job's folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

CHILD_MODULE = "finetune_studio.training.child"
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass
class WorkerSpec:
    job_id: str
    output_dir: Path
    request: dict[str, Any]  # the full request, secrets included: handle with care
    warnings: list[str] = field(default_factory=list)  # for the child to report with its first status
    env: dict[str, str] = field(default_factory=dict)

    def to_line(self) -> bytes:
        payload = {
            "job_id": self.job_id,
            "output_dir": str(self.output_dir),
            "request": self.request,
            "warnings": self.warnings,
        }
        return json.dumps(payload).encode() + b"\n"


@dataclass(frozen=True)
class WorkerExit:
    returncode: Optional[int]

    @property
    def signal_name(self) -> Optional[str]:
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None

    def describe(self) -> str:
        if self.signal_name:
            return f"the training process was killed by {self.signal_name}"
        return f"the training process exited with code {self.returncode}"


class WorkerHandle(Protocol):
    pid: Optional[int]
    log_path: Path

    def messages(self) -> AsyncIterator[dict[str, Any]]: ...

    async def request_stop(self) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    async def wait(self) -> WorkerExit: ...


class WorkerLauncher(Protocol):
    async def launch(self, spec: WorkerSpec) -> WorkerHandle: ...


class LocalProcessHandle:
    def __init__(self, process: asyncio.subprocess.Process, log_path: Path) -> None:
        self._process = process
        self.pid: Optional[int] = process.pid
        self.log_path = log_path

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        assert self._process.stdout is not None
        while True:
            try:
                line = await self._process.stdout.readline()
            except ValueError:  # a line over the limit: skip what we cannot parse
                continue
            if not line:
                return
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(message, dict):
                yield message

    async def request_stop(self) -> None:
        stdin = self._process.stdin
        if stdin is None or stdin.is_closing():
            return
        try:
            stdin.write(b"stop\n")
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # already exiting

    def _signal(self, signum: int) -> None:
        if self._process.returncode is None:
            try:
                self._process.send_signal(signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    async def wait(self) -> WorkerExit:
        returncode = await self._process.wait()
        if self._process.stdin is not None:
            self._process.stdin.close()
        return WorkerExit(returncode)


class LocalProcessLauncher:
    """Runs each job in a child Python process on this machine."""

    def __init__(self, python: Optional[str] = None, module: str = CHILD_MODULE) -> None:
        self.python = python or sys.executable
        self.module = module

    async def launch(self, spec: WorkerSpec) -> LocalProcessHandle:
        spec.output_dir.mkdir(parents=True, exist_ok=True)
        log_path = spec.output_dir / "worker.log"
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            **spec.env,
        }
        with open(log_path, "ab") as log:
            process = await asyncio.create_subprocess_exec(
                self.python,
                "-m",
                self.module,
                "--job-id",
                spec.job_id,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=env,
                # Its own session: a Ctrl-C meant for the server does not reach the
                # child; the server stops it cooperatively instead.
                start_new_session=True,
                limit=_MAX_MESSAGE_BYTES,
            )
        handle = LocalProcessHandle(process, log_path)
        assert process.stdin is not None
        process.stdin.write(spec.to_line())
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await process.stdin.drain()  # a child that died at once is reported by wait()
        return handle


def is_our_worker(pid: int, job_id: str) -> bool:
    """True when pid is alive and is the training child of job_id (not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return CHILD_MODULE.encode() in cmdline and job_id.encode() in cmdline
