"""finetune-studio benchmarks: one command, one table per budget of issue 6.

    .venv/bin/python bench/run.py                    # everything (about 10 minutes)
    .venv/bin/python bench/run.py overhead latency   # some of them

Each benchmark runs real servers and real training children on this machine, and
prints a Markdown table (measure, result, budget, verdict). Record the output, with
the machine's description, in docs/BENCHMARKS.md. Run it on a quiet machine:
other work on the cores changes every number.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from finetune_studio.cli.local_server import LocalServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    DEMO_DATA,
    job_request,
    median,
    percentile,
    raise_fd_limit,
    rss_mb,
    server,
    sse_client,
    start_job,
    table,
    tiny_model,
    verdict,
)

BENCH_DIR = Path(__file__).resolve().parent


def follow(url: str, job_id: str, on_event: Callable[..., None], last_event_id: int = 0) -> int:
    host, port = url.removeprefix("http://").split(":")
    return asyncio.run(sse_client(host, int(port), f"/train/stream/{job_id}", on_event, last_event_id))


# -- 1. overhead ---------------------------------------------------------------


def bench_overhead(work: Path, pairs: int = 3, steps: int = 200) -> str:
    model = tiny_model(work)
    bare, job = [], []
    with server(work / "overhead") as (url, _):
        for _ in range(pairs):
            started = time.monotonic()
            subprocess.run([sys.executable, str(BENCH_DIR / "bare_trl.py"), str(model), str(DEMO_DATA), str(steps)], check=True, capture_output=True)
            bare.append(time.monotonic() - started)

            started = time.monotonic()
            job_id = start_job(url, job_request(model, max_steps=steps))
            final: dict = {}
            follow(url, job_id, lambda i, k, d, t: final.update(json.loads(d)) if k == b"status" else None)
            job.append(time.monotonic() - started)
            assert final.get("phase") == "completed", final
    ratio = median(job) / median(bare)
    callback_us, server_us = per_event_costs(work)
    return table(f"Overhead: a {steps}-step LoRA run on the tiny model, bare TRL script vs job through the API ({pairs} alternating pairs)", [
        ("bare TRL script, median wall time", f"{median(bare):.2f} s", "", ""),
        ("finetune-studio job (POST to terminal event), median", f"{median(job):.2f} s", "", ""),
        ("job / bare", f"{ratio:.3f}", "<= 1.05", verdict(ratio <= 1.05)),
        ("per step: progress callback + pipe write (child)", f"{callback_us:.0f} us", "", ""),
        ("per step: validate + persist + fan-out (server)", f"{server_us:.0f} us", "", ""),
        ("per step: event path in all", f"{(callback_us + server_us) / 1000:.3f} ms", "< 1 ms", verdict(callback_us + server_us < 1000)),
    ])


def per_event_costs(work: Path, n: int = 5000) -> tuple[float, float]:
    """Microbenchmarks of the two halves of a step's event path, in microseconds."""
    child_code = f"""
import os, time, types
from finetune_studio.training.callbacks import ProgressCallback
from finetune_studio.child.channel import Channel, StopSignal
sink = open(os.devnull, "w")
stop = StopSignal()
callback = ProgressCallback(Channel(sink, stop), stop, lambda total, first: None)
state = types.SimpleNamespace(global_step=0, max_steps={n})
control = types.SimpleNamespace(should_evaluate=False, should_training_stop=False, should_save=False)
logs = {{"loss": 2.5, "learning_rate": 1e-4, "grad_norm": 0.5, "epoch": 0.1, "num_tokens": 1000}}
started = time.perf_counter()
for step in range(1, {n} + 1):
    state.global_step = step
    callback.on_step_end(None, state, control)
    callback.on_log(None, state, control, logs=logs)
print((time.perf_counter() - started) / {n} * 1e6)
"""
    child = float(subprocess.run([sys.executable, "-c", child_code], check=True, capture_output=True, text=True).stdout)
    server_code = f"""
import time
from pathlib import Path
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobStore
service = JobService(JobStore(Path({str(work / 'events.db')!r})), Path({str(work)!r}))
job = service.create_job({{}}, "q", {{}})
for phase in ("loading_model", "loading_dataset", "configuring", "training"):
    service.transition(job.id, phase, phase)
progress = {{"step": 1, "total_steps": {n}, "loss": 2.5, "learning_rate": 1e-4, "progress_percent": 1.0, "epoch": 0.1,
            "elapsed_seconds": 1.0, "eta_seconds": 2.0, "grad_norm": 0.5, "num_tokens": 1000, "timestamp": 1.0}}
started = time.perf_counter()
for step in range(1, {n} + 1):
    progress["step"] = step
    service.record_progress(job.id, progress)
print((time.perf_counter() - started) / {n} * 1e6)
"""
    server_us = float(subprocess.run([sys.executable, "-c", server_code], check=True, capture_output=True, text=True).stdout)
    return child, server_us


