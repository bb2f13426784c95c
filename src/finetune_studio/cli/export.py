"""`finetune-studio export JOB_ID --merged DIR`: a merged 16-bit model that loads anywhere.

For a LoRA job, the base model is loaded exactly as the job loaded it (folder,
GGUF or hub id, from the job's `job.json`), the adapter is merged into its
weights, and the result is saved in safetensors with the tokenizer. A full
fine-tuning job's model is cast to 16 bits. The output folder appears complete or
not at all.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from finetune_studio.training.models import ModelSource, load_tokenizer_and_model
from finetune_studio.training.recipe import JOB_FILE


class ExportError(Exception):
    pass


def find_job_dir(job: str, data_dir: Path) -> Path:
    """A job id under data_dir/jobs, or a job folder given by path."""
    for candidate in (Path(job).expanduser(), data_dir / "jobs" / job):
        if (candidate / JOB_FILE).is_file():
            return candidate
    raise ExportError(
        f"no trained job {job!r}: expected {data_dir / 'jobs' / job / JOB_FILE} (a job writes it once it starts"
        " training); pass --data-dir if the server uses another data directory"
    )


def export_merged(job_dir: Path, out_dir: Path, dtype_name: str = "bfloat16") -> Path:
    import torch

    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype_name]
    record = json.loads((job_dir / JOB_FILE).read_text())
    out_dir = out_dir.expanduser().resolve()
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ExportError(f"{out_dir} exists and is not empty; name a new folder")
    partial = out_dir.with_name(f".{out_dir.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)

    if record["method"] == "lora":
        adapter = job_dir / "adapter"
        if not (adapter / "adapter_config.json").is_file():
            raise ExportError(f"{adapter} holds no adapter: the job has not finished saving one")
        from peft import PeftModel

        source = ModelSource(**record["base_model"])
        tokenizer, base = load_tokenizer_and_model(source, dtype=torch.float32, trust_remote_code=record.get("trust_remote_code", False))
        model = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    else:
        folder = job_dir / "model"
        if not (folder / "config.json").is_file():
            raise ExportError(f"{folder} holds no model: the job has not finished saving one")
        tokenizer, model = load_tokenizer_and_model(ModelSource("folder", str(folder)), dtype=torch.float32)

    model = model.to(dtype)
    model.save_pretrained(str(partial), safe_serialization=True)
    tokenizer.save_pretrained(str(partial))
    if out_dir.exists():
        out_dir.rmdir()
    os.replace(partial, out_dir)
    return out_dir
