"""lm-evaluation-harness against one model: `python -m finetune_studio.evaluation.harness_runner`.

A process of its own per model of an `lm_eval` suite (evaluation/harness.py starts it), so a
stop ends lm-eval at once and its imports stay out of the evaluation child.

- stdin: one JSON line, `{base_url, token, model, tokenizer, trust_remote_code, tasks,
  tasks_dir, num_fewshot, limit, tokenized, batch_size}` (the token on stdin only: never on a command
  line or in the environment).
- stdout: JSON lines: `{"type": "requests", "count"}` as lm-eval has built a batch of
  requests, `{"type": "done", "count"}` after each answered call, then `{"type": "result",
  "results", "higher_is_better", "samples"}`, or `{"type": "failed", "code", "message"}`.
  What lm-eval itself prints goes to stderr (the evaluation's log).

lm-eval runs its own `local-completions` model (`LocalCompletionsAPI`), subclassed only to
count requests: base_url is the server's full `.../v1/completions`, the tokenizer is the
model's own local one (`tokenizer_backend=huggingface`). `HF_DATASETS_OFFLINE=1` and
`HF_HUB_OFFLINE=1` are set, so nothing waits on a hub: every task is loaded once before any
request, and one whose data is not on this machine fails at once, naming the task and what
to do; an unknown task name fails naming the closest ones lm-eval knows.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
import traceback
from typing import IO, Any

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
MAX_CONTEXT_CHARS = 4000


class Failed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def run(spec: dict[str, Any], out: IO[str]) -> dict[str, Any]:
    os.environ.update(OFFLINE)
    import lm_eval
    from lm_eval.api.registry import register_model
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    def say(message: dict[str, Any]) -> None:
        out.write(json.dumps(message, default=str) + "\n")
        out.flush()

    token = spec.get("token") or ""

    class StudioCompletions(LocalCompletionsAPI):  # type: ignore[misc]
        """lm-eval's local-completions, counting its requests for the evaluation's progress."""

        def _loglikelihood_tokens(self, requests: Any, **kwargs: Any) -> Any:
            say({"type": "requests", "count": len(requests)})
            return super()._loglikelihood_tokens(requests, **kwargs)

        def generate_until(self, requests: Any, disable_tqdm: bool = False) -> Any:
            say({"type": "requests", "count": len(requests)})
            return super().generate_until(requests, disable_tqdm=disable_tqdm)

        def model_call(self, messages: Any, **kwargs: Any) -> Any:
            answer = super().model_call(messages, **kwargs)
            say({"type": "done", "count": len(messages) if isinstance(messages, list) else 1})
            return answer

        @property
        def api_key(self) -> str:
            return str(token)

    register_model("studio-completions")(StudioCompletions)

    tasks: list[str] = list(spec["tasks"])
    manager = TaskManager(include_path=spec["tasks_dir"]) if spec.get("tasks_dir") else TaskManager()
    known = set(manager.all_tasks)
    for task in tasks:
        if task not in known:
            close = difflib.get_close_matches(task, sorted(known), n=5)
            where = f" or in {spec['tasks_dir']}" if spec.get("tasks_dir") else ""
            hint = f"; close names: {', '.join(close)}" if close else ""
            raise Failed(
                "config_invalid",
                f"lm_eval: no task {task!r} among lm-eval's {len(known):,} tasks{where}{hint}. Name a task lm-eval knows"
                " (`lm_eval ls tasks`), or a task folder of your own (tasks_dir) with its YAML and local data",
            )
    for task in tasks:
        try:
            manager.load([task])
        except Exception as exc:  # noqa: BLE001 - whatever loading the task's data raised
            raise Failed(
                "dataset_not_found",
                f"lm_eval task {task!r}: its data is not on this machine ({type(exc).__name__}: {_first_line(exc)}). The"
                " evaluation does not wait on a hub (HF_DATASETS_OFFLINE=1): download the task's dataset into the Hugging"
                " Face cache where the hub is reachable, or name a task folder (tasks_dir) whose YAML reads local files",
            ) from None
    limit = spec.get("limit")
    if limit is not None and float(limit) >= 1:
        limit = int(limit)
    model_args: dict[str, Any] = {
        "model": spec["model"],
        "base_url": spec["base_url"],
        "tokenizer": spec["tokenizer"],
        "tokenizer_backend": "huggingface",
        "tokenized_requests": bool(spec.get("tokenized", True)),
        "batch_size": int(spec.get("batch_size") or 1),  # prompts per request
        "trust_remote_code": bool(spec.get("trust_remote_code")),
        "max_retries": 1,
        "timeout": 1800,
    }
    output = lm_eval.simple_evaluate(
        model="studio-completions",
        model_args=model_args,
        tasks=tasks,
        num_fewshot=spec.get("num_fewshot"),
        limit=limit,
        task_manager=manager,
        log_samples=True,
        bootstrap_iters=0,
    )
    if output is None:
        raise Failed("evaluation_failed", "lm_eval returned no results")
    samples: dict[str, list[dict[str, Any]]] = {}
    for task, rows in (output.get("samples") or {}).items():
        samples[task] = [_sample(row) for row in rows]
    return {
        "type": "result",
        "results": output.get("results") or {},
        "higher_is_better": output.get("higher_is_better") or {},
        "samples": samples,
    }


def _sample(row: dict[str, Any]) -> dict[str, Any]:
    """A logged sample, without its document (large), with its context cut short."""
    context = ""
    arguments = row.get("arguments")
    if isinstance(arguments, (list, tuple)) and arguments:
        first = arguments[0]
        context = str(first[0] if isinstance(first, (list, tuple)) and first else first)
    kept = {key: value for key, value in row.items() if key not in ("doc", "arguments", "resps", "doc_hash", "prompt_hash", "target_hash")}
    kept["context"] = context[:MAX_CONTEXT_CHARS]
    return kept


def main() -> int:
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # lm-eval's prints go to the log
    try:
        spec = json.loads(sys.stdin.readline())
        message = run(spec, out)
        code = 0
    except Failed as exc:
        message, code = {"type": "failed", "code": exc.code, "message": exc.message}, 1
    except BaseException as exc:  # noqa: BLE001 - the evaluation child must hear why
        traceback.print_exc()
        message = {"type": "failed", "code": "evaluation_failed", "message": f"lm_eval failed: {type(exc).__name__}: {_first_line(exc)}"}
        code = 1
    out.write(json.dumps(message, default=str) + "\n")
    out.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
