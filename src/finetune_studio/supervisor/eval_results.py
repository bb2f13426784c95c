"""A finished evaluation's results, taken into the database before its `completed` status.

The evaluation child writes the results table (`results.json`) and its per-sample rows
(`samples.jsonl`, one JSON object a line) into its folder, each whole (atomic.py), then
reports `completed`. The supervisor hands that status here first: the files are read and
checked off the event loop (they are the child's, so untrusted: each row is validated, and
sizes are bounded), kept in SQLite in one transaction (`JobStore.save_eval_results`, migration
5), and only then is the status written. Files that cannot be read end the evaluation
`error` instead, saying why; a status never says `completed` without its results kept.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from finetune_studio.jobs.store import JobStore
from finetune_studio.schemas import EvalResults, EvalSampleRow
from finetune_studio.wire import EVAL_RESULTS_FILE, EVAL_SAMPLES_FILE

MAX_RESULTS_BYTES = 16 * 1024 * 1024
MAX_SAMPLES_BYTES = 1024 * 1024 * 1024
MAX_SAMPLE_LINE = 4 * 1024 * 1024


class ResultsUnreadable(Exception):
    """The child's results cannot be kept: the text says which file and why."""


async def keep(store: JobStore, eval_id: str, folder: Path, message: dict[str, Any]) -> dict[str, Any]:
    """The `completed` status to write once the results are kept, or an `error` status saying why they could not be."""
    details = dict(message.get("details") or {})
    try:
        results, rows = await asyncio.to_thread(read_results, folder, eval_id)
    except ResultsUnreadable as exc:
        return {
            "type": "status",
            "phase": "error",
            "message": "Evaluation failed",
            "error": f"The evaluation finished, but its results could not be kept: {exc}",
            "details": {**details, "error_code": "internal_error"},
        }
    kept = store.save_eval_results(eval_id, results, rows)
    details.update(metrics=len(results["metrics"]), samples=kept, results_url=f"/eval/results/{eval_id}")
    return {**message, "details": details}


def read_results(folder: Path, eval_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The results table and the per-sample rows the child left in `folder`, checked."""
    results_path, samples_path = folder / EVAL_RESULTS_FILE, folder / EVAL_SAMPLES_FILE
    try:
        if results_path.stat().st_size > MAX_RESULTS_BYTES:
            raise ResultsUnreadable(f"{results_path} is over {MAX_RESULTS_BYTES // (1024 * 1024)} MiB")
        raw = json.loads(results_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ResultsUnreadable(f"{results_path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ResultsUnreadable(f"{results_path} holds no JSON object")
    try:
        results = EvalResults.model_validate(
            {**raw, "eval_id": eval_id, "samples_url": f"/eval/results/{eval_id}/samples"}
        ).model_dump(mode="json")
    except ValidationError as exc:
        raise ResultsUnreadable(f"{results_path} is not an evaluation's results ({exc.errors()[0]['msg']})") from None
    rows: list[dict[str, Any]] = []
    try:
        if samples_path.stat().st_size > MAX_SAMPLES_BYTES:
            raise ResultsUnreadable(f"{samples_path} is over {MAX_SAMPLES_BYTES // (1024 * 1024)} MiB")
        with open(samples_path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if len(line) > MAX_SAMPLE_LINE:
                    raise ResultsUnreadable(f"{samples_path}, line {number}: over {MAX_SAMPLE_LINE // (1024 * 1024)} MiB")
                if line.strip():
                    rows.append(EvalSampleRow.model_validate_json(line).model_dump(mode="json", exclude_none=True))
    except FileNotFoundError:
        pass  # a suite without per-sample rows
    except (OSError, ValueError) as exc:  # ValidationError is a ValueError
        raise ResultsUnreadable(f"{samples_path}: {str(exc).splitlines()[0]}") from None
    return results, rows
