"""Batched chat benchmark (issue 26): many chats at once through the chat API, against
one alone, and one alone against transformers' own `generate`.

    .venv/bin/python bench/batched_chat.py                     # SmolLM2-135M, 1/2/8/16 streams (about 10 minutes)
    .venv/bin/python bench/batched_chat.py --streams 2 8 --reps 1
    .venv/bin/python bench/batched_chat.py --precision fp32    # the chat child's precision (default: the server's)
    .venv/bin/python bench/batched_chat.py --models-dir DIR    # keep the converted SmolLM2 folder for the next run

A real `finetune-studio serve` trains a 2-step LoRA job on SmolLM2-135M-Instruct (so
that its base model is served, and an adapter on it), then measures:

- **one stream against bare generate**: a non-streamed request for 64 tokens at
  temperature 0 through `POST /v1/chat/completions` (HTTP, the server, the pipe, the
  chat child's step loop), against `model.generate(do_sample=False,
  max_new_tokens=64)` in this process, loaded in the chat child's precision;
  alternating, medians, prefill included on both sides (as bench/chat.py does).
- **N streams at once** (N = 1, 2, 8, 16): N streamed requests sent together, each
  for 64 tokens at temperature 0, over prompts of different lengths. Aggregate
  decode tokens/s = every answer's completion tokens / the time from the first
  request sent to the end of the last answer (prefills included); the ratio is to
  the same measure for N = 1. Time to first text: from sending a request to its
  first chunk with text, under that load (median and max of the N).
- **with an adapter loaded** (measured last, since a base answer then runs through
  peft's layers, switched off): one stream of the base against bare generate again,
  and 8 streams, half the base and half the job's adapter (peft's mixed-adapter
  batch), against one stream.

Budget (issue 26): 8 streams >= 4x one stream in bf16; one stream through the API >=
0.95x bare generate. Run it on a quiet machine: two processes contend for the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chat import train  # noqa: E402
from common import load_average, machine_line, median, server, smollm2_gguf, table, verdict  # noqa: E402

PROMPTS = [
    "Write a long story about a ship at sea.",
    "Tell me a long tale about a dragon who learns to cook, with many twists and a surprising ending.",
    "Describe a walk through an old city at night.",
    "Write a long story about a robot who wants to become a gardener, told by its neighbour over many years.",
]
TOKENS = 64
STREAMS = [2, 8, 16]
BATCH_BUDGET = {8: 4.0}
SINGLE_BUDGET = 0.95


@dataclass
class Answer:
    sent: float
    first: Optional[float]  # the first chunk with text
    ended: float
    tokens: int


async def stream_one(client: httpx.AsyncClient, model: str, prompt: str) -> Answer:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": TOKENS, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    first: Optional[float] = None
    tokens = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            sys.exit(f"the chat API answered {response.status_code}: {(await response.aread()).decode()}")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and any(choice["delta"].get("content") for choice in chunk["choices"]):
                first = time.perf_counter()
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    return Answer(sent, first, time.perf_counter(), tokens)


async def burst(url: str, models: list[str]) -> list[Answer]:
    limits = httpx.Limits(max_connections=len(models) + 4, max_keepalive_connections=len(models) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as client:
        return list(await asyncio.gather(*(stream_one(client, model, PROMPTS[i % len(PROMPTS)])
                                           for i, model in enumerate(models))))


def aggregate(answers: list[Answer]) -> float:
    """Completion tokens per second over the whole burst."""
    return sum(a.tokens for a in answers) / (max(a.ended for a in answers) - min(a.sent for a in answers))


def first_texts(answers: list[Answer]) -> list[float]:
    return [a.first - a.sent for a in answers if a.first is not None]


class Bare:
    """The model in this process, in the chat child's precision, generating as a script would."""

    def __init__(self, model_dir: Path, precision: str) -> None:
        import torch

        from finetune_studio.child.models import ModelSource, load_tokenizer_and_model
        from finetune_studio.child.precision import decide_precision, torch_dtype

        self.choice = decide_precision(precision)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer, model = load_tokenizer_and_model(ModelSource("folder", str(model_dir)), dtype=torch_dtype(self.choice))
        self.model: Any = model.to(self.device).eval()

    def answer(self) -> tuple[int, float]:
        import torch

        started = time.perf_counter()
        inputs = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": PROMPTS[0]}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        ).to(self.device)
        with torch.inference_mode():
            output = self.model.generate(**inputs, max_new_tokens=TOKENS, do_sample=False,
                                         pad_token_id=self.tokenizer.pad_token_id)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return int(output.shape[1] - inputs["input_ids"].shape[1]), time.perf_counter() - started


