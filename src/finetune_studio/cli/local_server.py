"""LocalServer: a `finetune-studio serve` child process on a loopback port.

The demo, the tests and the benchmarks all start their real servers this one way:
start waits for the first `/health` answer (and says where the log is when the
server dies first), stop asks politely with SIGTERM and kills only after a grace.

A `detached` server (the CLI's `train` starts one when nothing answers) runs in
its own session, so the terminal's Ctrl-C reaches only the CLI, and is spawned
rather than kept as a `Popen`, so that it may outlive the process that started it.
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
from typing import Optional, TypeVar

import httpx

# Subclasses (the tests' ServerProcess) get their own type back from start().
_Server = TypeVar("_Server", bound="LocalServer")


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
        detached: bool = False,
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.env = {**os.environ, **(env or {})}
        self.args = list(args)
        self.log_path = log_path or data_dir / "server.log"
        self.log_level = log_level
        self.detached = detached
        self.process: Optional[subprocess.Popen[bytes]] = None
        self._pid: Optional[int] = None
        self._returncode: Optional[int] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> Optional[int]:
        return self._pid

    def start(self: _Server, timeout: float = 20.0, poll_interval: float = 0.05) -> _Server:
        """Start the server and return once it answers /health."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "finetune_studio.cli.main", "serve", "--port", str(self.port),
                "--data-dir", str(self.data_dir), "--log-level", self.log_level, *self.args]
        self._returncode = None
        if self.detached:
            self._pid = _spawn_in_own_session(argv, self.env, self.log_path)
        else:
            with open(self.log_path, "ab") as log:
                # argv is this package's own `serve` command; no shell is involved.
                self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)  # noqa: S603
            self._pid = self.process.pid
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.poll() is not None:
                raise RuntimeError(f"the server exited at start-up; its log ({self.log_path}) ends:\n{self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(poll_interval)
        self.stop()
        raise RuntimeError(f"the server did not answer /health within {timeout:.0f} s; its log ({self.log_path}) ends:\n{self._log_tail()}")

    def poll(self) -> Optional[int]:
        """The server's exit status once it has exited (and been reaped here), else None."""
        if self.process is not None:
            return self.process.poll()
        if self._pid is None or self._returncode is not None:
            return self._returncode
        try:
            pid, status = os.waitpid(self._pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: it is gone
            self._returncode = 0
            return self._returncode
        if pid == 0:
            return None
        self._returncode = os.waitstatus_to_exitcode(status)
        return self._returncode

    def stop(self, grace: float = 60.0) -> None:
        """SIGTERM (running jobs are stopped cleanly), then SIGKILL after `grace` seconds."""
        if self._pid is None or self.poll() is not None:
            return
        os.kill(self._pid, signal.SIGTERM)
        if not self._wait(grace):
            self.kill()

    def kill(self) -> None:
        if self._pid is None:
            raise RuntimeError("the server was never started")
        if self.poll() is None:
            os.kill(self._pid, signal.SIGKILL)
        self._wait(None)

    def _wait(self, timeout: Optional[float]) -> bool:
        """Wait for the exit; False if it has not come within `timeout` seconds."""
        if self.process is not None:
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def restart(self: _Server) -> _Server:
        """Stop, then start again on a new port with the same data."""
        self.stop()
        self.port = free_port()
        return self.start()

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self: _Server) -> _Server:
        return self.start()

    def __exit__(self, kind: Optional[type[BaseException]], error: Optional[BaseException], trace: Optional[TracebackType]) -> None:
        self.stop()


def _spawn_in_own_session(argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> int:
    """Start argv in a new session with stdin from /dev/null and its output appended to log_path; its pid."""
    return os.posix_spawn(
        argv[0],
        list(argv),
        dict(env),
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
    )
