"""Which models the chat routes serve, and what the inference child loads for each.

Two kinds of model id:

- a job id: a job that completed, or was stopped after saving, with its `adapter/`
  (LoRA: its base model plus the adapter) or `model/` (full fine-tuning: a base of
  its own). The base comes from the job's `job.json`, which the training child
  wrote when it resolved the request's `model_name` (a folder, a `.gguf` file or a
  hub id), so chat loads exactly the model the job trained on.
- a base model: the `model_name` of a job that got as far as loading it (it has a
  `job.json`), served with no adapter.

- a fine-tuning job's OpenAI names (api/openai_jobs.py): its `fine_tuned_model`
  (`ft:<base>:<suffix>:<job id>`, the job id's twin; `/v1/models` lists a job made
  through /v1/fine_tuning/jobs by this name, any other by its id), and each
  checkpoint's (`...:ckpt-step-<N>`: the base model plus that checkpoint's adapter).

- `base:<job id>`: the base model that job trained on (its job file's), without the adapter:
  what an evaluation compares a job with.

- an export's GGUF file, `<export id>/<file name>` (api/served_exports.py): run by
  llama.cpp, as people will run the exported file.

Anything else, and a job with nothing to serve (queued, running, failed, stopped
before saving), is a `ModelNotFound` that says which and what to do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from finetune_studio.api.openai_jobs import (
    ModelName,
    checkpoint_folder,
    checkpoint_model_name,
    fine_tuned_model_name,
    parse_model_name,
)
from finetune_studio.api.served_exports import MODELS_HINT, export_models, not_ready, resolve_export
from finetune_studio.errors import JobNotFound, ModelNotFound
from finetune_studio.jobs.accounts import seen_owner
from finetune_studio.jobs.phases import RESULT_KEYS, has_result
from finetune_studio.jobs.store import JobRecord, JobStore
from finetune_studio.openai_wire import Model
from finetune_studio.schemas import BASE_MODEL_PREFIX, OPENAI_JOB
from finetune_studio.wire import JobFolder, ModelRef


def served_models(store: JobStore) -> list[Model]:
    """Every servable job (newest first), every export's GGUF file, then every base model a job loaded."""
    jobs: list[Model] = []
    bases: dict[str, int] = {}
    for job in store.list_jobs(owner=seen_owner()):
        if _output(job) is not None:
            # Each model once: a job made through OpenAI's fine-tuning API by the name its
            # clients know (`fine_tuned_model`), any other by its id; both names answer.
            openai_named = job.phase == "completed" and OPENAI_JOB in job.request
            jobs.append(Model(id=fine_tuned_model_name(job) if openai_named else job.id, created=int(job.created_at)))
        name = job.request.get("model_name")
        if isinstance(name, str) and JobFolder(Path(job.output_dir)).job_file.is_file():
            bases[name] = min(bases.get(name, int(job.created_at)), int(job.created_at))
    return jobs + export_models(store) + [Model(id=name, created=created) for name, created in bases.items()]


def resolve_model(store: JobStore, model_id: str) -> ModelRef:
    """What the inference child loads for `model_id`, or ModelNotFound saying why not."""
    if model_id.startswith(BASE_MODEL_PREFIX):
        return _base_of_job(store, model_id)
    named = parse_model_name(model_id)
    if named is not None:
        return _fine_tuned(store, model_id, named)
    exported = resolve_export(store, model_id)
    if exported is not None:
        return exported
    try:
        job = store.get_visible(model_id)
    except JobNotFound:
        return _base_model(store, model_id)
    output = _output(job)
    if output is None:
        raise ModelNotFound(_nothing_to_serve(job))
    kind, folder = output
    record = _job_file(job)
    trust = bool(record.get("trust_remote_code", False))
    if kind == "model_dir":  # full fine-tuning: the saved model is a base of its own
        return {"base": {"kind": "folder", "location": str(folder)}, "adapter": None, "trust_remote_code": trust}
    return {"base": _base_of(job, record), "adapter": str(folder), "trust_remote_code": trust}