# -- 2. latency ------------------------------------------------------------------


def bench_latency(work: Path, steps: int = 300) -> str:
    model = tiny_model(work)
    latencies: list[float] = []

    def on_event(event_id: int, kind: bytes, data: bytes, received: float) -> None:
        if kind == b"progress":
            latencies.append((received - json.loads(data)["timestamp"]) * 1000)

    with server(work / "latency") as (url, _):
        follow(url, start_job(url, job_request(model, max_steps=steps)), on_event)
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    return table(f"Event latency: trainer step end to stream client, {len(latencies)} steps of the tiny model", [
        ("p50", f"{p50:.1f} ms", "", ""),
        ("p99", f"{p99:.1f} ms", "< 20 ms", verdict(p99 < 20)),
        ("the peers (Unsloth Studio polls 1 s; LlamaBoard re-reads its log every 2 s)", "1,000-2,000 ms", "", ""),
    ])


# -- 3. fan-out ------------------------------------------------------------------


def bench_fanout(work: Path, clients: int = 1000, steps: int = 150) -> str:
    raise_fd_limit()
    model = tiny_model(work)
    with server(work / "fanout") as (url, process):
        host, port = url.removeprefix("http://").split(":")
        job_id = start_job(url, job_request(model, max_steps=steps, project_name="fanout"))
        counts: list[int] = []
        arrivals: list[tuple[bytes, float]] = []  # parsed after the run: the clients share one core
        peak = [0.0]

        def on_event(event_id: int, kind: bytes, data: bytes, received: float) -> None:
            if kind == b"progress":
                arrivals.append((data, received))

        async def all_clients() -> None:
            tasks = [sse_client(host, int(port), f"/train/stream/{job_id}", on_event) for _ in range(clients)]
            counts.extend(await asyncio.gather(*tasks))

        sampler = threading.Thread(target=lambda: _sample_rss(process.pid, peak, lambda: len(counts) == clients), daemon=True)
        sampler.start()
        asyncio.run(all_clients())
        total = len(httpx.get(f"{url}/train/stream/{job_id}", timeout=60).text.split("\n\n")) - 1
    complete = sum(1 for c in counts if c == total)
    latencies = [(received - json.loads(data)["timestamp"]) * 1000 for data, received in arrivals]
    p99 = percentile(latencies, 99)
    return table(f"Fan-out: {clients} stream clients on one training job ({steps} steps), one server process", [
        ("clients that received every event", f"{complete} / {clients} ({total} events each)", "all", verdict(complete == clients)),
        ("delivery latency p50", f"{percentile(latencies, 50):.1f} ms", "", ""),
        ("delivery latency p99", f"{p99:.1f} ms", "< 250 ms", verdict(p99 < 250)),
        ("server resident memory, peak", f"{peak[0]:.0f} MB", "", ""),
    ])


def _sample_rss(pid: int, peak: list[float], done: Callable[[], bool]) -> None:
    while not done():
        try:
            peak[0] = max(peak[0], rss_mb(pid))
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.05)


