"""lm-eval through the server against lm-eval's own `hf` model on the same tasks (issue 27).

    .venv/bin/python bench/lm_eval_bench.py                  # SmolLM2-135M, 2 rounds
    .venv/bin/python bench/lm_eval_bench.py --docs 40 --rounds 1
    .venv/bin/python bench/lm_eval_bench.py --models-dir DIR # keep the converted SmolLM2 folder

Two local tasks (`dataset_path: json`, read from this run's temp folder, offline): a
multiple-choice task of `--docs` questions with three choices each (loglikelihood
requests) and a generate_until task of a quarter as many (16 new tokens at most, greedy).
In rounds whose order reverses every round:

- **through the server**: `POST /eval/start` with the base model (`base:<job>` of a 2-step
  LoRA job trained first) and one `lm_eval` suite
  naming both tasks (`tasks_dir` this folder); wall time from the request to `completed` on
  `/eval/stream`: the evaluation child, lm-eval's own process (`local-completions` against
  the server's `/v1/completions`), the chat child's start and model load.
- **lm-eval alone**: `python -m lm_eval run --model hf` on the same folder, the same tasks,
  the model loaded in the chat child's precision (`dtype`), `--batch_size` the suite's
  (`evaluation.common.CONCURRENT_REQUESTS`: the prompts it sends in one request), on the CPU.

The ratio is reported (no budget); each side's scores are printed, to show they measured
the same thing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chat import train  # noqa: E402
from common import load_average, machine_line, median, server, smollm2_gguf, table  # noqa: E402
from finetune_studio.evaluation.common import CONCURRENT_REQUESTS  # noqa: E402

TASKS = ("bench_mc", "bench_gen")
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1"}
TERMINAL = ("completed", "error", "stopped")
MC_YAML = """task: bench_mc
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
GEN_YAML = """task: bench_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 16
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""
FACTS = [("the capital of France", "Paris"), ("two plus two", "four"), ("the colour of the sky on a clear day", "blue"),
         ("the opposite of hot", "cold"), ("the first month of the year", "January"), ("the largest ocean", "the Pacific"),
         ("the animal that barks", "a dog"), ("the day after Monday", "Tuesday"), ("frozen water", "ice"),
         ("the star at the centre of our solar system", "the Sun")]


def task_folder(root: Path, docs: int) -> Path:
    folder = root / "tasks"
    folder.mkdir()
    answers = [answer for _, answer in FACTS]
    with (folder / "bench_mc.jsonl").open("w") as out:
        for i in range(docs):
            question, answer = FACTS[i % len(FACTS)]
            wrong = [a for a in answers if a != answer]
            choices = [answer, wrong[i % len(wrong)], wrong[(i + 3) % len(wrong)]]
            order = i % 3
            choices[0], choices[order] = choices[order], choices[0]
            out.write(json.dumps({"question": f"What is {question}? ({i + 1})", "choices": choices, "answer": order}) + "\n")
    with (folder / "bench_gen.jsonl").open("w") as out:
        for i in range(max(docs // 4, 1)):
            question, answer = FACTS[i % len(FACTS)]
            out.write(json.dumps({"question": f"What is {question}?", "answer": answer}) + "\n")
    (folder / "bench_mc.yaml").write_text(MC_YAML.format(data=folder / "bench_mc.jsonl"))
    (folder / "bench_gen.yaml").write_text(GEN_YAML.format(data=folder / "bench_gen.jsonl"))
    return folder


def through_server(url: str, model: str, tasks: Path) -> tuple[float, dict[str, Any]]:
    body = {"models": [model], "label": "bench", "suites": [{"type": "lm_eval", "tasks": list(TASKS), "tasks_dir": str(tasks)}]}
    started = time.perf_counter()
    with httpx.Client(base_url=url, timeout=httpx.Timeout(60, read=None)) as http:
        answer = http.post("/eval/start", json=body)
        if answer.status_code != 200:
            sys.exit(f"/eval/start answered {answer.status_code}: {answer.text}")
        eval_id = answer.json()["eval_id"]
        with http.stream("GET", f"/eval/stream/{eval_id}") as stream:
            for line in stream.iter_lines():
                if line.startswith("data: ") and '"phase"' in line:
                    event = json.loads(line[6:])
                    if event.get("phase") in TERMINAL:
                        elapsed = time.perf_counter() - started
                        if event["phase"] != "completed":
                            sys.exit(f"the evaluation ended {event['phase']}: {line}")
                        break
        results = http.get(f"/eval/results/{eval_id}").json()
    scores = {m["name"]: m["values"].get(model) for m in results.get("metrics", [])}
    return elapsed, scores


def alone(model_dir: Path, tasks: Path, dtype: str, output: Path) -> tuple[float, dict[str, Any]]:
    command = [sys.executable, "-m", "lm_eval", "run", "--model", "hf", "--model_args", f"pretrained={model_dir},dtype={dtype}",
               "--tasks", ",".join(TASKS), "--include_path", str(tasks), "--output_path", str(output), "--batch_size", str(CONCURRENT_REQUESTS),
               "--device", "cpu"]
    started = time.perf_counter()
    done = subprocess.run(command, env={**os.environ, **OFFLINE}, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"lm_eval --model hf failed:\n{done.stderr[-3000:]}")
    results = json.loads(sorted(output.rglob("results_*.json"))[-1].read_text())["results"]
    scores = {f"lm_eval/{task}/{metric.split(',')[0]}": value for task, found in results.items()
              for metric, value in found.items() if metric.endswith(",none") and "stderr" not in metric}
    return elapsed, scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=100, help="documents of the multiple-choice task (default 100)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of (server, lm-eval alone), order reversed every round")
    parser.add_argument("--models-dir", default=None, help="where the converted SmolLM2 folder is kept (default: a temp dir)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from finetune_studio.child.precision import decide_precision
    from finetune_studio.cli.demo import prepare_smollm2

    gguf = smollm2_gguf()
    dtype = {"bf16": "bfloat16", "fp32": "float32"}[decide_precision("auto").dtype]
    print(machine_line())
    print(load_average("before") + "\n", flush=True)
    served: list[float] = []
    own: list[float] = []
    with tempfile.TemporaryDirectory(prefix="finetune-studio-bench-lm-eval-") as tmp:
        work = Path(tmp)
        model_dir = prepare_smollm2(gguf, Path(args.models_dir).expanduser() if args.models_dir else work / "models")
        tasks = task_folder(work, args.docs)
        with server(work / "data", env=OFFLINE) as (url, _), httpx.Client(base_url=url, timeout=1800) as http:
            job_id, _adapter = train(url, http, model_dir)  # the base model is served as `base:<job>`
            for round_ in range(args.rounds):
                for side in (["server", "alone"] if round_ % 2 == 0 else ["alone", "server"]):
                    if side == "server":
                        seconds, server_scores = through_server(url, f"base:{job_id}", tasks)
                        served.append(seconds)
                        print(f"  round {round_ + 1}: through the server {seconds:.1f} s {server_scores}", flush=True)
                    else:
                        seconds, own_scores = alone(model_dir, tasks, dtype, work / f"hf-{round_}")
                        own.append(seconds)
                        print(f"  round {round_ + 1}: lm-eval hf {seconds:.1f} s {own_scores}", flush=True)
    ratio = median(served) / median(own)
    rows = [
        ("precision", dtype, "", ""),
        (f"through the server: POST /eval/start to `completed` ({args.docs} + {max(args.docs // 4, 1)} documents)",
         f"{median(served):,.1f} s", "", ""),
        (f"lm-eval alone: python -m lm_eval run --model hf --batch_size {CONCURRENT_REQUESTS}", f"{median(own):,.1f} s", "", ""),
        ("server / lm-eval alone", f"{ratio:.3f}", "", "reported"),
        ("the same, median of the rounds' own ratios", f"{median([s / o for s, o in zip(served, own, strict=True)]):.3f}", "", ""),
    ]
    print(table(f"lm-eval on SmolLM2-135M-Instruct: {', '.join(TASKS)} ({args.rounds} rounds, medians)", rows))
    print(f"rounds (seconds): server {', '.join(f'{s:.1f}' for s in served)}; alone {', '.join(f'{o:.1f}' for o in own)}")
    print(load_average("after"))


if __name__ == "__main__":
    main()
