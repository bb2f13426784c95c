"""`finetune-studio sweep FILE.json [--detach]`: create a sweep (POST /sweeps) and follow it with
a live table of its trials (rich), then print the best trial.

Exit status: 0 the sweep completed; 1 it ended stopped or error; 2 the file could not be read,
or the server refused the sweep (its reason and field are printed).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from finetune_studio.cli.client import StudioClient, StudioError
from finetune_studio.cli.follow import EXIT_COMPLETED, EXIT_FAILED, EXIT_REFUSED

POLL_SECONDS = 1.0
ENDED = ("completed", "stopped", "error")


def trials_table(sweep: dict[str, Any]) -> Table:
    """The sweep's trials, one row each; the best marked with a star."""
    best = (sweep.get("best") or {}).get("number")
    table = Table(title=f"sweep {sweep['sweep_id']}: {sweep['status']} ({sweep['counted']}/{sweep['trials_planned']} trials)")
    for column in ("#", "job", "state", "params", sweep["objective"]["metric"]):
        table.add_column(column)
    for trial in sweep["trials"]:
        value = "" if trial.get("value") is None else f"{trial['value']:.6g}"
        params = ", ".join(f"{name}={value!r}" for name, value in trial["params"].items())
        mark = " *" if trial["number"] == best else ""
        state = trial["state"] + (" (queued again)" if trial.get("requeued") else "")
        table.add_row(f"{trial['number']}{mark}", trial["job_id"], state, params, value)
    return table


def run_sweep(client: StudioClient, file: Path, out: TextIO, *, detach: bool, as_json: bool) -> int:
    try:
        body = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"error: {file}: {exc}", file=out)
        return EXIT_REFUSED
    try:
        sweep_id = client.start_sweep(body)
    except StudioError as exc:
        print(f"error: the sweep was not created: {exc}", file=out)
        return EXIT_REFUSED
    if detach:
        print(json.dumps({"sweep_id": sweep_id}) if as_json else sweep_id, file=out)
        return EXIT_COMPLETED
    console = Console(file=out)
    sweep = client.sweep(sweep_id)
    if as_json:
        while sweep["status"] not in ENDED:
            time.sleep(POLL_SECONDS)
            sweep = client.sweep(sweep_id)
        print(json.dumps(sweep), file=out)
    else:
        with Live(trials_table(sweep), console=console, refresh_per_second=2, transient=False) as live:
            while sweep["status"] not in ENDED:
                time.sleep(POLL_SECONDS)
                sweep = client.sweep(sweep_id)
                live.update(trials_table(sweep))
        best = sweep.get("best")
        if best:
            console.print(f"best: trial {best['number']} (job {best['job_id']}), {sweep['objective']['metric']}"
                          f" {best['value']:.6g} with {best['params']}")
        if sweep.get("error"):
            console.print(f"error: {sweep['error']}")
    return EXIT_COMPLETED if sweep["status"] == "completed" else EXIT_FAILED