# -- 4. polling ------------------------------------------------------------------


def bench_polling(work: Path, seconds: int = 10) -> str:
    """wrk at 8 connections (enough to keep one server process busy all the time) for
    the budget, and at 32 for comparison: past saturation, more connections only add
    queueing (Little's law: mean latency = connections / throughput)."""
    wrk = shutil.which("wrk")
    if wrk is None:
        return "### Polling\n\nskipped: wrk is not installed (apt-get install wrk)\n"
    model = tiny_model(work)
    rows = []
    with server(work / "polling") as (url, _):
        job_id = start_job(url, job_request(model, max_steps=1))
        follow(url, job_id, lambda *a: None)
        target = f"{url}/train/status/{job_id}"
        subprocess.run([wrk, "-t1", "-c8", "-d2s", target], check=True, capture_output=True)  # warm-up
        for connections in (8, 32):
            output = subprocess.run([wrk, "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", target],
                                    check=True, capture_output=True, text=True).stdout
            rps = float(next(line.split()[1] for line in output.splitlines() if line.startswith("Requests/sec")))
            p99 = _ms(next(line.split()[1] for line in output.splitlines() if line.strip().startswith("99%")))
            budget = connections == 8
            rows.append((f"{connections} connections: requests per second", f"{rps:,.0f}", ">= 2,000" if budget else "",
                         verdict(rps >= 2000) if budget else ""))
            rows.append((f"{connections} connections: latency p99", f"{p99:.2f} ms", "< 10 ms" if budget else "",
                         verdict(p99 < 10) if budget else ""))
    return table(f"Polling: GET /train/status/{{id}} at saturation (wrk, 1 thread, {seconds} s per run)", rows)


