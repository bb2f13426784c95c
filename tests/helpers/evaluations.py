"""Running the real evaluation child (`python -m finetune_studio.evaluation.child`) against an
OpenAI-compatible stand-in (tests/helpers/fake_openai.py), and reading what it left.

    run = run_eval_child(tmp_path, api, request)   the child's messages, its results and samples

and, for the server's side, training jobs played in-process that leave what an evaluation reads:

    AdapterLauncher(tiny_model)      a run reports every phase and completes with an "adapter" (the
                                     tiny model's tokenizer files) and a job.json naming the tiny
                                     model as its base, so chat and evaluations resolve it
    trained(client, data, **fields)  such a job, completed
    rows_file(path, users)           conversations whose reference answer is the user's words
    TASK_YAML                        an lm-eval multiple-choice task over a local JSONL file
    GENERATE_TASK_YAML               an lm-eval generate_until task over a local JSONL file
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_studio.cli.client import StudioClient
from finetune_studio.schemas import suite_names
from finetune_studio.wire import EVAL_RESULTS_FILE, EVAL_SAMPLES_FILE, WorkerSpec
from tests.helpers.jobs import ScriptedWorker
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for


@dataclass
class ChildRun:
    messages: list[dict[str, Any]]
    returncode: int
    log: str
    folder: Path

    @property
    def statuses(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("type") == "status"]

    @property
    def phases(self) -> list[str]:
        return [m["phase"] for m in self.statuses]

    @property
    def last(self) -> dict[str, Any]:
        return self.statuses[-1]

    @property
    def progress(self) -> list[dict[str, Any]]:
        return [m["progress"] for m in self.messages if m.get("type") == "progress"]

    @property
    def results(self) -> dict[str, Any]:
        return json.loads((self.folder / EVAL_RESULTS_FILE).read_text())  # type: ignore[no-any-return]

    @property
    def samples(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.folder / EVAL_SAMPLES_FILE).read_text().splitlines() if line]

    def metric(self, name: str) -> dict[str, Any]:
        found = {m["name"]: m for m in self.results["metrics"]}
        assert name in found, f"no metric {name}; the metrics: {sorted(found)}"
        return found[name]


def eval_request(
    url: str,
    models: list[str],
    suites: list[dict[str, Any]],
    tokenizer: Optional[Path] = None,
    token: Optional[str] = None,
    judge_keys: Optional[dict[str, str]] = None,
) -> dict[str, Any]:
    """The request the supervisor gives the child: stored fields plus the resolved models and the server."""
    return {
        "models": models,
        "suites": suites,
        "suite_names": suite_names([s["type"] for s in suites]),
        "resolved_models": [
            {"id": model, "tokenizer": {"kind": "folder", "location": str(tokenizer)} if tokenizer else None} for model in models
        ],
        "server": {"url": url, "token": token},
        "judge_keys": judge_keys or {},
    }


def run_eval_child(folder: Path, request: dict[str, Any], stop_after: Optional[str] = None) -> ChildRun:
    """The child run to its end (stdin held open: EOF would be a stop). With `stop_after`, `stop` is
    written once a status whose message starts with it has come."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"job_id": "e" + folder.name[-8:], "output_dir": str(folder), "request": request, "warnings": []}
    log = folder / "worker.log"
    with open(log, "w") as stderr, subprocess.Popen(
        [sys.executable, "-m", "finetune_studio.evaluation.child", "--job-id", spec["job_id"]],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=REPO,
    ) as process:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(spec) + "\n")
        process.stdin.flush()
        messages = []
        for line in process.stdout:
            message = json.loads(line)
            messages.append(message)
            if stop_after and message.get("type") == "status" and str(message.get("message", "")).startswith(stop_after):
                process.stdin.write("stop\n")
                process.stdin.flush()
        process.stdin.close()
        returncode = process.wait()
    return ChildRun(messages, returncode, log.read_text(), folder)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class AdapterHandle(ScriptedWorker):
    """A training run that is no process: every phase, one step, then a saved "adapter" (the tiny
    model's tokenizer files) and the job.json that names the tiny model as its base."""

    def __init__(self, spec: WorkerSpec, base: Path) -> None:
        super().__init__()
        self.spec = spec
        self.base = base
        self.log_path = spec.output_dir / "worker.log"

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        folder = self.spec.output_dir
        folder.mkdir(parents=True, exist_ok=True)
        for phase in ("loading_model", "loading_dataset", "configuring", "training"):
            yield {"type": "status", "phase": phase, "message": phase, "details": {}}
        adapter = folder / "adapter"
        adapter.mkdir(exist_ok=True)
        for name in TOKENIZER_FILES:
            if (self.base / name).exists():
                shutil.copy(self.base / name, adapter / name)
        (adapter / "adapter_config.json").write_text("{}")
        record = {"base_model": {"kind": "folder", "location": str(self.base)}, "method": "lora", "trust_remote_code": False}
        (folder / "job.json").write_text(json.dumps(record))
        yield {"type": "progress", "progress": {"step": 1, "total_steps": 1, "loss": 1.0, "learning_rate": 0.1, "progress_percent": 100.0}}
        yield {"type": "status", "phase": "completed", "message": "done", "details": {"adapter_dir": str(adapter), "steps": 1}}


class AdapterLauncher:
    def __init__(self, base: Path) -> None:
        self.base = base

    async def launch(self, spec: WorkerSpec) -> AdapterHandle:
        return AdapterHandle(spec, self.base)


def trained(client: StudioClient, data: Path, **request: Any) -> str:
    body = {"model_name": "tiny/base", "training_type": "LoRA/QLoRA", "format_type": "auto", "local_datasets": [str(data)], **request}
    job_id = client.start(body)
    wait_for(lambda: client.status(job_id)["phase"] == "completed", timeout=30, what="the played training job")
    return job_id


def rows_file(path: Path, users: list[str]) -> Path:
    """Conversations whose reference answer is the user's own words (the stand-in chat child echoes them)."""
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": u}, {"role": "assistant", "content": u}]}) + "\n" for u in users))
    return path


TASK_YAML = """task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""

GENERATE_TASK_YAML = """task: tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""
