"""LocalServer: a `finetune-studio serve` child process on a loopback port.

The demo, the tests and the benchmarks all start their real servers this one way:
start waits for the first `/health` answer (and says where the log is when the
server dies first), stop asks politely with SIGTERM and kills only after a grace.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Optional

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalServer:
    def __init__(
        self,
        data_dir: Path,
        *,
        port: Optional[int] = None,
        env: Optional[Mapping[str, str]] = None,
        args: Sequence[str] = (),
        log_path: Optional[Path] = None,
        log_level: str = "warning",
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.env = {**os.environ, **(env or {})}
        self.args = list(args)
        self.log_path = log_path or data_dir / "server.log"
        self.log_level = log_level
        self.process: Optional[subprocess.Popen[bytes]] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0, poll_interval: float = 0.05) -> LocalServer:
        """Start the server and return once it answers /health."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "finetune_studio.cli.main", "serve", "--port", str(self.port),
                 "--data-dir", str(self.data_dir), "--log-level", self.log_level, *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited at start-up; its log ({self.log_path}) ends:\n{self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(poll_interval)
        self.stop()
        raise RuntimeError(f"the server did not answer /health within {timeout:.0f} s; its log ({self.log_path}) ends:\n{self._log_tail()}")

    def stop(self, grace: float = 60.0) -> None:
        """SIGTERM (running jobs are stopped cleanly), then SIGKILL after `grace` seconds."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def restart(self) -> LocalServer:
        """Stop, then start again on a new port with the same data."""
        self.stop()
        self.port = free_port()
        return self.start()

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, kind: Optional[type[BaseException]], error: Optional[BaseException], trace: Optional[TracebackType]) -> None:
        self.stop()
