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

With `--storage` it then measures what a job's files cost when they travel through
an s3:// URI (a real S3 endpoint on 127.0.0.1: moto's server) instead of a shared
folder: the same 2-worker job with a checkpoint every `--save-steps`, both ways, in
interleaved rounds; `last step to end` is from the last progress event to the
terminal one (saving the result, and with s3:// uploading and copying it back).
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
from tests.helpers.s3 import CREDENTIALS  # noqa: E402


def start_cluster(temp: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    log = open(temp / "head.log", "wb")  # noqa: SIM115 - kept open for the cluster's life
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
         f"--port={port}", "--num-cpus=2", f"--temp-dir={temp}", "--include-dashboard=false", "--disable-usage-stats",
         f"--ray-client-server-port={free_port()}",
         f"--dashboard-agent-listen-port={free_port()}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, **CREDENTIALS},  # for --storage: the nodes reach the bucket with these
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
    last_step: Optional[float] = None
    latencies: list[float] = []
    last: Any = None
    with StudioClient(url) as client:
        for event in client.stream(job):
            now = time.time()
            last = event
            if event.kind == "progress":
                first = first or now
                last_step = now
                if event.data.get("timestamp"):
                    latencies.append((now - float(event.data["timestamp"])) * 1000)
    ended = time.time()
    assert last is not None and last.data["phase"] == "completed", last.data if last else None
    return {"wall": ended - started, "first": (first or ended) - started, "p50": median(latencies),
            "p99": percentile(latencies, 99), "steps": len(latencies), "tail": ended - (last_step or ended)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--storage", action="store_true", help="also compare a shared folder with an s3:// URI")
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-ray-"))
    model = tiny_model(workdir)
    temp = Path(tempfile.mkdtemp(prefix="br", dir="/tmp"))  # short: Ray's socket paths
    address, cluster = start_cluster(temp)
    rows = []
    storage_rows: dict[str, list[dict[str, Any]]] = {}
    try:
        with server(workdir / "local") as (url, _):
            rows.append(("local child", run_job(url, job_request(model, max_steps=args.steps, batch_size=2))))
        env = {"FINETUNE_STUDIO_RAY_ADDRESS": address}
        with server(workdir / "ray", env=env) as (url, _):
            rows.append(("Ray, 1 worker", run_job(url, job_request(model, max_steps=args.steps, batch_size=2))))
            rows.append(("Ray, 2 workers", run_job(url, job_request(model, max_steps=args.steps, batch_size=1, num_workers=2))))
        if args.storage:
            storage_rows = compare_storage(workdir, model, address, args)
    finally:
        os.killpg(cluster.pid, signal.SIGTERM)
        cluster.wait(60)
        shutil.rmtree(temp, ignore_errors=True)
    print(f"\n{args.steps} steps, tiny model, LoRA, global batch 2, on {os.cpu_count()} CPUs")
    print(f"{'run':<16} {'wall s':>8} {'to step 1 s':>12} {'latency p50 ms':>15} {'p99 ms':>8} {'events':>7}")
    for name, row in rows:
        print(f"{name:<16} {row['wall']:>8.1f} {row['first']:>12.1f} {row['p50']:>15.1f} {row['p99']:>8.1f} {row['steps']:>7}")
    if args.storage:
        print_storage(storage_rows, args)


def compare_storage(workdir: Path, model: Path, address: str, args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """The same 2-worker job with checkpoints, its files in a shared folder or at an s3:// URI, in interleaved rounds."""
    from tests.helpers.s3 import credentials, s3_server

    runs: dict[str, list[dict[str, Any]]] = {"shared folder": [], "s3:// URI": []}
    request = job_request(model, max_steps=args.steps, batch_size=1, num_workers=2, save_steps=args.save_steps)
    with s3_server() as s3, credentials():
        s3.make_bucket("bench")
        settings = {"shared folder": {}, "s3:// URI": {"FINETUNE_STUDIO_RAY_STORAGE_PATH": s3.uri("bench", "studio"), **CREDENTIALS}}
        for _ in range(args.rounds):
            for name, extra in settings.items():
                with server(workdir / f"storage-{len(runs[name])}-{name[:2]}", env={"FINETUNE_STUDIO_RAY_ADDRESS": address, **extra}) as (url, _):
                    runs[name].append(run_job(url, request))
    return runs


def print_storage(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    print(f"\nfiles of a 2-worker job ({args.steps} steps, a checkpoint every {args.save_steps}), medians of {args.rounds} rounds")
    print(f"{'files':<16} {'wall s':>8} {'to step 1 s':>12} {'last step to end s':>19} {'p99 ms':>8}")
    for name, rows in runs.items():
        print(f"{name:<16} {median([r['wall'] for r in rows]):>8.1f} {median([r['first'] for r in rows]):>12.1f}"
              f" {median([r['tail'] for r in rows]):>19.2f} {median([r['p99'] for r in rows]):>8.1f}")
    ratio = median([r["wall"] for r in runs["s3:// URI"]]) / median([r["wall"] for r in runs["shared folder"]])
    print(f"wall, s3:// / shared folder: {ratio:.3f}")


if __name__ == "__main__":
    main()
