"""Export records written into a store through its own guarded transitions, for the
tests of chat over an export (tests/unit/test_served_exports.py,
tests/integration/test_chat_gguf.py): a completed training job whose `job.json`
names its base, and an export of it in any phase, with real files on disk.

What an export child leaves behind is imitated here (its folder, `details.files`
as ExportFile dicts with real sizes and digests), so that the served-model path
is tested against real files while the export child is tested on its own.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from pathlib import Path
from typing import Any, Optional

from finetune_studio.jobs.store import JobStore

TRAIN_PHASES = ("loading_model", "loading_dataset", "configuring", "training", "completed")
EXPORT_PHASES = {
    "idle": (),
    "converting": ("loading_model", "converting"),
    "completed": ("loading_model", "converting", "completed"),
    "error": ("loading_model", "error"),
    "stopped": ("loading_model", "converting", "stopped"),
}


def status(phase: str, **details: Any) -> dict[str, Any]:
    error = "the converter failed: it ran out of disk" if phase == "error" else None
    return {"phase": phase, "message": phase, "error": error, "details": details}


def trained_job(store: JobStore, data_dir: Path, base: dict[str, str]) -> str:
    """A completed training job trained on `base` ({"kind", "location"}), with its job.json."""
    job_id = uuid.uuid4().hex[:12]
    folder = data_dir / "jobs" / job_id
    folder.mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps({"base_model": base, "method": "lora", "trust_remote_code": False}))
    store.create_job(job_id, {"model_name": base["location"], "training_type": "LoRA/QLoRA"}, str(folder), status("idle"))
    for phase in TRAIN_PHASES:
        store.transition(job_id, status(phase, output_dir=str(folder)))
    return job_id


def file_entry(folder: Path, name: str, export_format: str, quantization: Optional[str]) -> dict[str, Any]:
    """An ExportFile dict for a file already in `folder`."""
    data = (folder / name).read_bytes()
    return {"name": name, "format": export_format, "quantization": quantization, "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}


def export_of(
    store: JobStore,
    data_dir: Path,
    job_id: str,
    files: dict[str, tuple[Path, str, Optional[str]]],
    *,
    phase: str = "completed",
    export_format: str = "gguf",
) -> str:
    """An export of `job_id` in `phase`; when completed, `files` (name -> (source,
    format, quantization)) are copied into its folder and listed in details.files."""
    export_id = uuid.uuid4().hex[:12]
    folder = data_dir / "exports" / export_id
    folder.mkdir(parents=True)
    request = {"job_id": job_id, "format": export_format, "quantization": None}
    store.create_job(export_id, request, str(folder), status("idle"), kind="export")
    listed: list[dict[str, Any]] = []
    if phase == "completed":
        for name, (source, file_format, quantization) in files.items():
            shutil.copyfile(source, folder / name)
            listed.append(file_entry(folder, name, file_format, quantization))
    for step in EXPORT_PHASES[phase]:
        details: dict[str, Any] = {"output_dir": str(folder)}
        if step == "completed":
            details["files"] = listed
        store.transition(export_id, status(step, **details))
    return export_id