def api_answer(http: httpx.Client, model: str) -> tuple[int, float]:
    body = {"model": model, "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": TOKENS, "temperature": 0}
    started = time.perf_counter()
    response = http.post("/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        sys.exit(f"the chat API answered {response.status_code}: {response.text}")
    return int(response.json()["usage"]["completion_tokens"]), elapsed


def rate(samples: list[tuple[int, float]]) -> float:
    return samples[0][0] / median([seconds for _, seconds in samples])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="*", default=STREAMS, help="concurrent streams to measure (default 2 8 16)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each measure (default 3)")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default=None,
                        help="the chat child's precision (FINETUNE_STUDIO_INFERENCE_PRECISION; default: the server's own)")
    parser.add_argument("--models-dir", default=None, help="where the converted SmolLM2 folder is kept (default: a temp dir)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TQDM_DISABLE", "1")
    from finetune_studio.cli.demo import prepare_smollm2

    gguf = smollm2_gguf()
    print(machine_line())
    print(load_average("before") + "\n", flush=True)
    env = {"FINETUNE_STUDIO_INFERENCE_PRECISION": args.precision} if args.precision else {}
    with tempfile.TemporaryDirectory(prefix="finetune-studio-bench-batched-") as tmp:
        work = Path(tmp)
        model_dir = prepare_smollm2(gguf, Path(args.models_dir).expanduser() if args.models_dir else work / "models")
        with server(work / "chat", env=env) as (url, _), httpx.Client(base_url=url, timeout=1800) as http:
            job_id, _adapter = train(url, http, model_dir)
            base = str(model_dir)
            api_answer(http, base)  # the chat child starts and loads the model (no adapter yet: as bench/chat.py)
            bare = Bare(model_dir, args.precision or "auto")
            bare.answer()
            api: list[tuple[int, float]] = []
            alone: list[tuple[int, float]] = []
            for _ in range(args.reps):
                api.append(api_answer(http, base))
                alone.append(bare.answer())
            print(f"  one stream: API {rate(api):.1f} tokens/s, bare generate {rate(alone):.1f} tokens/s", flush=True)
            single = rate(api) / rate(alone)
            counts = sorted({1, *args.streams})
            measured: dict[int, list[list[Answer]]] = {n: [] for n in counts}
            for rep in range(args.reps):  # each rep measures every count, so slow spells touch them all
                for n in counts:
                    measured[n].append(asyncio.run(burst(url, [base] * n)))
                    print(f"  rep {rep + 1}: {n} streams, {aggregate(measured[n][-1]):.1f} tokens/s", flush=True)
            # The adapter joins: base answers now run through peft's layers, switched off.
            api_answer(http, job_id)
            loaded: list[tuple[int, float]] = []
            alone_again: list[tuple[int, float]] = []
            for _ in range(args.reps):
                loaded.append(api_answer(http, base))
                alone_again.append(bare.answer())
            dtype = f"{bare.choice.dtype} ({bare.choice.reason})"
            del bare
            mixed: list[list[Answer]] = []
            if 8 in counts:
                for rep in range(args.reps):
                    mixed.append(asyncio.run(burst(url, [base, job_id] * 4)))
                    print(f"  rep {rep + 1}: 8 mixed streams, {aggregate(mixed[-1]):.1f} tokens/s", flush=True)
    one = median([aggregate(answers) for answers in measured[1]])
    rows: list[tuple[str, str, str, str]] = [
        ("precision of the chat child and of bare generate", dtype, "", ""),
        ("1 stream through POST /v1/chat/completions (non-streamed)", f"{rate(api):,.1f} tokens/s", "", ""),
        ("1 stream: transformers generate, one process", f"{rate(alone):,.1f} tokens/s", "", ""),
        ("1 stream: API / bare generate", f"{single:.3f}", f">= {SINGLE_BUDGET}", verdict(single >= SINGLE_BUDGET)),
        ("1 stream of the base once an adapter is loaded on it: API / bare generate",
         f"{rate(loaded) / rate(alone_again):.3f}", "", "reported"),
    ]
    for n in counts:
        value = median([aggregate(answers) for answers in measured[n]])
        ttft = [seconds for answers in measured[n] for seconds in first_texts(answers)]
        budget = BATCH_BUDGET.get(n)
        rows.append((f"{n} streams at once: aggregate tokens/s (x one stream)", f"{value:,.1f} ({value / one:.2f}x)",
                     f">= {budget:.0f}x" if budget else "", verdict(value / one >= budget) if budget else "reported"))
        rows.append((f"{n} streams at once: time to first text, median / max", f"{median(ttft) * 1000:,.0f} / {max(ttft) * 1000:,.0f} ms",
                     "", ""))
    if mixed:
        value = median([aggregate(answers) for answers in mixed])
        ttft = [seconds for answers in mixed for seconds in first_texts(answers)]
        rows.append(("8 streams, 4 base + 4 adapter (one mixed batch): aggregate tokens/s (x one stream)",
                     f"{value:,.1f} ({value / one:.2f}x)", "", "reported"))
        rows.append(("8 streams, mixed: time to first text, median / max", f"{median(ttft) * 1000:,.0f} / {max(ttft) * 1000:,.0f} ms",
                     "", ""))
    precision = args.precision or "auto (the server's default)"
    print(table(f"Batched chat: SmolLM2-135M-Instruct, {TOKENS} tokens at temperature 0, precision {precision}"
                f" ({args.reps} repetitions, medians)", rows))
    print(load_average("after"))


if __name__ == "__main__":
    main()
