"""A real Ray cluster for the tests (tests/integration/test_ray.py, test_sweeps_ray.py): two
nodes of one CPU each on 127.0.0.1, each `ray start --block` in a session of its own (stopped
by process group at the end), with a short temp dir (Ray's unix sockets allow ~107
characters); and a real server that runs its jobs' drivers on it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from finetune_studio.cli.local_server import free_port
from tests.helpers.polling import wait_for
from tests.helpers.s3 import CREDENTIALS
from tests.helpers.servers import ServerProcess

RAY = str(Path(sys.executable).with_name("ray"))


class Node:
    """One `ray start --block` process group."""

    def __init__(self, args: list[str], log: Path, tmp: Path) -> None:
        """`tmp`: the node's own temporary directory (TMPDIR), which no other node sees."""
        self.log = log
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [RAY, "start", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats",
                 f"--dashboard-agent-listen-port={free_port()}", *args],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                # No drain on SIGTERM: at the end nothing is left to drain, but Ray Train's detached
                # helper actor would hold the head's drain for its whole 30 s timeout.
                env={**os.environ, **CREDENTIALS, "TMPDIR": str(tmp), "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"},
            )

    def started(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"ray start exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
        return "Ray runtime started" in self.log.read_text(errors="replace")

    def stop(self) -> None:
        """End the node's process group, then what it started in sessions of their own (Ray's
        worker processes, and helper actors that outlive their job): every process it started."""
        try:
            started = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            started = []
        # SIGTERM to `ray start` alone: it stops the node's processes in order (~2 s). Sent to the
        # whole group at once, it also ends the GCS under `ray start`, which then waits for it ~30 s.
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # what is left of the group
        self.process.wait(10)
        for process in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(started, timeout=10)


@dataclass
class Cluster:
    address: str
    nodes: list[Node]
    client_address: str  # the head node's Ray Client server: ray://127.0.0.1:PORT


def listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


@contextlib.contextmanager
def two_node_cluster(logs: Path) -> Iterator[Cluster]:
    """A 2-node cluster (1 CPU each) on 127.0.0.1, its logs under `logs`; each node has a temporary
    directory of its own. Stopped, every process it started, when the block ends."""
    temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    port, client_port = free_port(), free_port()
    address = f"127.0.0.1:{port}"
    # A Ray Client server port of its own: with ray[client] installed the head takes 10001 unless told.
    nodes = [Node(["--head", f"--port={port}", f"--ray-client-server-port={client_port}", f"--temp-dir={temp}",
                   "--include-dashboard=false"], logs / "head.log", logs / "head-tmp")]
    try:
        wait_for(nodes[0].started, timeout=120, interval=0.2, what="the Ray head node")
        wait_for(lambda: listening(client_port), timeout=60, interval=0.2, what="the head node's Ray Client server")
        nodes.append(Node([f"--address={address}", f"--temp-dir={temp}"], logs / "worker.log", logs / "worker-tmp"))
        wait_for(nodes[1].started, timeout=120, interval=0.2, what="the second Ray node")
        yield Cluster(address, nodes, f"ray://127.0.0.1:{client_port}")
    finally:
        for node in reversed(nodes):
            node.stop()
        shutil.rmtree(temp, ignore_errors=True)



def ray_server(start_server: Any, address: str, max_failures: int, **env: str) -> ServerProcess:
    env = {"FINETUNE_STUDIO_RAY_ADDRESS": address, "FINETUNE_STUDIO_RAY_MAX_FAILURES": str(max_failures), **env}
    return start_server(env=env)  # type: ignore[no-any-return]
