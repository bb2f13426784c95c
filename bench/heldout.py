"""Evaluation benchmark (issue 27): a `heldout` evaluation through the server against the same
answers produced by transformers' `generate` by hand.

    .venv/bin/python bench/heldout.py                       # 200 rows, base against a fine-tuned job
    .venv/bin/python bench/heldout.py --rows 50 --rounds 1 --unbatched-rows 10
    .venv/bin/python bench/heldout.py --models-dir DIR      # keep the converted SmolLM2 folder

A real `finetune-studio serve` trains a 2-step LoRA job on SmolLM2-135M-Instruct (the demo's
GGUF, dequantized into a folder), then, in rounds whose order reverses every round:

- **through the server**: `POST /eval/start` with models `base:<job>` and `<job>` and one
  `heldout` suite over `--rows` chat rows (a question and its reference answer), answers of
  64 tokens (`max_new_tokens`, greedy). Wall time from the request to the evaluation's
  `completed` on `/eval/stream`: the evaluation child's start, the chat child's start and
  model load, every row's loss pass (`/v1/completions` with `echo`) and greedy answer
  (`/v1/chat/completions`), the metrics and their intervals.
- **by hand, batched**: a fresh Python process that loads the model in the chat child's
  precision, answers every row's conversation (the same chat template, greedy, 64 new
  tokens, stopping at the end of turn) in batches of the evaluation's concurrency
  (`evaluation.common.CONCURRENT_REQUESTS`, left-padded), loads the adapter with peft and
  answers them all again. Its wall time includes its imports and loads, as the server's
  includes its children's.

Then, once, **by hand one at a time** (batch 1) over the first `--unbatched-rows` rows of
each model, scaled to `--rows`: the speed-up of the server's evaluation over an unbatched
script.

Budget (issue 27): server / by hand batched <= 1.2, on medians. The server's side does more
(the loss pass, the metrics); the by-hand side only the answers.
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
from common import load_average, machine_line, median, server, smollm2_gguf, table, verdict  # noqa: E402
from finetune_studio.evaluation.common import CONCURRENT_REQUESTS  # noqa: E402

TOKENS = 64
BUDGET = 1.2
TERMINAL = ("completed", "error", "stopped")
TOPICS = ["the river", "the market", "a low-rank adapter", "the harvest", "the committee", "mixed precision",
          "the harbour", "a dataset row", "the library", "the old town", "a fishing boat", "the weather"]
ASKS = ["Tell me about {}.", "Write two sentences about {}.", "What do you know about {}?", "Describe {} briefly."]


def write_rows(path: Path, count: int) -> Path:
    """`count` chat rows: a question and a reference answer, each row different."""
    with path.open("w") as out:
        for i in range(count):
            topic = TOPICS[i % len(TOPICS)]
            question = ASKS[(i // len(TOPICS)) % len(ASKS)].format(topic) + f" (question {i + 1})"
            answer = f"Here is what I know about {topic}: it matters to many people, and it changes with the seasons."
            out.write(json.dumps({"messages": [{"role": "user", "content": question},
                                               {"role": "assistant", "content": answer}]}) + "\n")
    return path


def through_server(url: str, job_id: str, rows: Path, count: int) -> float:
    body = {"models": [f"base:{job_id}", job_id], "label": "bench",
            "suites": [{"type": "heldout", "data": [str(rows)], "max_new_tokens": TOKENS, "limit": count}]}
    started = time.perf_counter()
    with httpx.Client(base_url=url, timeout=httpx.Timeout(60, read=None)) as http:
        answer = http.post("/eval/start", json=body)
        if answer.status_code != 200:
            sys.exit(f"/eval/start answered {answer.status_code}: {answer.text}")
        eval_id = answer.json()["eval_id"]
        with http.stream("GET", f"/eval/stream/{eval_id}") as stream:
            for line in stream.iter_lines():
                if line.startswith("data: ") and '"phase"' in line:
                    phase = json.loads(line[6:]).get("phase")
                    if phase in TERMINAL:
                        elapsed = time.perf_counter() - started
                        if phase != "completed":
                            sys.exit(f"the evaluation ended {phase}: {line}")
                        return elapsed
    sys.exit("the evaluation's stream ended before its end")


BY_HAND = r'''
import json, sys, time
started = time.perf_counter()
import torch
from peft import PeftModel
from finetune_studio.child.models import ModelSource, load_tokenizer_and_model
from finetune_studio.child.precision import decide_precision, torch_dtype

model_dir, adapter, rows_path, count, batch, tokens = sys.argv[1:7]
count, batch, tokens = int(count), int(batch), int(tokens)
choice = decide_precision("auto")
tokenizer, model = load_tokenizer_and_model(ModelSource("folder", model_dir), dtype=torch_dtype(choice))
model.eval()
tokenizer.padding_side = "left"
if tokenizer.pad_token_id is None:
    tokenizer.pad_token = tokenizer.eos_token
rows = [json.loads(line) for line in open(rows_path)][:count]
prompts = [tokenizer.apply_chat_template(row["messages"][:-1], add_generation_prompt=True, tokenize=False) for row in rows]
end_of_turn = [t for t in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")} if isinstance(t, int) and t >= 0]


def answer_all(model):
    made = 0
    for first in range(0, len(prompts), batch):
        inputs = tokenizer(prompts[first:first + batch], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            output = model.generate(**inputs, max_new_tokens=tokens, do_sample=False, eos_token_id=end_of_turn,
                                    pad_token_id=tokenizer.pad_token_id)
        made += int((output[:, inputs["input_ids"].shape[1]:] != tokenizer.pad_token_id).sum())
    return made


made = answer_all(model)
model = PeftModel.from_pretrained(model, adapter).eval()
made += answer_all(model)
print(json.dumps({"seconds": time.perf_counter() - started, "tokens": made, "dtype": choice.dtype}))
'''


def by_hand(model_dir: Path, adapter: str, rows: Path, count: int, batch: int) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", BY_HAND, str(model_dir), adapter, str(rows), str(count), str(batch), str(TOKENS)],
                          capture_output=True, text=True, check=False, env={**os.environ, "TQDM_DISABLE": "1"})
    if done.returncode != 0:
        sys.exit(f"the by-hand script failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200, help="rows of the heldout suite (default 200)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of (server, by hand), order reversed every round (default 2)")
    parser.add_argument("--unbatched-rows", type=int, default=20, help="rows answered one at a time, scaled to --rows (default 20)")
    parser.add_argument("--models-dir", default=None, help="where the converted SmolLM2 folder is kept (default: a temp dir)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from finetune_studio.cli.demo import prepare_smollm2

    gguf = smollm2_gguf()
    print(machine_line())
    print(load_average("before") + "\n", flush=True)
    served: list[float] = []
    hand: list[float] = []
    dtype = ""
    with tempfile.TemporaryDirectory(prefix="finetune-studio-bench-heldout-") as tmp:
        work = Path(tmp)
        model_dir = prepare_smollm2(gguf, Path(args.models_dir).expanduser() if args.models_dir else work / "models")
        rows = write_rows(work / "heldout.jsonl", args.rows)
        with server(work / "data") as (url, _), httpx.Client(base_url=url, timeout=1800) as http:
            job_id, adapter = train(url, http, model_dir)
            for round_ in range(args.rounds):
                order = ["server", "hand"] if round_ % 2 == 0 else ["hand", "server"]
                for side in order:
                    if side == "server":
                        served.append(through_server(url, job_id, rows, args.rows))
                        print(f"  round {round_ + 1}: server {served[-1]:.1f} s", flush=True)
                    else:
                        found = by_hand(model_dir, adapter, rows, args.rows, CONCURRENT_REQUESTS)
                        hand.append(float(found["seconds"]))
                        dtype = str(found["dtype"])
                        print(f"  round {round_ + 1}: by hand {hand[-1]:.1f} s ({found['tokens']} tokens)", flush=True)
            one_by_one = by_hand(model_dir, adapter, rows, args.unbatched_rows, 1)
            print(f"  one at a time, {args.unbatched_rows} rows of each model: {one_by_one['seconds']:.1f} s", flush=True)
    ratio = median(served) / median(hand)
    ratios = [s / h for s, h in zip(served, hand, strict=True)]
    unbatched = float(one_by_one["seconds"]) * args.rows / args.unbatched_rows
    rows_out = [
        ("precision of the chat child and of the script", dtype, "", ""),
        (f"through the server: POST /eval/start to `completed` ({args.rows} rows x 2 models)", f"{median(served):,.1f} s", "", ""),
        (f"by hand: generate in batches of {CONCURRENT_REQUESTS}, a fresh process", f"{median(hand):,.1f} s", "", ""),
        ("server / by hand batched", f"{ratio:.3f}", f"<= {BUDGET}", verdict(ratio <= BUDGET)),
        ("the same, median of the rounds' own ratios", f"{median(ratios):.3f}", "", ""),
        (f"by hand one at a time ({args.unbatched_rows} rows of each model, scaled to {args.rows})", f"{unbatched:,.1f} s", "", ""),
        ("speed-up of the server over one at a time", f"{unbatched / median(served):.2f}x", "", "reported"),
    ]
    print(table(f"Heldout evaluation: SmolLM2-135M-Instruct, base against a LoRA job, {args.rows} rows, {TOKENS}-token greedy"
                f" answers ({args.rounds} rounds, medians)", rows_out))
    print(f"rounds (seconds): server {', '.join(f'{s:.1f}' for s in served)}; by hand {', '.join(f'{h:.1f}' for h in hand)}")
    print(load_average("after"))


if __name__ == "__main__":
    main()
