"""The GGUF files of completed exports, as chat models (issue 13 item 4), answered by
llama.cpp in the inference child, so that a user checks that the exported file
answers as the adapter did.

A model id is `<export id>/<file name>` (`a1b2c3/model-q4_k_m.gguf`), for the files a
completed export lists in `details.files` (a file being written is not listed
until it is whole, so it is never served) that are still on disk:

- a `gguf` file (any quantization): a base of its own, run by llama.cpp.
- a `lora_gguf` file: served as its base GGUF plus the adapter (llama.cpp's
  `--lora`) only when the trained job's base model was itself a `.gguf` file
  (its `job.json` says), since llama.cpp needs the base as a GGUF. The adapter of
  a job trained from a folder or a hub id is not listed (export `gguf` to chat
  with that job through llama.cpp).

The Modelfile and merged safetensors are not models to chat with. A bare export id,
or an export that is not (or no longer) completed, is a `ModelNotFound` that says
what to name instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from finetune_studio.errors import JobNotFound, ModelNotFound
from finetune_studio.jobs.accounts import seen_owner
from finetune_studio.jobs.phases import is_terminal
from finetune_studio.jobs.store import JobRecord, JobStore
from finetune_studio.openai_wire import Model
from finetune_studio.wire import JobFolder, ModelRef

MODELS_HINT = "GET /v1/models lists what this server serves"


def export_models(store: JobStore) -> list[Model]:
    """Every servable GGUF file of every completed export, newest export first."""
    found: list[Model] = []
    for export in store.list_jobs(kind="export", owner=seen_owner()):
        if export.phase != "completed":
            continue
        for entry in _files(export):
            if _servable(store, export, entry) is not None:
                found.append(Model(id=f"{export.id}/{entry['name']}", created=int(export.created_at)))
    return found


def resolve_export(store: JobStore, model_id: str) -> Optional[ModelRef]:
    """What the inference child loads for an export's file; None when `model_id`
    names no export (it may be a hub id with a slash); ModelNotFound saying why
    when it names one that cannot be served."""
    export_id, slash, name = model_id.partition("/")
    try:
        export = store.get_visible(export_id, kind="export")
    except JobNotFound:
        return None
    if not slash:
        raise ModelNotFound(f"{export.id} is an export, not a model: {_name_a_file(store, export)}")
    if export.phase != "completed":
        raise ModelNotFound(_not_completed(export))
    entry = next((entry for entry in _files(export) if entry["name"] == name), None)
    if entry is None:
        raise ModelNotFound(f"export {export.id} has no file {name!r}; {_name_a_file(store, export)}")
    if not name.endswith(".gguf") or entry.get("format") not in ("gguf", "lora_gguf"):
        raise ModelNotFound(
            f"{name} of export {export.id} is not a GGUF model (a {entry.get('format')} file): {_name_a_file(store, export)}"
        )
    path = _on_disk(export, name)
    if path is None:
        raise ModelNotFound(f"the file {name} of export {export.id} is no longer on disk ({export.output_dir}); export again")
    if entry.get("format") == "gguf":
        return _llama_cpp(str(path))
    base = _gguf_base(store, export)
    if base is None:
        raise ModelNotFound(
            f"{name} of export {export.id} is a LoRA adapter, and llama.cpp runs it only on a GGUF base, while job"
            f" {export.request.get('job_id')} trained on a model that is not a .gguf file: export format gguf to chat"
            " with the job through llama.cpp, or chat with the job id itself"
        )
    return _llama_cpp(base, adapter=str(path))


def _llama_cpp(gguf: str, adapter: Optional[str] = None) -> ModelRef:
    return {
        "base": {"kind": "gguf", "location": gguf},
        "adapter": adapter,
        "trust_remote_code": False,  # llama.cpp runs no code from the file
        "backend": "llama_cpp",
    }


def _files(export: JobRecord) -> list[dict[str, Any]]:
    """The export's listed files (`details.files`, ExportFile dicts) that have a name."""
    files = (export.status.get("details") or {}).get("files") or []
    return [entry for entry in files if isinstance(entry, dict) and isinstance(entry.get("name"), str)]


def _servable(store: JobStore, export: JobRecord, entry: dict[str, Any]) -> Optional[Path]:
    """The file of `entry` when it can be chatted with (see the module's docstring)."""
    name = str(entry["name"])
    if not name.endswith(".gguf") or entry.get("format") not in ("gguf", "lora_gguf"):
        return None
    path = _on_disk(export, name)
    if path is None or (entry.get("format") == "lora_gguf" and _gguf_base(store, export) is None):
        return None
    return path


def _on_disk(export: JobRecord, name: str) -> Optional[Path]:
    """The file `name` inside the export's folder (never outside it), when it is there."""
    folder = Path(export.output_dir).resolve()
    path = (folder / name).resolve()
    return path if path.is_relative_to(folder) and path.is_file() else None


def _gguf_base(store: JobStore, export: JobRecord) -> Optional[str]:
    """The `.gguf` file the exported job trained on, or None when its base was not one."""
    job_id = export.request.get("job_id")
    if not isinstance(job_id, str):
        return None
    try:
        job = store.get_visible(job_id)
        record = json.loads(JobFolder(Path(job.output_dir)).job_file.read_text())
    except (JobNotFound, OSError, ValueError):
        return None
    base = record.get("base_model") if isinstance(record, dict) else None
    if not (isinstance(base, dict) and base.get("kind") == "gguf" and isinstance(base.get("location"), str)):
        return None
    return str(base["location"]) if Path(base["location"]).is_file() else None


def _name_a_file(store: JobStore, export: JobRecord) -> str:
    if export.phase != "completed":
        return _not_completed(export)
    names = [f"{export.id}/{entry['name']}" for entry in _files(export) if _servable(store, export, entry) is not None]
    if names:
        return f"name one of its GGUF files: {', '.join(names)}"
    return f"it has no GGUF file to chat with (export format gguf makes one); {MODELS_HINT}"


def _not_completed(export: JobRecord) -> str:
    if export.phase == "stopped":
        return f"export {export.id} was stopped before it finished, so it has no files to serve; {MODELS_HINT}"
    return not_ready(export, "export", "files", f"/export/status/{export.id}") or f"export {export.id} has no files to serve"


def not_ready(record: JobRecord, noun: str, what: str, status_path: str, running: str = "") -> Optional[str]:
    """Why a job or an export (`noun`) that is queued, running or failed has no `what` to serve
    (None once it has stopped or completed: what that means is the caller's); `running`
    adds to what a running one's answer suggests. Chat's and the export files' one wording."""
    polled = f"(GET {status_path})"
    if record.phase == "idle":
        return f"{noun} {record.id} is queued and has no {what} to serve yet: chat with it once it has completed {polled}"
    if record.phase == "error":
        reason = record.status.get("error") or "no reason was recorded"
        return f"{noun} {record.id} failed ({reason}) and saved no {what} to serve; {MODELS_HINT}"
    if is_terminal(record.phase):
        return None
    return (
        f"{noun} {record.id} is still running (phase {record.phase}) and has no {what} to serve yet: chat with it once"
        f" it has completed{running} {polled}"
    )
