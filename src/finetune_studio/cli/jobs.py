"""`finetune-studio jobs`, `status ID` and `stop ID`: the server's jobs, as a table, lines or JSON.

The renderers take the console they print to, so tests compare exact text; a
terminal gets a rich table, anything else tab-separated lines (one job a line,
for `cut` and `awk`), and --output-json the server's JSON as it came.
"""

from __future__ import annotations

import json
from typing import IO, Any, Optional

from rich.console import Console
from rich.table import Table
from rich.text import Text

from finetune_studio.cli.client import StudioClient
from finetune_studio.cli.follow import SAVED_KEYS
from finetune_studio.cli.progress import StatusLines, progress_line

JOB_COLUMNS = ("id", "phase", "model", "step", "message")


def step_of(progress: Optional[dict[str, Any]]) -> str:
    """'15/60' from the latest progress; '-' for a job that trained no step."""
    return "-" if progress is None else f"{progress['step']}/{progress['total_steps']}"


def has_trained(status: dict[str, Any]) -> bool:
    """Whether the job has a latest step to ask for: it is training, or it ended after training some steps."""
    return status["phase"] == "training" or bool((status.get("details") or {}).get("steps"))


def job_rows(client: StudioClient, statuses: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per job; the latest step is asked for only where there is one."""
    rows: list[tuple[str, ...]] = []
    for status in statuses:
        progress = client.progress(status["job_id"]) if has_trained(status) else None
        model = str((status.get("details") or {}).get("model_name") or "-")
        rows.append((str(status["job_id"]), str(status["phase"]), model, step_of(progress), str(status["message"])))
    return rows


def print_jobs(console: Console, rows: list[tuple[str, ...]]) -> None:
    if not console.is_terminal:
        # Written as they are: rich would expand the tabs that a script splits on.
        for row in [JOB_COLUMNS, *rows]:
            console.file.write("\t".join(cell.replace("\t", " ").replace("\n", " ") for cell in row) + "\n")
        console.file.flush()
        return
    table = Table(*JOB_COLUMNS)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    console.print(table)


def status_lines(status: dict[str, Any], progress: Optional[dict[str, Any]]) -> list[str]:
    """A job's status as the `status` command prints it."""
    details = status.get("details") or {}
    lines = [f"job {status['job_id']}", *("  " + line for line in StatusLines().lines(status))]
    if details.get("model_name"):
        lines.append(f"  model: {details['model_name']}")
    if progress is not None:
        lines.append(f"  {progress_line(progress)}")
    saved = next((details[key] for key in SAVED_KEYS if details.get(key)), None)
    if saved:
        lines.append(f"  saved in: {saved}")
    return lines


def run_jobs(client: StudioClient, out: IO[str], output_json: bool) -> int:
    statuses = client.jobs()
    if output_json:
        out.write(json.dumps(statuses) + "\n")
        return 0
    print_jobs(Console(file=out), job_rows(client, statuses))
    return 0


def run_status(client: StudioClient, job_id: str, out: IO[str], output_json: bool) -> int:
    status = client.status(job_id)
    progress = client.progress(job_id) if status["phase"] == "training" and not output_json else None
    return _show(status, progress, out, output_json)


def run_stop(client: StudioClient, job_id: str, out: IO[str], output_json: bool) -> int:
    return _show(client.stop(job_id), None, out, output_json)


def _show(status: dict[str, Any], progress: Optional[dict[str, Any]], out: IO[str], output_json: bool) -> int:
    """A job's status as one JSON line (--output-json) or as the lines `status_lines` makes."""
    if output_json:
        out.write(json.dumps(status) + "\n")
    else:
        for line in status_lines(status, progress):
            out.write(line + "\n")
    return 0
