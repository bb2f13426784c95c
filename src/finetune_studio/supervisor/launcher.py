"""The seam where a job's training process is started: local child processes today.

A launcher turns a `WorkerSpec` into a running `WorkerHandle`. The supervisor only
talks to the handle: it reads the worker's messages, asks it to stop, terminates or
kills it, and waits for its exit. Running the same jobs elsewhere (a Ray cluster)
means writing another launcher; nothing else changes. What travels over the wire
is in `finetune_studio.wire`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Protocol

from finetune_studio.wire import CHILD_ENV, MAX_MESSAGE_BYTES, STOP_COMMAND, TOOLS_ENV, JobFolder, WorkerSpec

CHILD_MODULE = "finetune_studio.training.child"
# An export's child (docs/PROCESSES.md, The job wire): the same wire, its own phases.
EXPORT_MODULE = "finetune_studio.export.child"
# Modules whose processes are the server's workers, for telling an orphan from a reused pid.
# The Ray driver of a training job on a cluster (supervisor/ray_launcher.py): the same wire too.
RAY_DRIVER_MODULE = "finetune_studio.ray_train.driver"
# An evaluation's child (docs/PROCESSES.md): the same wire; it reaches the models through the server's /v1.
EVAL_MODULE = "finetune_studio.evaluation.child"
WORKER_MODULES: tuple[str, ...] = (CHILD_MODULE, EXPORT_MODULE, RAY_DRIVER_MODULE, EVAL_MODULE)
# The server's own settings (FINETUNE_STUDIO_TOKEN above all) stay with the server,
# but for those meant for the children too (where the export child finds llama.cpp's tools).
SERVER_PREFIX = "FINETUNE_STUDIO_"
SHARED_SETTINGS = frozenset({TOOLS_ENV})


def child_environment(server_env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a training child: the server's, minus the server's settings.

    A deny-list by the one prefix the server owns, not an allow-list: everything else
    in the environment is the user's configuration of the training stack
    (CUDA_VISIBLE_DEVICES, HF_HOME, HF_HUB_OFFLINE, proxies, PYTORCH_CUDA_ALLOC_CONF,
    OMP_NUM_THREADS, LD_LIBRARY_PATH, WANDB_*, ...), too open-ended to list, and
    dropping one silently would train on the wrong GPU or go online. The child needs
    no setting of the server's, and its secrets would otherwise end up wherever a
    child's environment is recorded (W&B's run metadata, crash reports, a model's
    remote code). The child gets its job, secrets included, on stdin.
    """
    env = {
        name: value
        for name, value in server_env.items()
        if not name.startswith(SERVER_PREFIX) or name in SHARED_SETTINGS
    }
    env.update(CHILD_ENV)
    return env


@dataclass(frozen=True)
class WorkerExit:
    returncode: Optional[int]
    process: str = "the training process"  # what the worker is, for `describe`

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
            return f"{self.process} was killed by {self.signal_name}"
        return f"{self.process} exited with code {self.returncode}"


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
        if process.stdin is None or process.stdout is None:
            raise OSError("the worker was started without its stdin and stdout pipes")
        self._process = process
        self._stdin: asyncio.StreamWriter = process.stdin
        self._stdout: asyncio.StreamReader = process.stdout
        self.pid: Optional[int] = process.pid
        self.log_path = log_path

    async def send(self, line: bytes) -> None:
        """Write one line to the worker's stdin; a worker that is gone is reported by wait()."""
        if self._stdin.is_closing():
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._stdin.write(line)
            await self._stdin.drain()

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            try:
                line = await self._stdout.readline()
            except ValueError:  # a line over the limit: skip what we cannot parse
                continue
            if not line:
                return
            try:
                message = json.loads(line)
            except (json.JSONDecodeError, RecursionError):  # not JSON, or nested past what the parser takes
                continue
            if isinstance(message, dict):
                yield message

    async def request_stop(self) -> None:
        await self.send(STOP_COMMAND.encode() + b"\n")

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
        self._stdin.close()
        return WorkerExit(returncode)


class LocalProcessLauncher:
    """Runs each job in a child Python process on this machine."""

    def __init__(self, python: Optional[str] = None, module: str = CHILD_MODULE, args: Sequence[str] = ()) -> None:
        self.python = python or sys.executable
        self.module = module
        self.args = tuple(args)  # after --job-id ID (the Ray driver's cluster settings)

    async def launch(self, spec: WorkerSpec) -> LocalProcessHandle:
        spec.output_dir.mkdir(parents=True, exist_ok=True)
        log_path = JobFolder(spec.output_dir).log
        argv = [self.python, "-m", self.module, "--job-id", spec.job_id, *self.args]
        process = await spawn_child(argv, log_path)
        handle = LocalProcessHandle(process, log_path)
        await handle.send(spec.to_line())
        return handle


async def spawn_child(argv: Sequence[str], log_path: Path, mark: Optional[str] = None) -> asyncio.subprocess.Process:
    """Start one of the server's children, the one way every supervisor does (training,
    export, chat, dataset inspection): stdin and stdout are pipes (lines of up to
    MAX_MESSAGE_BYTES), stderr is appended to `log_path` (after `mark`, a line that
    tells this child's part of a shared log from the last one's), the environment is
    the server's without its settings (`child_environment`), and the child has a
    session of its own, so a Ctrl-C meant for the server does not reach it (the
    server stops it cooperatively instead). OSError when it cannot be started, or
    when its log cannot be written (a full disk)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        if mark is not None:
            log.write(f"{mark} at {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode())
            log.flush()
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            env=child_environment(os.environ),
            start_new_session=True,
            limit=MAX_MESSAGE_BYTES,
        )


def is_our_worker(pid: int, job_id: str) -> bool:
    """True when pid is alive and is a worker (training or export child) of job_id (not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(module.encode() in cmdline for module in WORKER_MODULES) and job_id.encode() in cmdline


LOG_TAIL_LINES = 12


def log_tail(path: Path, after: Optional[str] = None, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a child's log (of its last 8 KiB), for an error message; with
    `after`, only those following the last line that starts with it (the current child's)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 8192))
            found = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    if after is not None:
        starts = [index for index, line in enumerate(found) if line.startswith(after)]
        if starts:
            found = found[starts[-1] + 1 :]
    return "\n".join(found[-lines:])
