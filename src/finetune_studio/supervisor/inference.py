"""The server's side of the chat child: one inference process shared by every chat request.

`InferenceManager` starts the child (`python -m finetune_studio.inference.child`) on
the first request, writes each request to its stdin as a `GenerateCommand` with an
id of its own, and reads the child's stdout on one task, which hands each message to
the `Generation` of that id (an asyncio queue per request). Many requests are in the
child at once; the child decodes them together (one batched forward pass per step,
up to `max_batch_size` answers; the rest wait in order), so they all advance
together. The wire is drawn at the bottom of `finetune_studio.wire`.

- A request whose client goes away is cancelled in the child (`Generation.close`).
- When the child dies, every request it was serving ends with an `InferenceUnavailable`
  that says why (exit code or signal, and the last lines of `<data-dir>/inference.log`,
  its stderr); the next request starts a new child.
- When a training job starts, the child is told to unload its models
  (`unload_chat_for_training`), since training needs the memory.
- On shutdown, the child gets EOF on stdin and exits; it is terminated, then killed,
  if it does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from finetune_studio.config import Settings
from finetune_studio.errors import InferenceUnavailable, StorageFailed
from finetune_studio.failures import storage_fault
from finetune_studio.jobs.counters import ChatDecoding
from finetune_studio.supervisor.launcher import WorkerHandle, WorkerLauncher, log_tail, spawn_child
from finetune_studio.wire import GenerateCommand, ModelRef, SamplingParams, WorkerSpec

INFERENCE_MODULE = "finetune_studio.inference.child"
LOG_NAME = "inference.log"
# Written to the log before each start, so that a crash quotes only its own child's lines.
_START_MARK = "--- finetune-studio: inference process starting"
# Messages that end a request: the child's, and the manager's own when the child died.
FINAL = frozenset({"done", "failed", "crashed"})

log = logging.getLogger("finetune_studio.inference")


class Generation:
    """One request in the child: its messages (`started`, `delta`..., then `done` or
    `failed`; or `crashed` from the manager when the child died) in order."""

    def __init__(self, request_id: str, child: _Child) -> None:
        self.id = request_id
        self._child = child
        self._messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.finished = False

    def deliver(self, message: dict[str, Any]) -> None:
        self._messages.put_nowait(message)

    async def next(self) -> dict[str, Any]:
        """The next message; after a final one (`done`, `failed`, `crashed`) there are none."""
        message = await self._messages.get()
        if message.get("type") in FINAL:
            self.finished = True
            self._child.requests.pop(self.id, None)
        return message

    def close(self) -> None:
        """The client is gone (or got its answer): if the child still works on this
        request, tell it to stop. Never waits, so it may run in a cancelled task."""
        if not self.finished:
            self.finished = True
            if self._child.requests.pop(self.id, None) is not None:
                self._child.send_nowait({"type": "cancel", "id": self.id})


@dataclass
class _Child:
    process: asyncio.subprocess.Process
    stdin: asyncio.StreamWriter
    stdout: asyncio.StreamReader
    requests: dict[str, Generation] = field(default_factory=dict)
    ended: bool = False  # its stdout closed: it takes no more requests
    reader: Optional[asyncio.Task[None]] = None

    def send_nowait(self, message: dict[str, Any]) -> None:
        """Queue one line for the child's stdin (the transport writes it when it can)."""
        if self.ended or self.stdin.is_closing():
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.stdin.write(json.dumps(message).encode() + b"\n")

    async def send(self, message: dict[str, Any]) -> None:
        self.send_nowait(message)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await self.stdin.drain()


