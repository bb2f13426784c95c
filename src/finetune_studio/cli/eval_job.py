"""`finetune-studio eval JOB [--against base|JOB2 ...] [--data FILE] [--task NAME|--tasks-dir DIR]
[--judge MODEL --judge-prompts FILE]`: an evaluation run by the server, then its results table.

    eval_request(args)   the flags as a `POST /eval/start` body (pure; unit-tested)
    EvalLiveView         a terminal: phase lines above a rich bar of samples done
    EvalLinesView        a pipe or a log: the phase lines and a progress line now and then
    results_table(...)   the results as a rich table: each value with its 95% interval, each
                         difference from the first model with its own
    run_eval_job(args)   the command: find or start the server, queue, follow, print

JOB is the first model (a job id, `base:<job id>`, or any id GET /v1/models lists); each
--against adds one (`base`: JOB's base model), and every difference is against JOB. A server
is found or started as `finetune-studio train` does. Ctrl-C stops the evaluation; a second
Ctrl-C leaves it running.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Optional, Union

from rich.console import Console
from rich.progress import ProgressColumn
from rich.table import Table

from finetune_studio.cli.client import StudioClient, StudioError
from finetune_studio.cli.follow import (
    EXIT_COMPLETED,
    EXIT_FAILED,
    EXIT_LEFT_RUNNING,
    EXIT_REFUSED,
    Notes,
    follow_until_done,
    how_it_ended,
)
from finetune_studio.cli.progress import AnyView, BarView, JsonLinesView, LinesView, format_seconds, make_view
from finetune_studio.cli.train import Reached

BASE_PREFIX = "base:"  # schemas.BASE_MODEL_PREFIX, written out so that parsing the flags imports no pydantic


def _path(name: str) -> str:
    """A file named here, as the server reads it: absolute (the server's working folder is not ours)."""
    return str(Path(name).expanduser().resolve())


def eval_request(args: argparse.Namespace) -> dict[str, Any]:
    """The `POST /eval/start` body the flags ask for (StudioError when they name no suite)."""
    models = [args.job_id]
    for other in args.against or ["base"]:
        if other == "none":
            continue
        name = f"{BASE_PREFIX}{args.job_id}" if other == "base" else other
        if name not in models:
            models.append(name)
    suites: list[dict[str, Any]] = []
    if args.data:
        heldout: dict[str, Any] = {"type": "heldout", "data": [_path(name) for name in args.data], "format_type": args.format}
        if args.max_new_tokens is not None:
            heldout["max_new_tokens"] = args.max_new_tokens
        if args.limit is not None:
            heldout["limit"] = int(args.limit)
        suites.append(heldout)
    if args.task or args.tasks_dir:
        if not args.task:
            raise StudioError("--tasks-dir names where tasks are: name them with --task NAME (repeatable)")
        harness: dict[str, Any] = {"type": "lm_eval", "tasks": list(args.task)}
        if args.tasks_dir:
            harness["tasks_dir"] = _path(args.tasks_dir)
        if args.num_fewshot is not None:
            harness["num_fewshot"] = args.num_fewshot
        if args.limit is not None:
            harness["limit"] = args.limit
        suites.append(harness)
    if args.judge or args.judge_prompts:
        if not (args.judge and args.judge_prompts):
            raise StudioError("a judge needs both --judge MODEL and --judge-prompts FILE")
        judge: dict[str, Any] = {"model": args.judge}
        if args.judge_url:
            judge["base_url"] = args.judge_url
        if args.judge_key_env:
            judge["api_key_env"] = args.judge_key_env
        suite: dict[str, Any] = {"type": "judge", "prompts": _path(args.judge_prompts), "judge": judge}
        if args.max_new_tokens is not None:
            suite["max_new_tokens"] = args.max_new_tokens
        if args.limit is not None:
            suite["limit"] = int(args.limit)
        suites.append(suite)
    if not suites:
        raise StudioError("name what to evaluate on: --data FILE (held-out data), --task NAME (lm-eval), or --judge MODEL"
                          " --judge-prompts FILE")
    body: dict[str, Any] = {"models": models, "suites": suites}
    if args.label:
        body["label"] = args.label
    return body


class EvalLinesView(LinesView):
    """Plain lines: every status, and a progress line every `every_seconds` and at the last sample."""

    def line(self, progress: dict[str, Any]) -> str:
        """'samples 12/40  30.0%  heldout  base:abc  eta 00:12'."""
        where = "".join(f"  {part}" for part in (progress.get("suite"), progress.get("model")) if part)
        return f"samples {progress['step']}/{progress['total_steps']}{self.percent_and_eta(progress, before=where)}"


class EvalLiveView(BarView):
    """A terminal: phase lines scroll above one bar of samples done (over every suite and model)."""

    def columns(self) -> tuple[Union[str, ProgressColumn], ...]:
        return self.bar("{task.fields[where]}  eta {task.fields[eta]}")

    def update(self, progress: dict[str, Any]) -> None:
        where = " · ".join(str(part) for part in (progress.get("suite"), progress.get("model")) if part)
        self.move("samples", "evaluating", progress["step"], progress["total_steps"], where=where,
                  eta=format_seconds(progress.get("eta_seconds")))


def follow_eval(client: StudioClient, job_id: str, view: AnyView, notify: Callable[[str], None]) -> Optional[dict[str, Any]]:
    """Show the evaluation's events until it ends (see `follow_until_done`)."""
    return follow_until_done(client, job_id, view, notify, what="evaluation", prefix="/eval", stop=client.stop_eval)


def _number(value: Any) -> str:
    if value is None:
        return "-"
    value = float(value)
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"


def _interval(pair: Any) -> str:
    return f" [{_number(pair[0])}, {_number(pair[1])}]" if isinstance(pair, list) and len(pair) == 2 else ""


def results_table(results: dict[str, Any]) -> Table:
    """Each metric a row; each model a column (value [95% interval]); each model after the first
    a column of its difference from the first ([its interval]). An arrow says which way is better."""
    models = list(results.get("models") or [])
    table = Table(title=f"Evaluation {results.get('eval_id')}", show_lines=False)
    table.add_column("metric", no_wrap=True)
    for model in models:
        table.add_column(model, justify="right")
    for model in models[1:]:
        table.add_column(f"{model} - {models[0]}", justify="right")
    for metric in results.get("metrics") or []:
        arrow = "↑" if metric.get("higher_is_better", True) else "↓"
        cells = [f"{metric['name']} {arrow}"]
        for model in models:
            cells.append(_number((metric.get("values") or {}).get(model)) + _interval((metric.get("ci95") or {}).get(model)))
        for model in models[1:]:
            delta = (metric.get("deltas") or {}).get(model)
            text = "-" if delta is None else f"{float(delta):+.4g}"
            cells.append(text + _interval((metric.get("deltas_ci95") or {}).get(model)))
        table.add_row(*cells)
    return table


def run_eval_job(args: argparse.Namespace, stdout: IO[str] = sys.stdout, stderr: IO[str] = sys.stderr) -> int:
    notes = Notes(stdout, stderr, stdout_for_scripts=args.output_json)
    try:
        request = eval_request(args)
    except StudioError as exc:
        notes.error(str(exc))
        return EXIT_REFUSED
    ended: dict[str, Any] = {}  # the evaluation's last status, and its results once completed

    def evaluate(client: StudioClient) -> int:
        eval_id = client.start_eval(request)
        notes.say(f"queued evaluation {eval_id} of {', '.join(request['models'])}")
        view = make_view(stdout, output_json=args.output_json, live=EvalLiveView, lines=EvalLinesView)
        status = ended["status"] = follow_eval(client, eval_id, view, notes.say)
        if status is None:
            return EXIT_LEFT_RUNNING
        if status["phase"] != "completed":
            notes.error(how_it_ended("evaluation", eval_id, status))
            return EXIT_FAILED
        ended["results"] = client.eval_results(eval_id)
        return EXIT_COMPLETED

    code = Reached().run(args, notes, evaluate)
    results: Optional[dict[str, Any]] = ended.get("results")
    status: Optional[dict[str, Any]] = ended.get("status")
    if args.output_json:
        writer = JsonLinesView(stdout)
        if results is not None:
            writer.write({"event": "results", "data": results})
        writer.write({"event": "summary", "exit_code": code, "phase": (status or {}).get("phase")})
    elif results is not None:
        console = Console(file=stdout)
        console.print(results_table(results))
        for warning in results.get("warnings") or []:
            notes.say(f"warning: {warning}")
        notes.say(f"per-sample rows: {args.server.rstrip('/')}{results.get('samples_url')}")
    return code
