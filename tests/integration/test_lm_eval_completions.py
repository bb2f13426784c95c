"""lm-evaluation-harness (the real package) against the server's `POST /v1/completions`, fully
offline, and against lm-eval's own `hf` model on the same weights: the same scores, the same
per-sample log-likelihoods (within 1e-4) and the same generations.

lm-eval runs as its users run it, `python -m lm_eval` in a process of its own: `local-completions`
with base_url the server's full `.../v1/completions`, `tokenizer_backend=huggingface` and the
tiny model's folder as `tokenizer`; `hf` with `pretrained=` that folder, float32, on the CPU.
The tasks are local (`--include_path`): a multiple-choice (loglikelihood) task, and a
generate_until task, each over a JSONL file (`dataset_path: json`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from finetune_studio.config import Settings
from tests.helpers.evaluations import GENERATE_TASK_YAML, TASK_YAML, AdapterLauncher, rows_file, trained
from tests.helpers.paths import REPO
from tests.helpers.servers import LiveServer

pytestmark = pytest.mark.slow

MODEL = "tiny/base"  # the played job's model_name: a base /v1/models lists
TASKS = ("tiny_mc", "tiny_gen")
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def task_folder(root: Path) -> Path:
    tasks = root / "tasks"
    tasks.mkdir()
    questions = ["the capital of France", "two plus two", "hello in Spanish", "the day of the meeting", "a haiku", "the fox"]
    answers = ["Paris", "four", "Hola", "Tuesday", "waves", "quick"]
    mc = tasks / "tiny_mc.jsonl"
    mc.write_text("".join(json.dumps({"question": f"What is {q}?", "choices": [a, "no", "The meeting is on Tuesday"],
                                      "answer": i % 3}) + "\n" for i, (q, a) in enumerate(zip(questions, answers, strict=True))))
    (tasks / "tiny_mc.yaml").write_text(TASK_YAML.format(data=mc))
    gen = tasks / "tiny_gen.jsonl"
    gen.write_text("".join(json.dumps({"question": f"What is {q}?", "answer": a}) + "\n" for q, a in zip(questions, answers, strict=True)))
    (tasks / "tiny_gen.yaml").write_text(GENERATE_TASK_YAML.format(data=gen))
    return tasks


def lm_eval(tasks: Path, output: Path, model: str, model_args: str) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """lm-eval's results and its per-sample rows (by task), run in a process of its own."""
    command = [sys.executable, "-m", "lm_eval", "run", "--model", model, "--model_args", model_args, "--tasks", ",".join(TASKS),
               "--include_path", str(tasks), "--output_path", str(output), "--log_samples", "--batch_size", "1"]
    if model == "hf":
        command += ["--device", "cpu"]
    done = subprocess.run(command, cwd=REPO, env={**os.environ, **OFFLINE}, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(next(output.rglob("results_*.json")).read_text())
    samples = {task: [json.loads(line) for line in next(output.rglob(f"samples_{task}_*.jsonl")).read_text().splitlines() if line]
               for task in TASKS}
    return results, samples


def by_doc(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {int(row["doc_id"]): row for row in rows}


def test_lm_eval_scores_the_server_as_it_scores_the_same_weights_itself(tmp_path: Path, tiny_model: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = task_folder(tmp_path)
    monkeypatch.chdir(REPO)
    settings = Settings(data_dir=tmp_path / "data", inference_precision="fp32")
    with LiveServer(settings, AdapterLauncher(tiny_model)) as server:
        with server.client() as client:
            trained(client, rows_file(tmp_path / "train.jsonl", ["hi"]))
        served, served_samples = lm_eval(
            tasks, tmp_path / "served", "local-completions",
            f"model={MODEL},base_url={server.url}/v1/completions,tokenizer_backend=huggingface,tokenizer={tiny_model},"
            "num_concurrent=1,max_retries=1")
    own, own_samples = lm_eval(tasks, tmp_path / "hf", "hf", f"pretrained={tiny_model},dtype=float32")

    for task in TASKS:
        for metric, value in own["results"][task].items():
            if isinstance(value, float):
                assert served["results"][task][metric] == pytest.approx(value, abs=1e-9), (task, metric)
    mc_served, mc_own = by_doc(served_samples["tiny_mc"]), by_doc(own_samples["tiny_mc"])
    assert sorted(mc_served) == sorted(mc_own) and len(mc_own) == 6
    for doc, row in mc_own.items():
        # Per choice: [log-likelihood of the continuation, whether it is the greedy one].
        theirs = [(float(ll), str(greedy)) for (ll, greedy), in mc_served[doc]["resps"]]
        mine = [(float(ll), str(greedy)) for (ll, greedy), in row["resps"]]
        assert [ll for ll, _ in theirs] == pytest.approx([ll for ll, _ in mine], abs=1e-4), doc
        assert [greedy for _, greedy in theirs] == [greedy for _, greedy in mine], doc
        assert all(ll < 0 for ll, _ in mine)
    gen_served, gen_own = by_doc(served_samples["tiny_gen"]), by_doc(own_samples["tiny_gen"])
    assert sorted(gen_served) == sorted(gen_own) and len(gen_own) == 6
    for doc, row in gen_own.items():
        assert gen_served[doc]["resps"] == row["resps"], doc
    assert any(str(row["resps"][0][0]).strip() for row in gen_own.values()), "every generation is empty: nothing was compared"
