"""The stack's cost (issue 30): the overhead and fan-out rows with 3 webhooks registered and
`/metrics` scraped every second, against the same rows without them.

    .venv/bin/python bench/stack.py                 # 3 alternating rounds (about 6 minutes)
    .venv/bin/python bench/stack.py --rounds 1 --clients 200

Each round runs both setups, in an order that reverses every round, each on a fresh
`finetune-studio serve` (its own data dir):

- **plain**: nothing registered, nobody scraping;
- **with the stack**: 3 webhooks registered for every event (`studio.job.phase` among them,
  so each job's every status change is delivered three times, signed) to a receiver on
  127.0.0.1 that answers 204, and a scraper that GETs `/metrics` every second throughout.
  The receiver and the scraper are processes of their own, as they would be on other
  machines: in the bench's own process they would share the GIL with its stream clients
  and slow the clients, not the server.

In each: the overhead row's job (a 200-step LoRA run on the tiny model, POST to its terminal
event, as bench/run.py's `overhead`) and the fan-out row (`--clients` stream clients on a
150-step job: the job's wall time, every client's every event, delivery latency p50 and
p99, as bench/run.py's `fanout`).

Budget (issue 30): each row with the stack >= 0.97 of the same row without, on medians of
the rounds: for a time, plain / with the stack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    # noqa: E402,
    job_request,
    load_average,
    machine_line,
    median,
    percentile,
    raise_fd_limit,
    server,
    sse_client,
    start_job,
    table,
    tiny_model,
    verdict,
)
from finetune_studio.jobs.webhooks import EVENTS  # noqa: E402

BUDGET = 0.97
WEBHOOKS = 3


# The receiver's and the scraper's processes (spawned: nothing of the bench's own state).
SPAWN = multiprocessing.get_context("spawn")


def receive(port: Any, received: Any) -> None:
    """The receiver's process: answer every POST 204, counting them in `received`; the
    port it listens on is put in `port` (a queue)."""

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("content-length") or 0))
            with received.get_lock():
                received.value += 1
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    port.put(httpd.server_address[1])
    httpd.serve_forever()


def scrape(url: str, stop: Any, scrapes: Any) -> None:
    """The scraper's process: GET /metrics every second until `stop` is set."""
    with httpx.Client(timeout=10) as http:
        while not stop.wait(1.0):
            if http.get(f"{url}/metrics").status_code == 200:
                scrapes.value += 1


def job_wall(url: str, model: Path, steps: int) -> float:
    host, port = url.removeprefix("http://").split(":")
    started = time.monotonic()
    job_id = start_job(url, job_request(model, max_steps=steps, compile=False))
    final: dict[str, Any] = {}
    asyncio.run(sse_client(host, int(port), f"/train/stream/{job_id}",
                           lambda i, k, d, t: final.update(json.loads(d)) if k == b"status" else None))
    assert final.get("phase") == "completed", final
    return time.monotonic() - started


def fanout(url: str, model: Path, clients: int, steps: int) -> dict[str, float]:
    host, port = url.removeprefix("http://").split(":")
    started = time.monotonic()
    job_id = start_job(url, job_request(model, max_steps=steps, project_name="fanout", compile=False))
    arrivals: list[tuple[bytes, float]] = []

    def on_event(event_id: int, kind: bytes, data: bytes, received: float) -> None:
        if kind == b"progress":
            arrivals.append((data, received))

    async def all_clients() -> list[int]:
        return list(await asyncio.gather(*(sse_client(host, int(port), f"/train/stream/{job_id}", on_event) for _ in range(clients))))

    counts = asyncio.run(all_clients())
    wall = time.monotonic() - started
    total = len(httpx.get(f"{url}/train/stream/{job_id}", timeout=60).text.split("\n\n")) - 1
    latencies = [(received - json.loads(data)["timestamp"]) * 1000 for data, received in arrivals]
    return {"wall": wall, "complete": sum(1 for c in counts if c == total) / clients,
            "p50": percentile(latencies, 50), "p99": percentile(latencies, 99)}


