"""Sweep trials side by side on a Ray cluster (issue 29): `max_parallel: 2` against `max_parallel: 1`.

    .venv/bin/python bench/sweep_ray.py                 # 6 trials of 30 steps, each way
    .venv/bin/python bench/sweep_ray.py --trials 2 --steps 4

Starts a one-node Ray cluster on 127.0.0.1 with 2 CPUs (ray_bench.py's; stopped by process
group at the end), then runs the same sweep twice, each through a real `finetune-studio
serve` of its own on that cluster: `--trials` trials (random sampler over the learning rate,
one seed, objective `train_loss`) of a LoRA job on the tiny model, each trial one Ray worker
of one CPU, so that the cluster holds two at once; first with `max_parallel: 1`, then 2.
The times come from the servers' own job stores once the sweeps ended, read-only: each event's
`created_at` (jobs.db) and the sweep's.

- sweep wall: from the sweep's creation to its terminal status;
- trials' wall (sum): each trial from its job's first event (`idle`) to its terminal event;
- on the cluster at once (max): the most trials at one instant between their worker's first
  status (`loading_dataset`: Ray placed it) and their end, as tests/integration/test_sweeps_ray.py
  measures side by side;
- speed-up: max_parallel 1's sweep wall over max_parallel 2's.

On 2 CPUs the two trials of a pair share the machine's cores with the server, the Ray
processes and each other, so the speed-up is well under 2; what it shows is the overlap.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import job_request, load_average, machine_line, server, table, tiny_model  # noqa: E402
from bench.ray_bench import start_cluster  # noqa: E402

from finetune_studio.wire import DataDir  # noqa: E402

ENDED = ("completed", "stopped", "error")


def read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def run_sweep(workdir: Path, address: str, model: Path, args: argparse.Namespace, parallel: int) -> dict[str, Any]:
    """One sweep on its own server using the cluster, to its end; its times from the server's store."""
    data = DataDir(workdir / f"parallel-{parallel}")
    request = job_request(model, max_steps=args.steps, num_workers=1, resources_per_worker={"CPU": 1}, compile=False)
    body = {"request": request, "space": {"learning_rate": {"type": "float", "low": 1e-5, "high": 5e-2, "log": True}},
            "objective": {"metric": "train_loss"}, "trials": args.trials, "sampler": "random", "seed": 3,
            "max_parallel": parallel}
    with server(data.root, env={"FINETUNE_STUDIO_RAY_ADDRESS": address}) as (url, _), \
            httpx.Client(base_url=url, timeout=60) as http:
        created = http.post("/sweeps", json=body)
        if created.status_code != 200:
            sys.exit(f"POST /sweeps answered {created.status_code}: {created.text}")
        sweep_id = created.json()["sweep_id"]
        while (final := http.get(f"/sweeps/{sweep_id}").json())["status"] not in ENDED:
            time.sleep(1)
    if final["status"] != "completed":
        sys.exit(f"the sweep with max_parallel {parallel} ended {final['status']}: {final.get('message')} {final.get('error')}")
    store = read_only(data.db)
    (created_at,) = store.execute("SELECT created_at FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
    ended_at = None
    for data_json, at in store.execute("SELECT data, created_at FROM sweep_events WHERE sweep_id = ? AND kind = 'status'"
                                       " ORDER BY id", (sweep_id,)):
        if json.loads(data_json).get("status") in ENDED:
            ended_at = at
            break
    assert ended_at is not None, "the sweep's terminal status has no event"
    walls, placed = [], []
    for trial in final["trials"]:
        rows = store.execute("SELECT kind, data, created_at FROM events WHERE job_id = ? ORDER BY id",
                             (trial["job_id"],)).fetchall()
        walls.append(rows[-1][2] - rows[0][2])
        worker = next(at for kind, data, at in rows if kind == "status" and json.loads(data)["phase"] == "loading_dataset")
        placed.append((worker, rows[-1][2]))
    store.close()
    return {"wall": ended_at - created_at, "trials": sum(walls), "at_once": most_at_once(placed)}


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most intervals that hold one instant (a sweep over their starts and ends)."""
    edges = sorted([(begin, 1) for begin, _ in spans] + [(end, -1) for _, end in spans], key=lambda e: (e[0], e[1]))
    now = most = 0
    for _, change in edges:
        now += change
        most = max(most, now)
    return most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--steps", type=int, default=30, help="steps per trial (default 30)")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    print(machine_line())
    print(load_average("before") + "\n", flush=True)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-sweep-ray-"))
    model = tiny_model(workdir)
    temp = Path(tempfile.mkdtemp(prefix="bs", dir="/tmp"))  # short: Ray's socket paths
    address, cluster = start_cluster(temp)
    try:
        results = {parallel: run_sweep(workdir, address, model, args, parallel) for parallel in (1, 2)}
    finally:
        os.killpg(cluster.pid, signal.SIGTERM)
        cluster.wait(60)
        shutil.rmtree(temp, ignore_errors=True)
    one, two = results[1], results[2]
    rows: list[tuple[str, str, str, str]] = []
    for parallel, r in results.items():
        rows += [(f"max_parallel {parallel}: sweep wall", f"{r['wall']:,.1f} s", "", ""),
                 (f"max_parallel {parallel}: trials' wall (sum)", f"{r['trials']:,.1f} s", "", ""),
                 (f"max_parallel {parallel}: trials on the cluster at once (max)", str(r["at_once"]), "", "")]
    rows.append(("speed-up: max_parallel 1's sweep wall / max_parallel 2's", f"{one['wall'] / two['wall']:.2f}x", "", ""))
    print(table(f"A {args.trials}-trial sweep of {args.steps} steps on the tiny model, 1 Ray worker of 1 CPU each,"
                f" on a 2-CPU Ray cluster", rows))
    print(load_average("after"))


if __name__ == "__main__":
    main()
