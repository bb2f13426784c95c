"""eval_after's evaluation as a training job's status shows it (docs/API.md, Evaluation):
joined when the status is read, never written to the job's (closed) stream.

A training job with `eval_after` gets, on its completing status, `details.eval_id`: the
evaluation queued to compare it (the first model) with its base (`base:<job id>`). Each
read of the job's status then adds `details.eval`:

- `summary`: the evaluation's phase and message and, once it has completed, each metric's
  values and differences (at most `SUMMARY_METRICS` of them);
- `guard` (with `eval_guard`): `{metric, max_drop, state, drop, warning}`, `state` being
  `pending` (not finished yet), `passed`, `failed` (the fine-tuned model falls behind its
  base by more than `max_drop`; the warning says by how much, and is added to
  `details.warnings`: the run does not fail) or `unavailable` (the evaluation did not
  complete, or has no such metric).

How far behind: for a metric both models have, the base's value minus the fine-tuned
model's where higher is better (the fine-tuned's minus the base's where lower is); for a
metric of a comparison with the first model (the judge's: only the base has a value, its
rate against the fine-tuned model), the base's value (its negative where lower is better).

Plain Python over the store: the server's side and nothing else reads it.
"""

from __future__ import annotations

from typing import Any, Optional

from finetune_studio.errors import JobNotFound
from finetune_studio.jobs.store import JobRecord, JobStore

SUMMARY_METRICS = 24


def eval_join(store: JobStore, job: JobRecord, details: dict[str, Any]) -> dict[str, Any]:
    """`details` of a training job's status with its evaluation's summary and guard (`details.eval`)."""
    eval_id = str(details.get("eval_id"))
    guard_request = job.request.get("eval_guard")
    try:
        evaluation = store.get_job(eval_id, kind="eval")
    except JobNotFound:
        details["eval"] = {
            "eval_id": eval_id,
            "summary": None,
            "guard": _guard(guard_request, None, "the evaluation is no longer on this server"),
        }
        return details
    results = store.eval_results(eval_id) if evaluation.phase == "completed" else None
    summary: dict[str, Any] = {
        "phase": evaluation.phase,
        "message": evaluation.status.get("message"),
        "error": evaluation.status.get("error"),
    }
    if results is not None:
        summary["models"] = results.get("models")
        summary["metrics"] = [_brief(metric) for metric in results.get("metrics", [])[:SUMMARY_METRICS]]
    why = None
    if evaluation.phase in ("error", "stopped"):
        why = f"the evaluation ended {evaluation.phase}"
    guard = _guard(guard_request, results, why)
    details["eval"] = {"eval_id": eval_id, "summary": summary, "guard": guard}
    if guard is not None and guard.get("warning"):
        details["warnings"] = [*(details.get("warnings") or []), guard["warning"]]
    return details


def _brief(metric: dict[str, Any]) -> dict[str, Any]:
    return {key: metric.get(key) for key in ("name", "values", "deltas", "higher_is_better")}


def _guard(request: Any, results: Optional[dict[str, Any]], why_not: Optional[str]) -> Optional[dict[str, Any]]:
    if not isinstance(request, dict):
        return None
    name, max_drop = str(request.get("metric")), float(request.get("max_drop", 0.0))
    verdict: dict[str, Any] = {"metric": name, "max_drop": max_drop, "state": "pending", "drop": None, "warning": None}
    if results is None:
        if why_not is not None:
            verdict.update(state="unavailable", reason=why_not)
        return verdict
    metrics = {str(metric.get("name")): metric for metric in results.get("metrics", [])}
    models = list(results.get("models") or [])
    metric = metrics.get(name)
    if metric is None or len(models) < 2:
        have = ", ".join(sorted(metrics)) or "none"
        verdict.update(state="unavailable", reason=f"the evaluation has no metric {name!r} (its metrics: {have})")
        return verdict
    drop = guard_drop(metric, models[0], models[1])
    if drop is None:
        verdict.update(state="unavailable", reason=f"{name} has no value for the fine-tuned model and its base")
        return verdict
    verdict["drop"] = round(drop, 6)
    if drop > max_drop:
        verdict["state"] = "failed"
        verdict["warning"] = (
            f"eval_guard: the fine-tuned model falls behind its base on {name} by {drop:.4g}, more than max_drop"
            f" {max_drop:g} ({_values(metric, models)}); GET /eval/results/{results.get('eval_id')} has the details"
        )
    else:
        verdict["state"] = "passed"
    return verdict


def guard_drop(metric: dict[str, Any], tuned: str, base: str) -> Optional[float]:
    """How far the fine-tuned model (`tuned`) falls behind `base` on `metric` (see the module's docstring)."""
    values = metric.get("values") or {}
    higher = bool(metric.get("higher_is_better", True))
    tuned_value, base_value = values.get(tuned), values.get(base)
    if base_value is None:
        return None
    if tuned_value is None:  # a comparison with the first model: the base's own rate against it
        return float(base_value) if higher else -float(base_value)
    difference = float(base_value) - float(tuned_value)
    return difference if higher else -difference


def _values(metric: dict[str, Any], models: list[str]) -> str:
    values = metric.get("values") or {}
    return ", ".join(f"{model}: {values.get(model) if values.get(model) is None else format(values[model], '.4g')}" for model in models[:2])