def _ms(text: str) -> float:
    for unit, scale in (("us", 0.001), ("ms", 1.0), ("s", 1000.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    return float(text)


# -- 5. footprint ----------------------------------------------------------------


def bench_footprint(work: Path, clients: int = 100) -> str:
    raise_fd_limit()
    starts = []
    for attempt in range(9):
        started = time.monotonic()
        local = LocalServer(work / f"footprint-{attempt}").start(poll_interval=0.002)
        starts.append(time.monotonic() - started)
        time.sleep(0.5)
        assert local.process is not None
        idle = rss_mb(local.process.pid)
        heavy = [m for m in ("torch", "transformers") if f"/{m}/" in Path(f"/proc/{local.process.pid}/maps").read_text()]
        local.stop()
    model = tiny_model(work)
    with server(work / "footprint-stream") as (url, process):
        host, port = url.removeprefix("http://").split(":")
        job_id = start_job(url, job_request(model, max_steps=100))
        peak = [0.0]
        finished = [False]
        sampler = threading.Thread(target=lambda: _sample_rss(process.pid, peak, lambda: finished[0]), daemon=True)
        sampler.start()

        async def all_clients() -> None:
            await asyncio.gather(*[sse_client(host, int(port), f"/train/stream/{job_id}", lambda *a: None) for _ in range(clients)])

        asyncio.run(all_clients())
        finished[0] = True
    cold = median(starts)
    return table("Server footprint", [
        ("cold start to first /health answer, median of 9", f"{cold * 1000:.0f} ms", "< 1 s", verdict(cold < 1)),
        ("resident memory, idle", f"{idle:.0f} MB", "< 120 MB", verdict(idle < 120)),
        (f"resident memory, streaming a training job to {clients} clients (peak)", f"{peak[0]:.0f} MB", "< 200 MB", verdict(peak[0] < 200)),
        ("torch or transformers mapped into the server", ", ".join(heavy) or "neither", "neither", verdict(not heavy)),
    ])


# -- 6. replay -------------------------------------------------------------------


def make_event_log(data_dir: Path, events: int) -> str:
    """A finished job with `events` progress events, written through the store."""
    code = f"""
from pathlib import Path
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobStore
data = Path({str(data_dir)!r})
service = JobService(JobStore(data / "studio.db"), data / "jobs")
job = service.create_job({{}}, "q", {{}})
for phase in ("loading_model", "loading_dataset", "configuring", "training"):
    service.transition(job.id, phase, phase)
p = {{"step": 0, "total_steps": {events}, "loss": 2.5, "learning_rate": 1e-4, "progress_percent": 0.0, "epoch": 0.1,
     "elapsed_seconds": 1.0, "eta_seconds": 2.0, "grad_norm": 0.5, "num_tokens": 1000, "timestamp": 1.0}}
for step in range(1, {events} + 1):
    p["step"] = step
    service.record_progress(job.id, p)
service.transition(job.id, "completed", "done")
print(job.id)
"""
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def bench_replay(work: Path, sizes: tuple[int, ...] = (10_000, 100_000)) -> str:
    rows = []
    for size in sizes:
        data_dir = work / f"replay-{size}"
        job_id = make_event_log(data_dir, size)
        with server(data_dir) as (url, process):
            idle = rss_mb(process.pid)
            peak = [0.0]
            finished = [False]
            threading.Thread(target=lambda: _sample_rss(process.pid, peak, lambda: finished[0]), daemon=True).start()
            started = time.monotonic()
            count = follow(url, job_id, lambda *a: None)
            elapsed = time.monotonic() - started
            finished[0] = True
        rate = count / elapsed
        rows.append((f"{size:,} events: replay rate from event 0", f"{rate:,.0f} events/s", "> 50,000/s", verdict(rate > 50_000)))
        rows.append((f"{size:,} events: server memory idle -> peak during replay", f"{idle:.0f} -> {peak[0]:.0f} MB", "flat", ""))
    return table("Replay of a long event log", rows)


# -- 7. throughput ----------------------------------------------------------------


def bench_throughput(work: Path, steps: int = 12) -> str:
    sys.path.insert(0, str(BENCH_DIR.parent / "src"))
    from finetune_studio.cli.demo import find_smollm2_gguf, prepare_smollm2

    models = [("tiny Llama (hidden 64, 2 layers)", tiny_model(work), 256, steps * 10)]
    gguf = find_smollm2_gguf()
    if gguf is not None:
        models.append(("SmolLM2-135M-Instruct", prepare_smollm2(gguf, work / "models"), 256, steps))
    rows = []
    with server(work / "throughput") as (url, _):
        for name, model, length, n in models:
            for packing in (False, True):
                samples: list[dict] = []
                job_id = start_job(url, job_request(model, max_steps=n, packing=packing, max_seq_length=length, batch_size=4))
                follow(url, job_id, lambda i, k, d, t: samples.append(json.loads(d)) if k == b"progress" else None)
                # Skip the first steps (warm-up), then tokens per second of wall time.
                first, last = samples[len(samples) // 4], samples[-1]
                rate = (last["num_tokens"] - first["num_tokens"]) / (last["elapsed_seconds"] - first["elapsed_seconds"])
                rows.append((f"{name}, packing={packing}", f"{rate:,.0f} tokens/s", "", ""))
    return table("Training throughput on this machine's CPU (batch 4, max_seq_length 256)", rows)


BENCHMARKS = {
    "overhead": bench_overhead,
    "latency": bench_latency,
    "fanout": bench_fanout,
    "polling": bench_polling,
    "footprint": bench_footprint,
    "replay": bench_replay,
    "throughput": bench_throughput,
}


def main() -> None:
    chosen = sys.argv[1:] or list(BENCHMARKS)
    unknown = [name for name in chosen if name not in BENCHMARKS]
    if unknown:
        sys.exit(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}\n")
    with tempfile.TemporaryDirectory(prefix="finetune-studio-bench-") as tmp:
        for name in chosen:
            started = time.monotonic()
            print(BENCHMARKS[name](Path(tmp)), flush=True)
            print(f"({name}: {time.monotonic() - started:.0f} s)\n", flush=True)


if __name__ == "__main__":
    main()
