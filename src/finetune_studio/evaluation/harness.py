"""The `lm_eval` suite: lm-evaluation-harness tasks, run by lm-eval itself against each model.

Each model gets a `python -m finetune_studio.evaluation.harness_runner` process (a stop ends
it at once): lm-eval's `local-completions` model with base_url the server's full
`.../v1/completions`, the model's local tokenizer (`tokenizer_backend=huggingface`), prompts
sent as token ids when the route takes them (exact context lengths) and as text otherwise,
CONCURRENT_REQUESTS of them in a request (lm-eval's `batch_size`: the chat child prefills a
request's prompts together, and decodes its answers in one batch).
`limit` and `num_fewshot` pass through; tasks come by name, or from the task folder the user
names (`tasks_dir`: YAML and local data). Offline: a task whose data is not here fails at once.

Results: lm-eval's own value of each task's metric (`lm_eval/<task>/<metric>`, with
`[filter]` for a filter other than `none`) and its direction (`higher_is_better`). Where a
metric is a mean over the documents (acc, acc_norm, exact_match ...: the logged per-document
values average to lm-eval's value), each value has the paired bootstrap's interval over the
documents the models share, and each difference its own; other metrics carry their values and
differences only. Per-sample rows: each document's context, target, every model's filtered
answer and scores.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from queue import Empty, Queue
from typing import Any, Optional

from finetune_studio.child.channel import JobFailure, StopRequested
from finetune_studio.evaluation.api import EVALUATION_FAILED
from finetune_studio.evaluation.common import CONCURRENT_REQUESTS, Context, ModelInfo, SuiteResult, clip
from finetune_studio.evaluation.stats import Estimate, paired_bootstrap

RUNNER_MODULE = "finetune_studio.evaluation.harness_runner"
NEEDS_COMPLETIONS = (
    "lm_eval suites need POST /v1/completions (OpenAI's completions, with echo and logprobs), which this server does not"
    " have; run the heldout or judge suites, or a server that has the route"
)
_STOP_POLL_SECONDS = 0.2


class LmEval:
    def __init__(self, name: str, suite: dict[str, Any]) -> None:
        self.name = name
        self.suite = suite
        self.tasks = [str(task) for task in suite["tasks"]]

    def samples(self, models: int) -> int:
        return 0  # counted once lm-eval has built its requests

    def evaluate(self, ctx: Context) -> SuiteResult:
        if not ctx.has_completions():
            raise JobFailure(EVALUATION_FAILED, NEEDS_COMPLETIONS)
        per_model: dict[str, dict[str, Any]] = {}
        for model in ctx.models:
            per_model[model.id] = self.run_model(ctx, model)
        ctx.progress.advance(self.name, None, 0, force=True)
        return self.results(ctx.ids, per_model)

    def runner_spec(self, ctx: Context, model: ModelInfo) -> dict[str, Any]:
        tokenizer = model.tokenizer or {}
        if tokenizer.get("kind") == "gguf":
            raise JobFailure(
                "config_invalid",
                f"lm_eval reads {model.id}'s tokenizer with transformers' AutoTokenizer, which cannot take it from a"
                f" .gguf file ({tokenizer.get('location')}); evaluate it with the heldout or judge suites",
            )
        server = ctx.server
        return {
            "base_url": f"{str(server.get('url', '')).rstrip('/')}/v1/completions",
            "token": server.get("token"),
            "model": model.id,
            "tokenizer": tokenizer.get("location") or model.id,
            "trust_remote_code": model.trust_remote_code,
            "tasks": self.tasks,
            "tasks_dir": str(Path(self.suite["tasks_dir"]).expanduser()) if self.suite.get("tasks_dir") else None,
            "num_fewshot": self.suite.get("num_fewshot"),
            "limit": self.suite.get("limit"),
            "tokenized": ctx.api.accepts_token_prompts(model.id, [1, 2, 3]),
            "batch_size": CONCURRENT_REQUESTS,
        }

    def run_model(self, ctx: Context, model: ModelInfo) -> dict[str, Any]:
        spec = self.runner_spec(ctx, model)
        process = subprocess.Popen(  # noqa: S603 - our own module, with this interpreter
            [sys.executable, "-m", RUNNER_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the evaluation's log
            text=True,
            encoding="utf-8",
            start_new_session=True,
        )
        if process.stdin is None or process.stdout is None:
            raise OSError("lm_eval's runner was started without its pipes")
        try:
            process.stdin.write(json.dumps(spec) + "\n")
            process.stdin.close()
            final: Optional[dict[str, Any]] = None
            for message in _lines(process, ctx):
                kind = message.get("type")
                if kind == "requests":
                    ctx.progress.add(int(message.get("count", 0)))
                elif kind == "done":
                    ctx.progress.advance(self.name, model.id, int(message.get("count", 1)))
                elif kind in ("result", "failed"):
                    final = message
            process.wait()
        finally:
            _end(process)
        if final is None:
            raise JobFailure(EVALUATION_FAILED, f"lm_eval ended without a result for {model.id} (exit code {process.returncode}); its log has why")
        if final["type"] == "failed":
            raise JobFailure(str(final.get("code") or EVALUATION_FAILED), f"{model.id}: {final.get('message')}")  # type: ignore[arg-type]
        return final

    def results(self, models: list[str], per_model: dict[str, dict[str, Any]]) -> SuiteResult:
        result = SuiteResult()
        first = per_model[models[0]]
        for task, metrics in sorted((first.get("results") or {}).items()):
            if not isinstance(metrics, dict):
                continue
            for key in sorted(metrics):
                if "," not in key or "_stderr" in key:
                    continue
                metric, filt = key.split(",", 1)
                name = f"{task}/{metric}" + ("" if filt == "none" else f"[{filt}]")
                values = {model: _number((per_model[model].get("results") or {}).get(task, {}).get(key)) for model in models}
                if all(value is None for value in values.values()):
                    continue
                higher = bool(((first.get("higher_is_better") or {}).get(task) or {}).get(metric, True))
                estimate, count = self.estimate(models, per_model, task, metric, filt, values)
                result.add(self.name, name, estimate, higher_is_better=higher, samples=count)
        result.samples = self.sample_rows(models, per_model)
        return result

    @staticmethod
    def estimate(
        models: list[str], per_model: dict[str, dict[str, Any]], task: str, metric: str, filt: str, values: dict[str, Optional[float]]
    ) -> tuple[Estimate, int]:
        """The paired bootstrap over the documents every model has, where lm-eval's value is their mean;
        else the values and differences alone."""
        per_doc: dict[str, dict[Any, float]] = {}
        for model in models:
            docs: dict[Any, float] = {}
            for row in (per_model[model].get("samples") or {}).get(task, []):
                value = _number(row.get(metric))
                if row.get("filter", "none") == filt and value is not None:
                    docs[row.get("doc_id")] = value
            per_doc[model] = docs
        shared = sorted(set.intersection(*(set(docs) for docs in per_doc.values())), key=str) if per_doc else []
        means = all(
            shared and values[model] is not None and len(per_doc[model]) == len(shared)
            and math.isclose(sum(per_doc[model].values()) / len(shared), float(values[model] or 0.0), rel_tol=1e-6, abs_tol=1e-9)
            for model in models
        )
        if means:
            estimate = paired_bootstrap({model: [per_doc[model][doc] for doc in shared] for model in models}, models)
            estimate.values = values
            return estimate, len(shared)
        estimate = Estimate(values=values)
        base = values[models[0]]
        if base is not None:
            estimate.deltas = {model: float(value) - float(base) for model, value in values.items() if model != models[0] and value is not None}
        return estimate, len(shared)

    def sample_rows(self, models: list[str], per_model: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        first = per_model[models[0]].get("samples") or {}
        for task in sorted(first):
            by_model = {model: {(row.get("doc_id"), row.get("filter")): row for row in (per_model[model].get("samples") or {}).get(task, [])}
                        for model in models}
            for row in first[task]:
                key = (row.get("doc_id"), row.get("filter"))
                answers, scores = {}, {}
                for model in models:
                    found = by_model[model].get(key)
                    if found is None:
                        continue
                    answers[model] = clip(_answer(found.get("filtered_resps")))
                    scores[model] = {
                        name: value for name, raw in found.items()
                        if name not in ("doc_id", "filter", "target", "context", "filtered_resps") and (value := _number(raw)) is not None
                    }
                rows.append({
                    "suite": self.name,
                    "index": len(rows),
                    "prompt": clip(f"[{task} #{row.get('doc_id')}{'' if key[1] in (None, 'none') else f' {key[1]}'}] {row.get('context', '')}"),
                    "reference": clip(str(row.get("target"))) if row.get("target") is not None else None,
                    "answers": answers,
                    "scores": scores,
                })
        return rows


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        return float(value)
    return None


def _answer(value: Any) -> str:
    while isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _lines(process: subprocess.Popen[str], ctx: Context) -> Iterator[dict[str, Any]]:
    """The runner's messages as they come; a stop ends the runner and raises StopRequested."""
    queue: Queue[Optional[str]] = Queue()
    stdout = process.stdout
    if stdout is None:
        return

    def read() -> None:
        for line in stdout:
            queue.put(line)
        queue.put(None)

    threading.Thread(target=read, name="lm-eval-reader", daemon=True).start()
    while True:
        try:
            line = queue.get(timeout=_STOP_POLL_SECONDS)
        except Empty:
            if ctx.stop.is_set():
                _end(process)
                raise StopRequested(ctx.stop.reason) from None
            continue
        if line is None:
            return
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict):
            yield message


def _end(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
