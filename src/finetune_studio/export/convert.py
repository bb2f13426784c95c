"""llama.cpp's converters, run as they ship: a merged model, or a LoRA adapter, to GGUF.

`convert_hf_to_gguf.py` and `convert_lora_to_gguf.py` from the tools folder
(`export.tools`) run in a subprocess with the sdist's gguf-py first on the path.
They log each tensor as they plan it (`INFO:hf-to-gguf:blk.0.attn_q.weight, torch.float16
--> F16, shape = {576, 576}`), then the tensor count (`n_tensors = 272`), then write
the file under a tqdm bar (`Writing:  47%`): all three are read as progress.
"""

from __future__ import annotations

import json
import re
import struct
import sys
from collections.abc import Callable
from pathlib import Path

from finetune_studio.atomic import write_atomically
from finetune_studio.child.channel import StopSignal
from finetune_studio.export.process import run_tool
from finetune_studio.export.tools import LlamaCppTools

_PLANNED = re.compile(r"^INFO:[\w.-]+:(\S+),\s+\S+\s+-->\s+\S+, shape")
_COUNTED = re.compile(r"n_tensors = (\d+)")
_WRITING = re.compile(r"^Writing:\s+(\d+)%")

# on_progress(tensors planned, tensors in all, fraction of the bytes written)
ConvertProgress = Callable[[int, int, float], None]


def safetensors_count(folder: Path, *, lora: bool = False) -> int:
    """How many tensors the safetensors files of folder hold (read from their headers),
    an estimate of the converter's count until it says its own."""
    count = 0
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(size))
        names = [name for name in header if name != "__metadata__"]
        count += sum(1 for n in names if "lora_" in n) if lora else len(names)
    return count


class _Reader:
    """Turns the converter's lines into progress calls."""

    def __init__(self, estimate: int, on_progress: ConvertProgress) -> None:
        self.planned = 0
        self.total = max(estimate, 1)
        self.written = -1
        self.on_progress = on_progress

    def __call__(self, line: str) -> None:
        if _PLANNED.match(line):
            self.planned += 1
            self.total = max(self.total, self.planned)
            self.on_progress(self.planned, self.total, 0.0)
        elif match := _COUNTED.search(line):
            self.total = self.planned = int(match.group(1))
            self.on_progress(self.planned, self.total, 0.0)
        elif match := _WRITING.match(line):
            percent = int(match.group(1))
            if percent != self.written:  # tqdm repeats itself many times a second
                self.written = percent
                self.on_progress(self.planned, self.total, percent / 100)


def convert_model(
    tools: LlamaCppTools, model_dir: Path, target: Path, outtype: str, *, stop: StopSignal, on_progress: ConvertProgress,
    flush: bool = True,
) -> None:
    """Write target: the model folder model_dir as a GGUF file of outtype (f16, bf16); `flush=False`
    for a work file (atomic.py)."""
    reader = _Reader(safetensors_count(model_dir), on_progress)
    with write_atomically(target, flush=flush) as partial:
        run_tool(
            "convert_hf_to_gguf.py",
            [sys.executable, str(tools.convert_hf), str(model_dir), "--outtype", outtype, "--outfile", str(partial)],
            output=partial,
            stop=stop,
            on_line=reader,
            env=tools.script_env(),
        )


def convert_lora(
    tools: LlamaCppTools,
    adapter_dir: Path,
    base_config_dir: Path,
    target: Path,
    outtype: str,
    *,
    stop: StopSignal,
    on_progress: ConvertProgress,
) -> None:
    """Write target: the PEFT adapter as a LoRA GGUF (llama.cpp's `--lora`), for the base
    whose config.json is in base_config_dir (no weights needed, nothing fetched)."""
    reader = _Reader(safetensors_count(adapter_dir, lora=True), on_progress)
    with write_atomically(target) as partial:
        run_tool(
            "convert_lora_to_gguf.py",
            [sys.executable, str(tools.convert_lora), str(adapter_dir), "--base", str(base_config_dir),
             "--outtype", outtype, "--outfile", str(partial)],
            output=partial,
            stop=stop,
            on_line=reader,
            env=tools.script_env(),
        )
