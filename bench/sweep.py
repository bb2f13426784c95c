"""A sweep's own overhead (issue 29): the time between its trials, against the trials' own.

    .venv/bin/python bench/sweep.py                 # 6 TPE trials on the tiny model, max_parallel 1
    .venv/bin/python bench/sweep.py --trials 4 --steps 20

A real `finetune-studio serve` runs a sweep of `--trials` trials (TPE over the learning rate,
objective `eval_loss`, `max_parallel: 1`) of a LoRA job on the tiny model, each `--steps`
steps with evaluations. Once it has ended, the times come from the server's own SQLite files,
read-only: each event's `created_at` and the sweep's, in the job store (jobs.db).

- A trial's wall time: from its job's first event (`idle`, queued) to its terminal event.
- The sweep's overhead: from the sweep's creation to its first trial's `idle` (the first
  ask), each gap from a trial's terminal event to the next trial's `idle` (the tell of one,
  the ask of the next), and from the last trial's end to the sweep's terminal status (the
  last tell).

Budget (issue 29): overhead < 1% of the trials' wall time.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEMO_DATA, job_request, load_average, machine_line, server, table, tiny_model, verdict  # noqa: E402
from finetune_studio.wire import DataDir  # noqa: E402

BUDGET = 0.01


def read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--steps", type=int, default=30, help="steps per trial (default 30)")
    args = parser.parse_args()
    print(machine_line())
    print(load_average("before") + "\n", flush=True)
    with tempfile.TemporaryDirectory(prefix="finetune-studio-bench-sweep-") as tmp:
        work = Path(tmp)
        model = tiny_model(work)
        data = DataDir(work / "data")
        request = job_request(model, max_steps=args.steps, local_eval_datasets=[str(DEMO_DATA)], eval_steps=0.25,
                              compile=False)
        body = {"request": request, "space": {"learning_rate": {"type": "float", "low": 1e-5, "high": 5e-2, "log": True}},
                "objective": {"metric": "eval_loss", "direction": "minimize"}, "trials": args.trials, "sampler": "tpe",
                "seed": 3, "max_parallel": 1}
        with server(data.root) as (url, _), httpx.Client(base_url=url, timeout=60) as http:
            created = http.post("/sweeps", json=body)
            if created.status_code != 200:
                sys.exit(f"POST /sweeps answered {created.status_code}: {created.text}")
            sweep_id = created.json()["sweep_id"]
            while (final := http.get(f"/sweeps/{sweep_id}").json())["status"] not in ("completed", "stopped", "error"):
                time.sleep(1)
        if final["status"] != "completed":
            sys.exit(f"the sweep ended {final['status']}: {final.get('message')}")
        jobs = read_only(data.db)
        sweeps = jobs
        (sweep_created,) = sweeps.execute("SELECT created_at FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
        sweep_end = None
        for data_json, at in sweeps.execute("SELECT data, created_at FROM sweep_events WHERE sweep_id = ? AND kind = 'status'"
                                            " ORDER BY id", (sweep_id,)):
            if json.loads(data_json).get("status") in ("completed", "stopped", "error"):
                sweep_end = at
                break
        spans: list[tuple[float, float]] = []
        for trial in sorted(final["trials"], key=lambda t: t["number"]):
            times = [at for (at,) in jobs.execute("SELECT created_at FROM events WHERE job_id = ? ORDER BY id", (trial["job_id"],))]
            spans.append((times[0], times[-1]))
    assert sweep_end is not None, "the sweep's terminal status has no event"
    trials_wall = sum(end - begin for begin, end in spans)
    first_ask = spans[0][0] - sweep_created
    gaps = [spans[k + 1][0] - spans[k][1] for k in range(len(spans) - 1)]
    last_tell = sweep_end - spans[-1][1]
    overhead = first_ask + sum(gaps) + last_tell
    share = overhead / trials_wall
    rows = [
        (f"{args.trials} trials' wall time, idle to terminal event (sum)", f"{trials_wall:,.1f} s", "", ""),
        ("sweep created to the first trial's idle (the first ask)", f"{first_ask * 1000:,.0f} ms", "", ""),
        ("a trial's end to the next trial's idle (tell + ask), median / max",
         f"{sorted(gaps)[len(gaps) // 2] * 1000:,.0f} / {max(gaps) * 1000:,.0f} ms" if gaps else "-", "", ""),
        ("the last trial's end to the sweep's end (the last tell)", f"{last_tell * 1000:,.0f} ms", "", ""),
        ("overhead in all", f"{overhead * 1000:,.0f} ms", "", ""),
        ("overhead / trials' wall time", f"{share:.2%}", f"< {BUDGET:.0%}", verdict(share < BUDGET)),
    ]
    print(table(f"Sweep overhead: {args.trials} TPE trials of {args.steps} steps on the tiny model, max_parallel 1", rows))
    print(load_average("after"))


if __name__ == "__main__":
    main()
