"""Model FLOPs utilization (`mfu` in progress events): how much of the device's peak the
training uses, from the model's FLOPs per token and the tokens trained per second.

FLOPs per trained token (docs/EVENTS.md, Progress events):

    forward 2N + backward through the activations 2N + weight gradients 2N_trainable
    + attention 12 * layers * width * context

N counts the weights of the model's matrix multiplications (every linear layer, the
LM head and a LoRA adapter's A and B included; an embedding lookup is no matmul, a
tied LM head is counted once), N_trainable those among them that train (the
adapter's with LoRA: about 4N + 6N_adapter over the base's N; every one with full
fine-tuning: 6N). The attention term is the usual one (PaLM, appendix B: QK^T and
the attention-weighted values, forward and backward, without discount for the causal
mask), with width = heads x head size and context = the mean row length the step
trained on. Recomputation by gradient checkpointing is not counted (that would be
the hardware's utilization, not the model's).

The peak is measured, not looked up: a short matmul probe in the dtype the job
computes in (a few hundred ms), once per machine, kept in
~/.cache/finetune-studio/peak-flops.json (or $XDG_CACHE_HOME's) under the device
(CPU model and thread count, or GPU name) and the dtype. It is what a large square
matmul reaches here, so an MFU near 1 means the training runs as fast as this
device's matmuls can. A probe taken while other work shared the device reads low; a
run whose MFU comes out above 1 probes again (once) and keeps the higher figure, in
the cache too. Delete the file to measure afresh.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_studio.atomic import write_atomically
from finetune_studio.hardware import Dtype, read_cpuinfo

CACHE_FILE = "peak-flops.json"
PROBE_SECONDS = 0.3
# The probe's square matrices: large enough to reach the device's matmul peak, small
# enough that a few of them take a few hundred ms.
PROBE_SIZE = {"cpu": 1536, "cuda": 8192}


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "finetune-studio" / CACHE_FILE


@dataclass(frozen=True)
class ModelFlops:
    """What the FLOPs per token of a model's training depend on."""

    matmul_parameters: int  # N
    trainable_matmul_parameters: int  # N_trainable
    layers: int
    attention_width: int  # attention heads x head size

    def per_token(self, context: float) -> float:
        """Training FLOPs per token for rows of `context` tokens (see the module's docstring)."""
        n, trained = self.matmul_parameters, self.trainable_matmul_parameters
        return 4.0 * n + 2.0 * trained + 12.0 * self.layers * self.attention_width * max(context, 0.0)


def model_flops(model: Any) -> ModelFlops:
    """Count a model's matmul weights (a peft model's too) and read its attention's shape."""
    import torch

    seen: set[int] = set()
    total = trained = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):  # bitsandbytes' 4-bit layers are Linear too
            continue
        weight = module.weight
        if id(weight) in seen:  # a tied LM head is the embedding's matrix: once
            continue
        seen.add(id(weight))
        count = int(module.in_features) * int(module.out_features)  # not numel: a packed 4-bit weight holds half
        total += count
        if weight.requires_grad:
            trained += count
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    head_dim = getattr(config, "head_dim", None)
    width = heads * int(head_dim) if heads and isinstance(head_dim, int) and head_dim > 0 else hidden
    return ModelFlops(total, trained, layers, width)


@dataclass(frozen=True)
class Peak:
    """The device's peak matmul rate in a dtype: FLOPs per second, and where it came from."""

    flops: float
    dtype: Dtype
    device: str  # e.g. "cpu AMD EPYC, 2 threads", "cuda NVIDIA H200"
    measured: str  # "probe" (just now) or "cache"
    cuda: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"flops_per_second": float(f"{self.flops:.4g}"), "dtype": self.dtype, "device": self.device,
                "measured": self.measured}


def device_name(cuda: bool) -> str:
    """The cache's key for this process's device: its model, and on a CPU the threads torch uses."""
    import torch

    if cuda:
        return f"cuda {torch.cuda.get_device_name()}"
    model = read_cpuinfo()[1] or "unknown CPU"
    return f"cpu {model}, {torch.get_num_threads()} threads"


