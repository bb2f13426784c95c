"""Issue 6, item 8: overhead and throughput on a GPU, with a Llama-shaped model of
about 1B parameters and random bf16 weights, through the real server.

    python bench/gpu.py            # on a CUDA machine (an H200: about 6 minutes)
    python bench/gpu.py --smoke    # the same flow with a tiny shape, to check it on a CPU

Prints the tables to record in docs/BENCHMARKS.md:
- overhead: the bare TRL script (bench/bare_trl.py) and the same run as a job,
  alternating, as in bench/run.py;
- throughput with and without packing: tokens/s from the progress events (the
  tokens TRL counts, padding excluded; the first quarter of the steps left out as
  warm-up), the model FLOP/s that makes, and its fraction of the GPU's bf16 peak.

Model FLOPs per token: 6 x (the matmul parameters: all but the input embedding,
plus the output projection) + 12 x layers x hidden x sequence length (attention),
the usual convention. LoRA computes no gradients for the frozen weights, so the
hardware does about two thirds of that; both fractions are printed.

Run it where `pip install -e ".[train]"` has been done. On the project's lent H200
machine (no network; torch, transformers, peft and accelerate are there) the rest
travels as Python 3.12 wheels, as ../.library/device/README.md describes: at least
trl, datasets (with dill, multiprocess), fastapi, starlette, pydantic,
pydantic-core, pydantic-settings, python-dotenv, annotated-types,
typing-inspection, opentelemetry-api, uvicorn and httptools, then the package
itself with `pip install --no-deps -e .`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import job_request, server, start_job, table  # noqa: E402
from run import BENCH_DIR, follow  # noqa: E402

SHAPE_1B = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8}
SHAPE_SMOKE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
H200_BF16_PEAK = 790e12  # dense bf16 FLOP/s


def make_text_data(path: Path, rows: int, max_words: int, seed: int = 0) -> Path:
    """Rows of random words from the tiny tokenizer's corpus, of lengths spread from
    an eighth of max_words to max_words (so that packing has gaps to fill)."""
    from finetune_studio.child.tiny_model import _CORPUS

    words = _CORPUS.split()
    rng = random.Random(seed)
    with path.open("w") as handle:
        for _ in range(rows):
            count = rng.randint(max_words // 8, max_words)
            handle.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(count))}) + "\n")
    return path


def matmul_parameters(model_dir: Path) -> tuple[int, dict]:
    config = json.loads((model_dir / "config.json").read_text())
    d, layers, inter = config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]
    kv = d * config["num_key_value_heads"] // config["num_attention_heads"]
    per_layer = d * d * 2 + d * kv * 2 + d * inter * 3  # q, o; k, v; gate, up, down
    return layers * per_layer + d * config["vocab_size"], config


def mean_tokens(model_dir: Path, data: Path, max_length: int) -> float:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lengths = [min(len(tokenizer(json.loads(line)["text"])["input_ids"]), max_length) for line in data.open()]
    return statistics.mean(lengths)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="a tiny shape and few steps, to check the flow on a CPU")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--max-length", type=int, default=None)
    parser.add_argument("--pairs", type=int, default=2, help="alternating bare/job pairs for the overhead")
    args = parser.parse_args()
    steps = args.steps or (6 if args.smoke else 60)
    batch = args.batch or (2 if args.smoke else 16)
    max_length = args.max_length or (64 if args.smoke else 2048)

    import torch

    from finetune_studio.child.tiny_model import build_tiny_model

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (no CUDA)"
    print(f"device: {device}; torch {torch.__version__}\n", flush=True)
    with tempfile.TemporaryDirectory(prefix="finetune-studio-gpu-") as tmp:
        work = Path(tmp)
        started = time.monotonic()
        model = build_tiny_model(work / "model", shape=SHAPE_SMOKE if args.smoke else SHAPE_1B, dtype="bfloat16")
        params, config = matmul_parameters(model)
        data = make_text_data(work / "text.jsonl", rows=max(steps * batch, 64), max_words=max_length)
        row_tokens = mean_tokens(model, data, max_length)
        print(f"(model: {params / 1e9:.2f}B matmul parameters, built in {time.monotonic() - started:.0f} s)\n", flush=True)

        request = {"format_type": "raw", "local_datasets": [str(data)], "batch_size": batch, "max_seq_length": max_length,
                   "gradient_checkpointing": "false", "optim": "adamw_torch", "max_steps": steps}
        bare_command = [sys.executable, str(BENCH_DIR / "bare_trl.py"), str(model), str(data), str(steps),
                        "--format", "raw", "--batch", str(batch), "--max-length", str(max_length)]
        rows = []
        with server(work / "server") as (url, _):
            bare, job = [], []
            for _ in range(args.pairs):
                started = time.monotonic()
                subprocess.run(bare_command, check=True, capture_output=True)
                bare.append(time.monotonic() - started)
                started = time.monotonic()
                final: dict = {}
                follow(url, start_job(url, job_request(model, **request)),
                       lambda i, k, d, t: final.update(json.loads(d)) if k == b"status" else None)
                job.append(time.monotonic() - started)
                assert final.get("phase") == "completed", final
            ratio = statistics.median(job) / statistics.median(bare)
            overhead = table(f"Overhead on {device}: {steps} LoRA steps, batch {batch}, rows up to {max_length} tokens ({args.pairs} alternating pairs)", [
                ("bare TRL script, median wall time", f"{statistics.median(bare):.1f} s", "", ""),
                ("finetune-studio job, median wall time", f"{statistics.median(job):.1f} s", "", ""),
                ("job / bare", f"{ratio:.3f}", "<= 1.05", "met" if ratio <= 1.05 else "MISSED"),
            ])
            for packing in (False, True):
                samples: list[dict] = []
                job_id = start_job(url, job_request(model, **request, packing=packing))
                follow(url, job_id, lambda i, k, d, t: samples.append(json.loads(d)) if k == b"progress" else None)
                first, last = samples[len(samples) // 4], samples[-1]
                rate = (last["num_tokens"] - first["num_tokens"]) / (last["elapsed_seconds"] - first["elapsed_seconds"])
                context = max_length if packing else row_tokens
                flops = rate * (6 * params + 12 * config["num_hidden_layers"] * config["hidden_size"] * context)
                rows.append((f"packing={packing}: tokens/s", f"{rate:,.0f}", "", ""))
                rows.append((f"packing={packing}: model FLOP/s (6N + attention)", f"{flops / 1e12:,.1f} TFLOP/s", "", ""))
                rows.append((f"packing={packing}: fraction of the H200's bf16 peak (790 TFLOP/s); LoRA's own share about 2/3 of it",
                             f"{flops / H200_BF16_PEAK:.1%} ({flops * 2 / 3 / H200_BF16_PEAK:.1%})", "", ""))
        print(overhead, flush=True)
        print(table(f"Throughput on {device}: {params / 1e9:.2f}B Llama shape, random bf16 weights, batch {batch}, "
                    f"max_seq_length {max_length} (rows {row_tokens:.0f} tokens on average)", rows), flush=True)


if __name__ == "__main__":
    main()
