"""`finetune-studio export JOB_ID --merged DIR`: a merged 16-bit model that loads anywhere.

For a LoRA job, the base model is loaded exactly as the job loaded it (folder,
GGUF or hub id, from the job's `job.json`), the adapter is merged into its
weights, and the result is saved in safetensors with the tokenizer. A full
fine-tuning job's model is cast to 16 bits. The output folder appears complete or
not at all.
"""

from __future__ import annotations

import json
from pathlib import Path

from finetune_studio.training.models import ModelSource, load_tokenizer_and_model
from finetune_studio.wire import JobFolder, save_atomically


class ExportError(Exception):
    pass


def find_job_dir(job: str, data_dir: Path) -> Path:
    """A job id under data_dir/jobs, or a job folder given by path."""
    for candidate in (Path(job).expanduser(), data_dir / "jobs" / job):
        if JobFolder(candidate).job_file.is_file():
            return candidate
    raise ExportError(
        f"no trained job {job!r}: expected {JobFolder(data_dir / 'jobs' / job).job_file} (a job writes it once it starts"
        " training); pass --data-dir if the server uses another data directory"
    )


def export_merged(job_dir: Path, out_dir: Path, dtype_name: str = "bfloat16") -> Path:
    import torch

    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype_name]
    folder = JobFolder(job_dir)
    record = json.loads(folder.job_file.read_text())
    out_dir = out_dir.expanduser().resolve()
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ExportError(f"{out_dir} exists and is not empty; name a new folder")

    if record["method"] == "lora":
        adapter = folder.adapter
        if not (adapter / "adapter_config.json").is_file():
            raise ExportError(f"{adapter} holds no adapter: the job has not finished saving one")
        from peft import PeftModel

        source = ModelSource(**record["base_model"])
        tokenizer, base = load_tokenizer_and_model(source, dtype=torch.float32, trust_remote_code=record.get("trust_remote_code", False))
        model = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    else:
        if not (folder.model / "config.json").is_file():
            raise ExportError(f"{folder.model} holds no model: the job has not finished saving one")
        tokenizer, model = load_tokenizer_and_model(ModelSource("folder", str(folder.model)), dtype=torch.float32)

    model = model.to(dtype)
    with save_atomically(out_dir) as partial:
        model.save_pretrained(str(partial), safe_serialization=True)
        tokenizer.save_pretrained(str(partial))
    return out_dir
