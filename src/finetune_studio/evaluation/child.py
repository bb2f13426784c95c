"""Entry point of an evaluation child: `python -m finetune_studio.evaluation.child --job-id EVAL_ID`.

The same wire as a training or export child (`finetune_studio.wire`): stdin has one
`WorkerSpec` line, whose `output_dir` is the evaluation's folder and whose `request` is the
stored `EvalStartRequest` (`models`, `suites`, `suite_names`) plus what the supervisor adds
as it starts it, never stored: `resolved_models` (each `{id, tokenizer, trust_remote_code}`),
`server` (`{url, token}`: this server, over loopback) and `judge_keys` (an external judge's
API key per suite, from the server's environment); then `stop` lines (EOF is a stop too).
stdout has status messages with `EvalPhase`s and progress messages carrying an
`EvalProgress` (samples done of samples in all).

    loading_model   every suite's data is read and checked first (a bad row fails in
                    seconds, naming its file and line), then each model's tokenizer is
                    loaded (heldout renders rows with its chat template)
    evaluating      each suite in turn (a new status per suite): heldout (evaluation/heldout.py),
                    lm_eval (evaluation/harness.py), a judge suite's answers
    judging         the judge suites' verdicts (evaluation/judge.py)
    completed       `results.json` and `samples.jsonl` written whole into the folder; the
                    server keeps them in SQLite before it writes this status

A stop ends it after the requests under way (`stopped`); a failure ends it `error` with
`details.error_code` and a sentence that says which model, file, task or judge and what to
do. It never imports FastAPI, and never loads a model's weights: the models run in the
server's chat process, reached through /v1.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback
from typing import Any, Optional, Union

from finetune_studio import failures
from finetune_studio.atomic import write_atomically, write_file
from finetune_studio.child.channel import Channel, JobFailure, StopRequested, StopSignal, start_child
from finetune_studio.child.chat_template import NO_TEMPLATE_WARNING, ensure_chat_template
from finetune_studio.evaluation.api import EVALUATION_FAILED, OpenAIEndpoint
from finetune_studio.evaluation.common import Context, ModelInfo, Progress, SuiteResult
from finetune_studio.evaluation.harness import LmEval
from finetune_studio.evaluation.heldout import Heldout
from finetune_studio.evaluation.judge import Judge
from finetune_studio.schemas import EvalPhase, suite_names
from finetune_studio.wire import EVAL_RESULTS_FILE, EVAL_SAMPLES_FILE, WorkerSpec


class Evaluation:
    """One evaluation, top to bottom; `run` returns the results table."""

    def __init__(self, spec: WorkerSpec, channel: Channel, stop: StopSignal) -> None:
        self.spec = spec
        self.channel = channel
        self.stop = stop
        self.folder = spec.output_dir
        self.request = spec.request
        self.phase: EvalPhase = "idle"
        self.started = time.monotonic()
        resolved = self.request.get("resolved_models") or [{"id": model} for model in self.request.get("models", [])]
        self.models = [
            ModelInfo(str(m["id"]), m.get("tokenizer"), bool(m.get("trust_remote_code"))) for m in resolved
        ]
        suites = list(self.request.get("suites") or [])
        self.suites: list[dict[str, Any]] = suites
        self.names = list(self.request.get("suite_names") or suite_names([str(s.get("type")) for s in suites]))
        server = dict(self.request.get("server") or {})
        self.api = OpenAIEndpoint(f"{str(server.get('url', 'http://127.0.0.1:8000')).rstrip('/')}/v1", server.get("token"),
                                  name="this server")
        self.ctx = Context(
            api=self.api, models=self.models, stop=stop, progress=Progress(channel), channel=channel, server=server,
            judge_keys={str(k): str(v) for k, v in (self.request.get("judge_keys") or {}).items()},
        )

    def details(self, **more: Any) -> dict[str, Any]:
        return {"output_dir": str(self.folder), "models": [m.id for m in self.models], "suites": self.names, **more}

    def enter(self, phase: EvalPhase, message: str, **details: Any) -> None:
        self.stop.check()
        self.phase = phase
        self.channel.status(phase, message, details=self.details(**details))

    def run(self) -> dict[str, Any]:
        self.folder.mkdir(parents=True, exist_ok=True)
        if not self.models:
            raise JobFailure("config_invalid", "the evaluation names no model")
        self.enter("loading_model", f"Reading the data of {len(self.suites)} suite{'s' if len(self.suites) != 1 else ''}")
        runs = [self.prepare(index, suite) for index, suite in enumerate(self.suites)]
        if any(isinstance(run, Heldout) for run in runs):
            self.enter("loading_model", "Loading the models' tokenizers (their chat templates render the held-out rows)")
            self.load_tokenizers()
        for run in runs:
            self.ctx.progress.add(run.samples(len(self.models)))
        results: list[SuiteResult] = []
        judges: list[Judge] = []
        for number, run in enumerate(runs, start=1):
            name = run.name
            self.enter("evaluating", f"Evaluating {name} (suite {number} of {len(runs)}) on {len(self.models)} model"
                       f"{'s' if len(self.models) != 1 else ''}", suite=name)
            if isinstance(run, Judge):
                run.evaluate(self.ctx)
                judges.append(run)
            else:
                results.append(run.evaluate(self.ctx))
        for judge in judges:
            judge_model = judge.suite["judge"]["model"]
            self.enter("judging", f"Judging {judge.name} with {judge_model}: each answer against {self.models[0].id}'s,"
                       " twice (positions swapped)", suite=judge.name)
            results.append(judge.judge(self.ctx))
        self.stop.check()
        table = {
            "models": [m.id for m in self.models],
            "metrics": [metric for result in results for metric in result.metrics],
            "warnings": [warning for result in results for warning in result.warnings],
        }
        self.write(table, [row for result in results for row in result.samples])
        return table

    def prepare(self, index: int, suite: dict[str, Any]) -> Union[Heldout, LmEval, Judge]:
        name = self.names[index]
        kind = suite.get("type")
        if kind == "heldout":
            return Heldout(name, suite)
        if kind == "lm_eval":
            return LmEval(name, suite)
        if kind == "judge":
            return Judge(name, suite, index)
        raise JobFailure("config_invalid", f"suites[{index}]: unknown suite type {kind!r}")

    def load_tokenizers(self) -> None:
        from finetune_studio.child.datasets.errors import first_line
        from finetune_studio.child.models import ModelSource, from_local_cache, pretrained_args

        loaded: dict[tuple[str, str], Any] = {}
        for model in self.models:
            self.stop.check()
            where = model.tokenizer or {"kind": "hub", "location": model.id}
            key = (str(where.get("kind")), str(where.get("location")))
            if key not in loaded:
                from transformers import AutoTokenizer

                source = ModelSource(*key)
                location, kwargs = pretrained_args(source, trust_remote_code=model.trust_remote_code)
                try:
                    def load(given: dict[str, Any], at: str = location) -> Any:
                        return AutoTokenizer.from_pretrained(at, **given)

                    cached = from_local_cache(source, load, kwargs)
                    loaded[key] = cached if cached is not None else AutoTokenizer.from_pretrained(location, **kwargs)
                except (ImportError, OSError, ValueError, KeyError) as exc:
                    raise JobFailure(
                        "model_not_found",
                        f"cannot load the tokenizer of {model.id} ({key[1]}): {first_line(exc)}; was its model deleted since"
                        " the evaluation was queued?",
                    ) from None
            self.ctx.tokenizers[model.id] = loaded[key]
            if ensure_chat_template(loaded[key]):  # as training, inspection and chat do (child/chat_template.py)
                self.channel.warn(f"{model.id}: {NO_TEMPLATE_WARNING}")

    def write(self, table: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        with write_atomically(self.folder / EVAL_SAMPLES_FILE) as partial, open(partial, "w", encoding="utf-8") as out:
            for row in samples:
                out.write(json.dumps(row, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n")
        write_file(self.folder / EVAL_RESULTS_FILE, json.dumps(table, ensure_ascii=False, allow_nan=False))

    def close(self) -> None:
        self.api.close()


def failure(exc: BaseException) -> tuple[str, str]:
    """An error code and a sentence for an unexpected failure."""
    known = failures.classify(exc, "export")
    if known is not None:
        return known
    return EVALUATION_FAILED, f"Evaluation failed: {type(exc).__name__}: {failures.first_line(exc)}"


def main(argv: Optional[list[str]] = None) -> int:
    spec, channel, stop, _ = start_child("finetune_studio.evaluation.child", "evaluation", argv)
    evaluation = Evaluation(spec, channel, stop)
    try:
        table = evaluation.run()
    except StopRequested as exc:
        channel.status("stopped", f"Stopped during {evaluation.phase} ({exc}); nothing of it was kept", details=evaluation.details())
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the user
        if isinstance(exc, JobFailure):
            code, text = str(exc.error_code), exc.message
        else:
            with contextlib.suppress(OSError, ValueError):
                traceback.print_exc()
            code, text = failure(exc)
        if stop.is_set() and code == EVALUATION_FAILED:  # a request cut off by our own stop
            channel.status("stopped", f"Stopped during {evaluation.phase} ({stop.reason})", details=evaluation.details())
            return 0
        channel.status("error", "Evaluation failed", error=text, details={**evaluation.details(), "error_code": code})
        return 1
    finally:
        evaluation.close()
    metrics, warnings = table["metrics"], table["warnings"]
    channel.status(
        "completed",
        f"Evaluated {len(evaluation.models)} model{'s' if len(evaluation.models) != 1 else ''} on {len(evaluation.names)}"
        f" suite{'s' if len(evaluation.names) != 1 else ''}: {len(metrics)} metrics",
        details=evaluation.details(eval_warnings=warnings[:20], elapsed_seconds=round(time.monotonic() - evaluation.started, 2)),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
