"""Loss parity of bf16 against fp32 on SmolLM2-135M (issue 26, item 2): a 200-step LoRA run in
each precision, training and evaluation losses within 3%.

    .venv/bin/python bench/precision_parity.py [--steps 200] [--workdir DIR]

A real server trains SmolLM2-135M (the demo's GGUF, dequantized into a folder) with LoRA (r 16
on every projection, adamw_torch, seed 3407) on raw text rows cut to 128 tokens, batch 1, once
with `precision: "auto"` (bf16 on a CPU with AMX or AVX512-BF16) and once with `"fp32"`, both
`compile: false`, the same rows in the same order. Compared: the mean of the last 10 training
losses (the progress events' `loss`), and the final evaluation loss over 24 other rows
(`details.eval_loss`). The tiny model's 60-step bound is a slow test in CI
(tests/integration/test_precision.py); this is the same check at the demo's size.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import load_average, machine_line, server, smollm2_gguf, table, verdict  # noqa: E402
from precision import SENTENCES, request, run_job  # noqa: E402

BOUND = 0.03
ROW_TOKENS = 128
TAIL = 10


def write_rows(path: Path, count: int, offset: int) -> Path:
    rows = []
    for i in range(offset, offset + count):
        text = " ".join(SENTENCES[(i * 3 + k) % len(SENTENCES)] for k in range(12))
        rows.append(json.dumps({"text": f"Passage {i}. {text}"}))
    path.write_text("\n".join(rows) + "\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--workdir", default=None, help="keeps the converted model folder for the next run (default: a temp dir)")
    args = parser.parse_args()
    from finetune_studio.cli.demo import prepare_smollm2

    gguf = smollm2_gguf()
    print(machine_line())
    print(load_average("before") + "\n", flush=True)
    found: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="finetune-studio-bench-parity-") as tmp:
        work = Path(args.workdir).expanduser() if args.workdir else Path(tmp)
        model = prepare_smollm2(gguf, work / "models")
        train = write_rows(Path(tmp) / "train.jsonl", 240, 0)
        evaluation = write_rows(Path(tmp) / "eval.jsonl", 24, 1000)
        with server(Path(tmp) / "data") as (url, _), httpx.Client(base_url=url, timeout=60) as http:
            for precision in ("auto", "fp32"):
                body = {**request(model, train, precision, args.steps), "batch_size": 1, "max_seq_length": ROW_TOKENS,
                        "local_eval_datasets": [str(evaluation)]}
                job = run_job(http, body)
                losses = [p["loss"] for p in job["progress"] if p.get("loss") is not None]
                details = job["status"]["details"]
                found[precision] = {"dtype": details["precision"]["dtype"], "train": sum(losses[-TAIL:]) / TAIL,
                                    "eval": details.get("eval_loss"), "first": losses[0]}
                print(f"  {precision}: {found[precision]}", flush=True)
    auto, fp32 = found["auto"], found["fp32"]
    train_gap = abs(auto["train"] - fp32["train"]) / fp32["train"]
    eval_gap = abs(auto["eval"] - fp32["eval"]) / fp32["eval"]
    rows = [
        ("precision auto ran in", auto["dtype"], "", ""),
        ("first training loss, auto / fp32", f"{auto['first']:.4f} / {fp32['first']:.4f}", "", ""),
        (f"mean of the last {TAIL} training losses, auto / fp32", f"{auto['train']:.4f} / {fp32['train']:.4f}", "", ""),
        ("  relative difference", f"{train_gap:.2%}", f"<= {BOUND:.0%}", verdict(train_gap <= BOUND)),
        ("final evaluation loss, auto / fp32", f"{auto['eval']:.4f} / {fp32['eval']:.4f}", "", ""),
        ("  relative difference", f"{eval_gap:.2%}", f"<= {BOUND:.0%}", verdict(eval_gap <= BOUND)),
    ]
    print(table(f"Loss parity: SmolLM2-135M LoRA, {args.steps} steps of batch 1 x {ROW_TOKENS} tokens, bf16 against fp32", rows))
    print(load_average("after"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