class InferenceManager:
    """The chat child's owner in the server (see the module docstring); one per app."""

    def __init__(self, settings: Settings, module: str = INFERENCE_MODULE, python: Optional[str] = None) -> None:
        self.settings = settings
        self.module = module
        self.python = python or settings.worker_python or sys.executable
        self.log_path = settings.data_dir / LOG_NAME
        self._child: Optional[_Child] = None
        self._starting = asyncio.Lock()
        self._closing = False
        self.decoding = ChatDecoding()  # the child's `stats` lines, for /metrics

    @property
    def pid(self) -> Optional[int]:
        """The running child's pid, or None."""
        child = self._child
        return child.process.pid if child is not None and not child.ended else None

    @property
    def active(self) -> int:
        """Requests the child is working on."""
        return len(self._child.requests) if self._child is not None else 0

    async def generate(
        self, model: ModelRef, messages: Sequence[dict[str, str]], params: SamplingParams
    ) -> Generation:
        """Send a chat request to the child (started first if none runs) and return its
        Generation; the caller reads it to the end or closes it."""
        command: GenerateCommand = {"type": "generate", "id": f"chatcmpl-{secrets.token_hex(12)}", "model": model,
                                    "messages": list(messages), "params": params}
        return await self._send(command)

    async def complete(self, model: ModelRef, prompt: Union[str, list[int]], params: SamplingParams) -> Generation:
        """Send a completion of `prompt` (a text, or token ids used as given) to the child; as `generate`."""
        command: GenerateCommand = {"type": "generate", "id": f"cmpl-{secrets.token_hex(12)}", "model": model,
                                    "prompt": prompt, "params": params}
        return await self._send(command)

    async def _send(self, command: GenerateCommand) -> Generation:
        child = await self._running_child()
        request_id = command["id"]
        generation = Generation(request_id, child)
        child.requests[request_id] = generation  # before the write: a crash must find it
        try:
            await child.send(dict(command))
        except BaseException:  # cancelled while the pipe was full: the request must not linger
            generation.close()
            raise
        return generation

    async def unload(self) -> None:
        """Ask the child to free its models (a training job needs the memory)."""
        child = self._child
        if child is not None and not child.ended:
            log.info("asking the inference process to unload its models")
            child.send_nowait({"type": "unload"})  # never waits: a training job is starting behind it

    async def shutdown(self) -> None:
        """Stop the child: EOF on its stdin, then SIGTERM and SIGKILL after the grace periods."""
        self._closing = True
        child = self._child
        if child is None:
            return
        child.stdin.close()
        grace = self.settings.kill_grace_seconds
        for escalate in (child.process.terminate, child.process.kill):
            try:
                await asyncio.wait_for(child.process.wait(), grace)
                break
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    escalate()
        with contextlib.suppress(asyncio.TimeoutError, ProcessLookupError):
            await asyncio.wait_for(child.process.wait(), grace)
        if child.reader is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(child.reader, grace)

    # -- the child ------------------------------------------------------------

    async def _running_child(self) -> _Child:
        async with self._starting:  # two first requests at once start one child
            if self._closing:
                raise InferenceUnavailable("the server is shutting down")
            if self._child is None or self._child.ended:
                self._child = await self._start()
            return self._child

    async def _start(self) -> _Child:
        argv = [
            self.python, "-m", self.module,
            "--max-loaded", str(self.settings.max_loaded_models),
            "--idle-seconds", str(self.settings.inference_idle_seconds),
            "--precision", self.settings.inference_precision,
            "--max-batch-size", str(self.settings.max_batch_size),
        ]
        try:
            process = await spawn_child(argv, self.log_path, mark=_START_MARK)
        except OSError as exc:
            fault = storage_fault(exc)
            if fault is not None:  # its log cannot be written: a full disk is a 507, and says what to free
                raise StorageFailed(fault.error_code, f"the inference process could not start: {fault.message}") from exc
            raise InferenceUnavailable(f"the inference process could not start ({' '.join(argv[:3])}): {exc}") from exc
        if process.stdin is None or process.stdout is None:  # never: both are pipes
            raise InferenceUnavailable("the inference process was started without its pipes")
        child = _Child(process, process.stdin, process.stdout)
        child.reader = asyncio.create_task(self._read(child), name=f"inference-{process.pid}")
        log.info("inference process started (pid %s)", process.pid)
        return child

    async def _read(self, child: _Child) -> None:
        """Hand each of the child's messages to its request; when its stdout ends,
        end every request it had with the reason it died."""
        try:
            while True:
                try:
                    line = await child.stdout.readline()
                except ValueError:  # a line over the limit: nothing of it can be routed
                    continue
                if not line:
                    break
                try:
                    message = json.loads(line)
                except (json.JSONDecodeError, RecursionError):
                    continue
                if not isinstance(message, dict):
                    continue
                if message.get("type") == "stats":
                    self.decoding.record(message)
                    continue
                generation = child.requests.get(str(message.get("id")))
                if generation is not None:
                    generation.deliver(message)
        finally:
            child.ended = True
            self.decoding.running = 0  # a dead child decodes nothing
            reason = await self._death(child)
            for generation in list(child.requests.values()):
                generation.deliver({"type": "crashed", "message": reason})
            if self._child is child:
                self._child = None

    async def _death(self, child: _Child) -> str:
        """Why the child's stdout ended, in words (it is waited for, briefly, then killed)."""
        if self._closing:
            return "the server is shutting down"
        try:
            returncode = await asyncio.wait_for(child.process.wait(), self.settings.kill_grace_seconds)
        except asyncio.TimeoutError:  # it closed its stdout but lives on: of no use any more
            with contextlib.suppress(ProcessLookupError):
                child.process.kill()
            returncode = await child.process.wait()
        what = describe_exit(returncode)
        log.warning("%s", what)
        tail = log_tail(self.log_path, after=_START_MARK)
        text = f"{what[0].upper()}{what[1:]}; the next request starts a new one."
        return text + (f" Last lines of {self.log_path}:\n{tail}" if tail else "")


def describe_exit(returncode: Optional[int]) -> str:
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        advice = (
            " (if no one killed it, the system most likely ran out of memory: try a smaller model, or"
            " FINETUNE_STUDIO_MAX_LOADED_MODELS=1)" if name == "SIGKILL" else ""
        )
        return f"the inference process was killed by {name}{advice}"
    return f"the inference process exited with code {returncode}"


class UnloadingLauncher:
    """A training launcher that first asks the chat child to unload its models, so
    that a job does not run out of the memory they hold (`unload_chat_for_training`)."""

    def __init__(self, launcher: WorkerLauncher, inference: InferenceManager) -> None:
        self.launcher = launcher
        self.inference = inference

    async def launch(self, spec: WorkerSpec) -> WorkerHandle:
        await self.inference.unload()
        return await self.launcher.launch(spec)
