"""Running the real evaluation child (`python -m finetune_studio.evaluation.child`) against an
OpenAI-compatible stand-in (tests/helpers/fake_openai.py), and reading what it left.

    run = run_eval_child(tmp_path, api, request)   the child's messages, its results and samples
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_studio.schemas import suite_names
from finetune_studio.wire import EVAL_RESULTS_FILE, EVAL_SAMPLES_FILE
from tests.helpers.paths import REPO


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
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "finetune_studio.evaluation.child", "--job-id", spec["job_id"]],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=REPO,
        )
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
