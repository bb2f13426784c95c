"""The cost of Ray: event latency and job wall time, a Ray job against a local one.

    .venv/bin/python bench/ray_bench.py [--steps 60] [--workdir /tmp/bench-ray]

Starts a one-node Ray cluster on 127.0.0.1 (2 CPUs; stopped by process group at
the end), then runs the same LoRA job on the tiny model three ways, each through a
real server and its event stream: in a local child (no Ray), on 1 Ray worker, and
on 2 Ray workers (half the batch each: the same global batch). It prints a table:

- wall: from POST /train/start to the terminal event at the stream client;
- to first step: from the start to the first progress event;
- event latency p50/p99: from the end of a step in the training process (the
  progress event's `timestamp`) to its arrival at a stream client (for Ray: rank 0
  -> sink actor -> driver -> server -> client; one clock, one machine).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import job_request, median, percentile, server, start_job, tiny_model  # noqa: E402

from finetune_studio.cli.client import StudioClient  # noqa: E402
from finetune_studio.cli.local_server import free_port  # noqa: E402


def start_cluster(temp: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    log = open(temp / "head.log", "wb")  # noqa: SIM115 - kept open for the cluster's life
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
         f"--port={port}", "--num-cpus=2", f"--temp-dir={temp}", "--include-dashboard=false", "--disable-usage-stats",
         f"--dashboard-agent-listen-port={free_port()}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while "Ray runtime started" not in (temp / "head.log").read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"ray start failed:\n{(temp / 'head.log').read_text()[-2000:]}")
        time.sleep(0.2)
    return f"127.0.0.1:{port}", process


def run_job(url: str, request: dict[str, Any]) -> dict[str, Any]:
    started = time.time()
    job = start_job(url, request)
    first: Optional[float] = None
    latencies: list[float] = []
    last: Any = None
    with StudioClient(url) as client:
        for event in client.stream(job):
            now = time.time()
            last = event
            if event.kind == "progress":
                first = first or now
                if event.data.get("timestamp"):
                    latencies.append((now - float(event.data["timestamp"])) * 1000)
    ended = time.time()
    assert last is not None and last.data["phase"] == "completed", last.data if last else None
    return {"wall": ended - started, "first": (first or ended) - started, "p50": median(latencies),
            "p99": percentile(latencies, 99), "steps": len(latencies)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-ray-"))
    model = tiny_model(workdir)
    temp = Path(tempfile.mkdtemp(prefix="br", dir="/tmp"))  # short: Ray's socket paths
    address, cluster = start_cluster(temp)
    rows = []
    try:
        with server(workdir / "local") as (url, _):
            rows.append(("local child", run_job(url, job_request(model, max_steps=args.steps, batch_size=2))))
        env = {"FINETUNE_STUDIO_RAY_ADDRESS": address}
        with server(workdir / "ray", env=env) as (url, _):
            rows.append(("Ray, 1 worker", run_job(url, job_request(model, max_steps=args.steps, batch_size=2))))
            rows.append(("Ray, 2 workers", run_job(url, job_request(model, max_steps=args.steps, batch_size=1, num_workers=2))))
    finally:
        os.killpg(cluster.pid, signal.SIGTERM)
        cluster.wait(60)
        shutil.rmtree(temp, ignore_errors=True)
    print(f"\n{args.steps} steps, tiny model, LoRA, global batch 2, on {os.cpu_count()} CPUs")
    print(f"{'run':<16} {'wall s':>8} {'to step 1 s':>12} {'latency p50 ms':>15} {'p99 ms':>8} {'events':>7}")
    for name, row in rows:
        print(f"{name:<16} {row['wall']:>8.1f} {row['first']:>12.1f} {row['p50']:>15.1f} {row['p99']:>8.1f} {row['steps']:>7}")


if __name__ == "__main__":
    main()