def one_setup(work: Path, model: Path, stack: bool, receiver_url: str, args: argparse.Namespace) -> dict[str, float]:
    with server(work) as (url, _):
        stop = SPAWN.Event()
        scrapes = SPAWN.Value("i", 0)
        scraper = None
        if stack:
            for _ in range(WEBHOOKS):
                answer = httpx.post(f"{url}/webhooks", json={"url": receiver_url, "events": sorted(EVENTS)}, timeout=30)
                answer.raise_for_status()
            scraper = SPAWN.Process(target=scrape, args=(url, stop, scrapes), daemon=True)
            scraper.start()
        try:
            found = {"job": job_wall(url, model, args.steps)}
            found.update({f"fanout_{k}": v for k, v in fanout(url, model, args.clients, args.fanout_steps).items()})
        finally:
            stop.set()
            if scraper is not None:
                scraper.join(30)
        found["scrapes"] = scrapes.value
        return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="steps of the overhead row's job (default 200)")
    parser.add_argument("--clients", type=int, default=1000, help="stream clients of the fan-out row (default 1000)")
    parser.add_argument("--fanout-steps", type=int, default=150)
    args = parser.parse_args()
    raise_fd_limit()
    print(machine_line())
    print(load_average("before") + "\n", flush=True)
    received = SPAWN.Value("i", 0)
    port = SPAWN.Queue()
    receiver = SPAWN.Process(target=receive, args=(port, received), daemon=True)
    receiver.start()
    receiver_url = f"http://127.0.0.1:{port.get(timeout=60)}/hook"
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="finetune-studio-bench-stack-") as tmp:
        work = Path(tmp)
        model = tiny_model(work)
        for round_ in range(args.rounds):
            for stack in ([False, True] if round_ % 2 == 0 else [True, False]):
                before = received.value
                found = one_setup(work / f"r{round_}-{'stack' if stack else 'plain'}", model, stack, receiver_url, args)
                found["deliveries"] = received.value - before
                results[stack].append(found)
                print(f"  round {round_ + 1}, {'with the stack' if stack else 'plain'}: {found}", flush=True)
    receiver.terminate()
    receiver.join(30)

    def med(stack: bool, key: str) -> float:
        return median([r[key] for r in results[stack]])

    rows: list[tuple[str, str, str, str]] = []
    for key, label in (("job", f"overhead row: {args.steps}-step job, POST to terminal event"),
                       ("fanout_wall", f"fan-out row: {args.fanout_steps}-step job with {args.clients} clients, wall time"),
                       ("fanout_p50", "fan-out row: delivery latency p50"),
                       ("fanout_p99", "fan-out row: delivery latency p99")):
        plain, stacked = med(False, key), med(True, key)
        unit = "s" if key in ("job", "fanout_wall") else "ms"
        ratio = plain / stacked
        budget = key in ("job", "fanout_wall")
        rows.append((f"{label}: plain / with the stack ({plain:,.2f} / {stacked:,.2f} {unit})", f"{ratio:.3f}",
                     f">= {BUDGET}" if budget else "", verdict(ratio >= BUDGET) if budget else "reported"))
    for key, label in (("job", "overhead row"), ("fanout_wall", "fan-out row")):
        own = [plain[key] / stacked[key] for plain, stacked in zip(results[False], results[True], strict=True)]
        rows.append((f"{label}: each round's own ratio, median (rounds: {', '.join(f'{r:.3f}' for r in own)})",
                     f"{median(own):.3f}", "", "reported"))
    rows.append(("fan-out: clients that received every event, plain / with the stack",
                 f"{med(False, 'fanout_complete'):.0%} / {med(True, 'fanout_complete'):.0%}", "all", verdict(
                     med(False, "fanout_complete") == med(True, "fanout_complete") == 1)))
    rows.append(("with the stack: webhook deliveries received per setup, /metrics scrapes per setup",
                 f"{med(True, 'deliveries'):.0f}, {med(True, 'scrapes'):.0f}", "", ""))
    print(table(f"The stack's cost: {WEBHOOKS} webhooks and /metrics every second ({args.rounds} alternating rounds, medians)", rows))
    print(load_average("after"))


if __name__ == "__main__":
    main()
