"""A training job's result as one model: the adapter merged into its base, saved as safetensors.

For a LoRA job, the base model is loaded exactly as the job loaded it (folder, GGUF
or hub id, from the job's `job.json`) and the adapter is merged into its weights one
layer at a time (so a caller can report progress and honour a stop between layers).
A full fine-tuning job's model is the result as it is. Saved with the tokenizer and
its chat template, in 16 bits, in a folder that appears complete or not at all.

`finetune-studio export --merged` and the export child both use it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_studio.atomic import save_atomically
from finetune_studio.child.models import ModelSource, load_tokenizer_and_model
from finetune_studio.wire import JobFolder

DTYPES = ("bfloat16", "float16", "float32")


class MergeError(Exception):
    """The job's result cannot be merged; the message says why and what to do."""


@dataclass(frozen=True)
class JobRecord:
    """What a training job wrote about itself in job.json."""

    folder: JobFolder
    method: str  # "lora" or "full"
    base: ModelSource
    trust_remote_code: bool

    @classmethod
    def read(cls, job_dir: Path) -> JobRecord:
        folder = JobFolder(job_dir)
        try:
            record = json.loads(folder.job_file.read_text())
            return cls(
                folder=folder,
                method=str(record["method"]),
                base=ModelSource(**record["base_model"]),
                trust_remote_code=bool(record.get("trust_remote_code", False)),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise MergeError(f"cannot read {folder.job_file} ({exc}); export a job that finished training") from None

    @property
    def result(self) -> Path:
        """The adapter (LoRA) or model (full fine-tuning) folder the job saved."""
        if self.method == "lora":
            if not (self.folder.adapter / "adapter_config.json").is_file():
                raise MergeError(f"{self.folder.adapter} holds no adapter: the job has not finished saving one")
            return self.folder.adapter
        if not (self.folder.model / "config.json").is_file():
            raise MergeError(f"{self.folder.model} holds no model: the job has not finished saving one")
        return self.folder.model


def torch_dtype(name: str) -> Any:
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def load_merged(
    record: JobRecord,
    *,
    on_layer: Callable[[int, int], None] = lambda done, total: None,
) -> tuple[Any, Any]:
    """(tokenizer, model) with the job's result in the weights, in float32.

    on_layer(done, total) is called after each adapted layer is merged; it may raise
    (a stop) to abandon the merge."""
    import torch

    result = record.result
    if record.method != "lora":
        return load_tokenizer_and_model(ModelSource("folder", str(result)), dtype=torch.float32)

    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    tokenizer, base = load_tokenizer_and_model(record.base, dtype=torch.float32, trust_remote_code=record.trust_remote_code)
    model = PeftModel.from_pretrained(base, str(result))
    layers = [module for module in model.modules() if isinstance(module, LoraLayer)]
    on_layer(0, len(layers))
    with torch.no_grad():
        for done, layer in enumerate(layers, start=1):
            layer.merge()
            on_layer(done, len(layers))
    # Every adapted layer holds its merged weights now: unloading swaps each for its
    # base layer (the same as merge_and_unload, done a layer at a time above).
    return tokenizer, model.unload()


def save_merged(tokenizer: Any, model: Any, out_dir: Path, dtype_name: str = "bfloat16", *, flush: bool = True) -> Path:
    """Save in safetensors with the tokenizer (its chat template included) as out_dir,
    written as `.NAME.partial` and renamed (`flush=False`: a work folder, atomic.py)."""
    model = model.to(torch_dtype(dtype_name))
    with save_atomically(out_dir, flush=flush) as partial:
        model.save_pretrained(str(partial), safe_serialization=True)
        tokenizer.save_pretrained(str(partial))
    return out_dir


def export_merged(job_dir: Path, out_dir: Path, dtype_name: str = "bfloat16") -> Path:
    """`finetune-studio export --merged`: merge a job's result into out_dir (new or empty)."""
    out_dir = out_dir.expanduser().resolve()
    if out_dir.exists() and any(out_dir.iterdir()):
        raise MergeError(f"{out_dir} exists and is not empty; name a new folder")
    tokenizer, model = load_merged(JobRecord.read(job_dir))
    return save_merged(tokenizer, model, out_dir, dtype_name)
