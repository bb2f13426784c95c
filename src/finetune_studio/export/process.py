"""Running one of llama.cpp's tools as a subprocess: its lines read as they come, stop honoured.

The converter scripts and the quantizer each run in a process of their own, so a
stop ends them at once (a C call such as `llama_model_quantize` cannot be
interrupted from Python) and a crash in llama.cpp is a failed step, not a dead
child. Every line they print goes to the export's log (our stderr) and to a
callback that turns it into progress; tqdm's `\\r` updates count as lines.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from finetune_studio.child.channel import StopRequested, StopSignal

# Seconds a tool has to end after SIGTERM before it is killed.
_TERMINATE_GRACE = 10.0
_TAIL_LINES = 80


class ToolFailed(Exception):
    """A tool exited with an error; `tail` holds its last lines (the reason is usually there)."""

    def __init__(self, tool: str, returncode: int, tail: list[str], disk_free: Optional[int] = None) -> None:
        self.tool = tool
        self.returncode = returncode
        self.tail = tail
        self.disk_free = disk_free  # bytes free where it wrote, as it failed (a short write says no more)
        how = f"signal {signal.Signals(-returncode).name}" if returncode < 0 and -returncode in signal.valid_signals() else f"exit status {returncode}"
        last = next((line for line in reversed(tail) if line.strip()), "")
        super().__init__(f"{tool} failed ({how}){': ' + last.strip() if last else ''}")


def _log(line: str) -> None:
    """Copy a tool's line to the export's log. The log may sit on the disk that just
    filled up: losing a line is fine, stopping to drain the tool's output is not."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def run_tool(
    name: str,
    argv: Sequence[str],
    *,
    stop: StopSignal,
    on_line: Callable[[str], None],
    env: Optional[dict[str, str]] = None,
    cwd: Optional[Path] = None,
    output: Optional[Path] = None,
) -> None:
    """Run argv to the end, feeding each output line to on_line. Raises StopRequested
    (after ending the tool) when a stop arrives, ToolFailed when it exits non-zero
    (with the free space beside output, the file it writes, measured before the
    caller removes what it had written)."""
    stop.check()
    process = subprocess.Popen(  # noqa: S603 - our own interpreter and llama.cpp's scripts, no shell
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=cwd,
    )
    tail: deque[str] = deque(maxlen=_TAIL_LINES)
    callback_errors: list[BaseException] = []

    stdout_fd = process.stdout.fileno() if process.stdout is not None else -1

    def read() -> None:
        pending = b""
        while True:
            chunk = os.read(stdout_fd, 65536)
            if not chunk:
                break
            pending += chunk
            *complete, pending = pending.replace(b"\r", b"\n").split(b"\n")
            for raw in complete:
                line = raw.decode("utf-8", "replace")
                if not line.strip():
                    continue
                tail.append(line)
                _log(line)
                if not callback_errors:
                    try:
                        on_line(line)
                    except BaseException as exc:  # noqa: BLE001 - reported on the main thread
                        callback_errors.append(exc)
        if pending.strip():
            line = pending.decode("utf-8", "replace")
            tail.append(line)
            _log(line)

    reader = threading.Thread(target=read, name=f"{name}-output", daemon=True)
    reader.start()
    try:
        while process.poll() is None:
            if stop.wait(0.2):
                raise StopRequested(stop.reason)
    finally:
        if process.poll() is None:  # stopped, or something failed here: the tool must not outlive the step
            process.terminate()
            try:
                process.wait(_TERMINATE_GRACE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        reader.join(_TERMINATE_GRACE)
        if process.stdout is not None:
            process.stdout.close()
    if callback_errors:
        raise callback_errors[0]
    if process.returncode != 0:
        free: Optional[int] = None
        if output is not None:
            with contextlib.suppress(OSError):
                free = shutil.disk_usage(output.parent).free
        raise ToolFailed(name, process.returncode, list(tail), free)