def probe(cuda: bool, dtype: Dtype, seconds: float = PROBE_SECONDS) -> float:
    """The best rate (FLOPs per second) of square matmuls in `dtype` over about `seconds`."""
    import torch

    device = "cuda" if cuda else "cpu"
    size = PROBE_SIZE[device]
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=torch_dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=torch_dtype, generator=generator)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.no_grad():
        torch.matmul(a, b)  # warm-up: kernels chosen, pages touched
        sync()
        best = math.inf
        repeats = 8 if cuda else 1  # a GPU's matmul is too short to time alone
        started = time.perf_counter()
        runs = 0
        while runs < 3 or time.perf_counter() - started < seconds:
            begin = time.perf_counter()
            for _ in range(repeats):
                torch.matmul(a, b)
            sync()
            best = min(best, (time.perf_counter() - begin) / repeats)
            runs += 1
            if runs >= 200:
                break
    return 2.0 * size**3 / best


def read_measured(path: Path) -> dict[str, Any]:
    """A cache of figures measured on this machine (a JSON object); empty where it is
    missing, unreadable or not an object: the figures are then measured again."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(key): value for key, value in found.items()} if isinstance(found, dict) else {}


def measured_numbers(found: Any) -> dict[str, float]:
    """The positive, finite numbers of a cached object (anything else in it is ignored)."""
    if not isinstance(found, dict):
        return {}
    return {str(k): float(v) for k, v in found.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0}


def _read_cache(path: Path) -> dict[str, float]:
    return measured_numbers(read_measured(path))


def peak_flops(cuda: bool, dtype: Dtype, path: Optional[Path] = None, *, again: bool = False) -> Peak:
    """This device's peak in `dtype`: from the cache, else probed now and cached. `again`:
    probe even when cached, and keep the higher of the two. A cache that cannot be
    written costs only the caching."""
    where = path or cache_path()
    device = device_name(cuda)
    key = f"{device} | {dtype}"
    before = _read_cache(where).get(key)
    if before is not None and not again:
        return Peak(before, dtype, device, "cache", cuda)
    flops = max(probe(cuda, dtype), before or 0.0)
    cached = {**_read_cache(where), key: flops}  # another job may have added its own meanwhile
    try:
        with write_atomically(where, unique=True) as partial:
            partial.write_text(json.dumps(cached, indent=1, sort_keys=True))
    except OSError:
        pass
    return Peak(flops, dtype, device, "probe", cuda)


class Utilization:
    """The MFU of a training run's steps: set up by the recipe with the device's peak,
    told the model and the data-parallel workers (each on a device like this one) when
    training begins."""

    def __init__(self, peak: Peak, path: Optional[Path] = None) -> None:
        self.peak = peak
        self.path = path  # the cache (None: cache_path())
        self.workers = 1
        self.flops: Optional[ModelFlops] = None
        self.probed_again = False

    def begin(self, model: Any, workers: int = 1) -> None:
        self.flops = model_flops(model) if model is not None else None
        self.workers = max(1, workers)

    def mfu(self, tokens_per_second: Optional[float], context: Optional[float]) -> Optional[float]:
        """MFU at a rate of `tokens_per_second` with rows of `context` tokens; None when unknown."""
        if self.flops is None or tokens_per_second is None or context is None or self.flops.matmul_parameters <= 0:
            return None
        achieved = self.flops.per_token(context) * tokens_per_second / self.workers
        if achieved > self.peak.flops and not self.probed_again:
            # More than the peak: the cached probe was taken on a busy device. Once per run.
            self.probed_again = True
            self.peak = peak_flops(self.peak.cuda, self.peak.dtype, self.path, again=True)
        value = achieved / self.peak.flops
        return float(f"{value:.4g}") if math.isfinite(value) and value > 0 else None