def _base_of_job(store: JobStore, model_id: str) -> ModelRef:
    """`base:<job id>`: the base model that job trained on, as its job file names it, alone."""
    job_id = model_id[len(BASE_MODEL_PREFIX):]
    try:
        job = store.get_visible(job_id, kind="train")
    except JobNotFound:
        raise ModelNotFound(f"the model {model_id!r} names job {job_id!r}, which does not exist; {MODELS_HINT}") from None
    if not JobFolder(Path(job.output_dir)).job_file.is_file():
        raise ModelNotFound(
            f"job {job.id} has not loaded its base model yet (it is {job.phase}), so {model_id!r} names nothing to serve;"
            f" {MODELS_HINT}"
        )
    record = _job_file(job)
    return {"base": _base_of(job, record), "adapter": None, "trust_remote_code": bool(record.get("trust_remote_code", False))}


def _fine_tuned(store: JobStore, model_id: str, named: ModelName) -> ModelRef:
    """A fine-tuning job's model or one of its checkpoints, by its OpenAI name."""
    try:
        job = store.get_visible(named.job_id)
    except JobNotFound:
        raise ModelNotFound(f"the model {model_id!r} names job {named.job_id!r}, which does not exist; {MODELS_HINT}") from None
    own = fine_tuned_model_name(job)
    expected = own if named.step is None else checkpoint_model_name(job, named.step)
    if model_id != expected:
        raise ModelNotFound(f"the model {model_id!r} is not a name of job {job.id} (its model is {own}); {MODELS_HINT}")
    if named.step is None:
        return resolve_model(store, job.id)
    folder = checkpoint_folder(job, named.step)
    if folder is None:
        raise ModelNotFound(
            f"job {job.id} has no checkpoint at step {named.step} (GET /v1/fine_tuning/jobs/{job.id}/checkpoints lists them)"
        )
    record = _job_file(job)
    trust = bool(record.get("trust_remote_code", False))
    if not (folder / "adapter_config.json").is_file():  # full fine-tuning: the checkpoint is a model of its own
        return {"base": {"kind": "folder", "location": str(folder)}, "adapter": None, "trust_remote_code": trust}
    return {"base": _base_of(job, record), "adapter": str(folder), "trust_remote_code": trust}


def _output(job: JobRecord) -> Optional[tuple[str, Path]]:
    """The saved adapter or model of a finished job, when its folder is there."""
    details = job.status.get("details") or {}
    if not has_result(job.phase, details):
        return None
    for kind in RESULT_KEYS:
        location = details.get(kind)
        if isinstance(location, str) and Path(location).is_dir():
            return kind, Path(location)
    return None


def _nothing_to_serve(job: JobRecord) -> str:
    answer = not_ready(job, "job", "model", f"/train/status/{job.id}", running=", or stop it and chat with what it saved")
    if answer is not None:
        return answer
    details = job.status.get("details") or {}
    named = details.get("adapter_dir") or details.get("model_dir")
    if named:
        return f"job {job.id}'s saved model {named} is no longer there; {MODELS_HINT}"
    return f"job {job.id} was {job.phase} before it saved a model, so there is nothing to serve; {MODELS_HINT}"


def _job_file(job: JobRecord) -> dict[str, Any]:
    path = JobFolder(Path(job.output_dir)).job_file
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelNotFound(f"job {job.id} has no readable job file ({path}: {exc}), so its base model is unknown") from None
    if not isinstance(record, dict):
        raise ModelNotFound(f"job {job.id}'s job file {path} is not a JSON object, so its base model is unknown")
    return record


def _base_of(job: JobRecord, record: dict[str, Any]) -> dict[str, str]:
    base = record.get("base_model")
    if not (isinstance(base, dict) and isinstance(base.get("kind"), str) and isinstance(base.get("location"), str)):
        raise ModelNotFound(f"job {job.id}'s job file names no base model, so its adapter cannot be loaded")
    return {"kind": base["kind"], "location": base["location"]}


def _base_model(store: JobStore, name: str) -> ModelRef:
    """A base model by a job's `model_name`: the newest job that loaded it says where it is."""
    used = False
    for job in store.list_jobs(owner=seen_owner()):
        if job.request.get("model_name") != name:
            continue
        used = True
        if JobFolder(Path(job.output_dir)).job_file.is_file():
            record = _job_file(job)
            return {"base": _base_of(job, record), "adapter": None, "trust_remote_code": bool(record.get("trust_remote_code", False))}
    if used:
        raise ModelNotFound(
            f"the base model {name!r} has not been loaded by any job yet (its jobs are queued or failed before loading"
            f" it); {MODELS_HINT}"
        )
    raise ModelNotFound(
        f"the model {name!r} does not exist: name a finished job's id, or the model_name of a job's base model;"
        f" {MODELS_HINT}"
    )
