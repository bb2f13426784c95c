"""A training job as OpenAI's fine-tuning API shows it (docs/API.md, Fine-tuning jobs).

One job, two faces: every training job (started here or through `/train/start`)
is a `fine_tuning.job`; what OpenAI's request has and ours lacks is kept in the
job's stored request under `OPENAI_JOB` (schemas.py). Here:

- `training_request`: OpenAI's create request as a TrainingStartRequest body, the
  hyperparameters' "auto" resolved (`AUTO`, `BASE_LEARNING_RATE`);
- `openai_status`: phases to OpenAI's statuses (queued = idle, running =
  loading_model..training, succeeded, failed, cancelled; paused = stopped with
  `details.paused`); `validating_files` is never stored: a job's files are checked
  within the create request, before the job exists;
- `job_object`, `job_events` (the event log, newest first: status events as message
  events, progress events as `metrics` events), `job_checkpoints` (one per epoch end,
  and the one a pause saved: every checkpoint chat serves);
- model names: `fine_tuned_model` is `ft:<base>:<suffix>:<job id>`, a checkpoint's
  `ft:<base>:<suffix>:<job id>:ckpt-step-<N>`; `parse_model_name` reads them back
  for chat (api/served_models.py).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, cast

from finetune_studio.bounds import MAX_SQL_INTEGER, cursor_number, excerpt
from finetune_studio.errors import FileNotFound, InvalidChatRequest
from finetune_studio.files.store import FileStore, StoredFile
from finetune_studio.jobs.phases import RUNNING, openai_end
from finetune_studio.jobs.store import JobRecord, JobStore, StoredEvent
from finetune_studio.openai_wire import (
    CheckpointMetrics,
    FineTuningJob,
    FineTuningJobCheckpoint,
    FineTuningJobError,
    FineTuningJobEvent,
    FineTuningJobRequest,
    FineTuningStatus,
    Hyperparameters,
    JobHyperparameters,
)
from finetune_studio.paths import is_local
from finetune_studio.schemas import DEFAULT_BETA, OPENAI_JOB, TrainingStartRequest
from finetune_studio.wire import JobFolder, checkpoint_is_complete, checkpoint_name, complete_checkpoints

# The learning rate a multiplier of 1 means: the Studio's default (LoRA's usual rate).
BASE_LEARNING_RATE: float = TrainingStartRequest.model_fields["learning_rate"].default
# What "auto" means for each hyperparameter (beta: the Studio's default for dpo).
AUTO: dict[str, float] = {"n_epochs": 3, "batch_size": 1, "learning_rate_multiplier": 1.0, "beta": DEFAULT_BETA["dpo"]}
_CHECKPOINT_TAIL = re.compile(r"^ckpt-step-([0-9]+)$")
_EVENT_ID = re.compile(r"^ftevent-([0-9a-f]+)-([0-9]+)$")
_CHECKPOINT_ID = re.compile(r"^ftckpt-([0-9a-f]+)-([0-9]+)$")


# -- create -----------------------------------------------------------------------


def training_request(body: FineTuningJobRequest, files: FileStore) -> tuple[TrainingStartRequest, dict[str, Any]]:
    """The training request for OpenAI's create request, and the OpenAI fields to keep
    with the job. Raises InvalidChatRequest (400, `param` named) for what cannot run."""
    method = body.method.type if body.method else "supervised"
    if method == "reinforcement":
        raise InvalidChatRequest(
            "method.type reinforcement is not offered by this server: use supervised (chat files) or dpo (preference files)",
            param="method.type",
        )
    given = _hyperparameters(body, method)
    wanted = "preference" if method == "dpo" else "chat"
    train = _fine_tune_file(files, body.training_file, "training_file", wanted, method)
    valid = _fine_tune_file(files, body.validation_file, "validation_file", wanted, method) if body.validation_file else None
    epochs = int(_resolved(given, "n_epochs"))
    batch = int(_resolved(given, "batch_size"))
    multiplier = float(_resolved(given, "learning_rate_multiplier"))
    # A checkpoint at each epoch's end, as OpenAI keeps them (the last one is the result).
    steps_per_epoch = max(1, math.ceil(train.facts.rows / batch))
    fields: dict[str, Any] = {
        "model_name": body.model,
        "training_type": "LoRA/QLoRA",
        "format_type": "chatml" if method == "supervised" else "auto",
        "local_datasets": [str(_data_path(train, method))],
        "num_epochs": epochs,
        "batch_size": batch,
        "learning_rate": BASE_LEARNING_RATE * multiplier,
        "save_steps": steps_per_epoch,
        "project_name": body.suffix or None,
    }
    if method == "supervised":
        fields["train_on_completions"] = True  # OpenAI trains on the assistant's messages only
    else:
        fields["training_method"] = "dpo"
        fields["beta"] = float(_resolved(given, "beta"))
    if valid is not None:
        fields["local_eval_datasets"] = [str(_data_path(valid, method))]
        fields["eval_steps"] = float(steps_per_epoch)  # a validation loss at each epoch's end
    if body.seed is not None:
        fields["random_seed"] = body.seed
    wandb = next((item.wandb for item in body.integrations or [] if item.type == "wandb"), None)
    if wandb is not None:
        fields["enable_wandb"] = True
        fields["wandb_project"] = wandb.project
    request = TrainingStartRequest.model_validate(fields)
    extra = {
        "training_file": train.id,
        "validation_file": valid.id if valid else None,
        "method": method,
        "hyperparameters": given,
        "suffix": body.suffix or None,
        "metadata": body.metadata,
        "integrations": [item.model_dump() for item in body.integrations or []] or None,
        "steps_per_epoch": steps_per_epoch,
    }
    return request, extra


def _hyperparameters(body: FineTuningJobRequest, method: str) -> dict[str, Any]:
    """The hyperparameters as given (numbers, or "auto"): the method's own, else the older top-level field."""
    chosen: Optional[Hyperparameters] = None
    if body.method is not None:
        inner = body.method.dpo if method == "dpo" else body.method.supervised
        chosen = inner.hyperparameters if inner is not None else None
    chosen = chosen or body.hyperparameters or Hyperparameters()
    given = chosen.model_dump()
    if method != "dpo":
        given.pop("beta", None)
    return given


def _resolved(given: dict[str, Any], name: str) -> float:
    value = given.get(name, "auto")
    return AUTO[name] if value == "auto" else float(value)


def _fine_tune_file(files: FileStore, file_id: str, param: str, wanted: str, method: str) -> StoredFile:
    try:
        stored = files.get_visible(file_id)
    except FileNotFound:
        raise InvalidChatRequest(f"{param}: no file with id {file_id!r}; upload it with POST /v1/files", param=param) from None
    if stored.purpose != "fine-tune":
        raise InvalidChatRequest(
            f"{param}: {file_id} was uploaded with purpose {stored.purpose!r}; a fine-tuning job takes a file uploaded"
            " with purpose \"fine-tune\"",
            param=param,
        )
    if stored.facts.format != wanted:
        raise InvalidChatRequest(
            f"{param}: {file_id} is in OpenAI's {stored.facts.format} format, and method.type {method} trains on its"
            f" {wanted} format",
            param=param,
        )
    return stored


def _data_path(stored: StoredFile, method: str) -> Path:
    return stored.dpo_path if method == "dpo" else stored.path


# -- statuses and names -------------------------------------------------------------


def openai_status(phase: str, details: Optional[dict[str, Any]]) -> FineTuningStatus:
    if phase == "idle":
        return "queued"
    if phase in RUNNING:
        return "running"
    end = openai_end(phase, details)
    if end is not None:
        return cast(FineTuningStatus, end)
    raise ValueError(f"{phase!r} is not a training job's phase")


def _base_label(model_name: str) -> str:
    """The base model as a model name shows it: a hub id as it is, a local model by its file or folder name."""
    label = Path(model_name.rstrip("/\\")).name if is_local(model_name) else model_name
    return label.replace(":", "-") or "model"


def fine_tuned_model_name(job: JobRecord) -> str:
    """`ft:<base>:<suffix>:<job id>` (the suffix empty when none was given), as OpenAI names them."""
    extra = job.request.get(OPENAI_JOB) or {}
    suffix = extra.get("suffix") or ""
    return f"ft:{_base_label(str(job.request.get('model_name', '')))}:{suffix}:{job.id}"


def checkpoint_model_name(job: JobRecord, step: int) -> str:
    return f"{fine_tuned_model_name(job)}:ckpt-step-{step}"


@dataclass(frozen=True)
class ModelName:
    job_id: str
    step: Optional[int]  # a checkpoint's step; None for the fine-tuned model itself


def parse_model_name(model_id: str) -> Optional[ModelName]:
    """The job (and checkpoint step) a `ft:...` name stands for, or None when it is not one.
    The caller checks that the job's own name matches (`fine_tuned_model_name`)."""
    if not model_id.startswith("ft:"):
        return None
    head, _, tail = model_id.rpartition(":")
    match = _CHECKPOINT_TAIL.match(tail)
    step = cursor_number(match.group(1)) if match else None
    if match and step is not None:
        name = head
    else:
        name, step = model_id, None  # a step past any a job has is no checkpoint: the whole id is looked up
    job_id = name.rpartition(":")[2]
    return ModelName(job_id, step) if job_id else None


# -- the job --------------------------------------------------------------------------


def job_object(job: JobRecord) -> FineTuningJob:
    request = job.request
    extra: dict[str, Any] = request.get(OPENAI_JOB) or {}
    details: dict[str, Any] = job.status.get("details") or {}
    status = openai_status(job.phase, details)
    method = str(extra.get("method") or request.get("training_method") or "supervised")
    if method == "sft":
        method = "supervised"
    given: dict[str, Any] = extra.get("hyperparameters") or {
        "n_epochs": request.get("num_epochs"),
        "batch_size": request.get("batch_size"),
        "learning_rate_multiplier": float(request.get("learning_rate", BASE_LEARNING_RATE)) / BASE_LEARNING_RATE,
    }
    hyperparameters = JobHyperparameters.model_validate(given)
    error = None
    if job.phase == "error":
        error = FineTuningJobError(
            code=str(details.get("error_code") or "training_failed"),
            message=str(job.status.get("error") or job.status.get("message") or "the job failed"),
        )
    progress = job.progress or {}
    finished = status in ("succeeded", "failed", "cancelled") and isinstance(details.get("time"), (int, float))
    estimated = None
    if status == "running" and progress.get("eta_seconds") is not None and progress.get("timestamp") is not None:
        estimated = int(float(progress["timestamp"]) + float(progress["eta_seconds"]))
    return FineTuningJob(
        id=job.id,
        created_at=int(job.created_at),
        error=error,
        fine_tuned_model=fine_tuned_model_name(job) if status == "succeeded" else None,
        finished_at=int(details["time"]) if finished else None,
        hyperparameters=hyperparameters,
        model=str(request.get("model_name", "")),
        seed=int(request.get("random_seed", 0)),
        status=status,
        trained_tokens=_trained_tokens(details, progress) if status == "succeeded" else None,
        training_file=str(extra.get("training_file") or _data_name(request)),
        validation_file=extra.get("validation_file") or (_eval_name(request) if not extra else None),
        estimated_finish=estimated,
        integrations=extra.get("integrations"),
        metadata=extra.get("metadata"),
        method={"type": method, method: {"hyperparameters": hyperparameters.model_dump(exclude_none=True)}},
        user_provided_suffix=extra.get("suffix"),
    )


def _trained_tokens(details: dict[str, Any], progress: dict[str, Any]) -> Optional[int]:
    summary = details.get("summary") or {}
    tokens = summary.get("tokens") if isinstance(summary, dict) else None
    tokens = tokens if tokens is not None else progress.get("num_tokens")
    return int(tokens) if isinstance(tokens, (int, float)) else None


def _data_name(request: dict[str, Any]) -> str:
    """A /train job's data, where OpenAI names a file: its first dataset path, or its hub dataset."""
    datasets = request.get("local_datasets") or []
    return str(datasets[0]) if datasets else str(request.get("hf_dataset") or "")


def _eval_name(request: dict[str, Any]) -> Optional[str]:
    datasets = request.get("local_eval_datasets") or []
    return str(datasets[0]) if datasets else None


# -- events ---------------------------------------------------------------------------


def event_id(job_id: str, number: int) -> str:
    return f"ftevent-{job_id}-{number}"


def parse_event_cursor(job_id: str, after: Optional[str]) -> Optional[int]:
    """The event number an `after` cursor names (one of this job's event ids)."""
    if after is None:
        return None
    match = _EVENT_ID.match(after)
    if match is None or match.group(1) != job_id:
        raise InvalidChatRequest(f"after: {_quoted(after)} is not an event id of job {job_id}", param="after")
    return _cursor(match.group(2), "event", after)


def _cursor(digits: str, what: str, after: str) -> int:
    """A cursor's number, which must fit SQLite's integers (bounds.MAX_SQL_INTEGER)."""
    number = cursor_number(digits)
    if number is None:
        raise InvalidChatRequest(
            f"after: {_quoted(after)} names {what} number {excerpt(digits, 40)}, past the largest this server gives out"
            f" ({MAX_SQL_INTEGER}): pass an id from an earlier page, or leave after out to start at the newest",
            param="after",
        )
    return number


def _quoted(text: str) -> str:
    """A cursor as an error quotes it: whole when short, an excerpt when long."""
    return repr(excerpt(text, 120))


def job_events(store: JobStore, job: JobRecord, after: Optional[str], limit: int) -> tuple[list[FineTuningJobEvent], bool]:
    """A page of the job's events, newest first, after the event `after`; and whether more follow."""
    rows = store.events_before(job.id, parse_event_cursor(job.id, after), limit + 1)
    return [_event(job, row) for row in rows[:limit]], len(rows) > limit


def _event(job: JobRecord, stored: StoredEvent) -> FineTuningJobEvent:
    data = json.loads(stored.data)
    ident = event_id(job.id, stored.id)
    if stored.kind == "progress":
        return _metrics_event(ident, job, data)
    details: dict[str, Any] = data.get("details") or {}
    created = int(details.get("time") or job.created_at)
    phase = str(data.get("phase"))
    text = str(data.get("message") or "")
    level = "info"
    if phase == "idle":
        message = text if details.get("resumed") else f"Job queued: {job.id}"
    elif phase == "loading_model":
        message = f"Job started: {text}" if text else "Job started"
    elif phase == "completed":
        message = f"Job succeeded: {text}; fine-tuned model {fine_tuned_model_name(job)}"
    elif phase == "error":
        message, level = f"Job failed: {data.get('error') or text}", "error"
    elif phase == "stopped":
        message = f"Job paused: {text}" if details.get("paused") else f"Job cancelled: {text}"
    else:
        message = text
    return FineTuningJobEvent(
        id=ident, created_at=created, level=cast(Any, level), message=message, type="message", data={"phase": phase}
    )


def _metrics_event(ident: str, job: JobRecord, progress: dict[str, Any]) -> FineTuningJobEvent:
    metrics = step_metrics(progress)
    step, total = int(progress.get("step", 0)), progress.get("total_steps")
    parts = [f"training loss={metrics['train_loss']:.4f}" if metrics.get("train_loss") is not None else "training loss=n/a"]
    if metrics.get("valid_loss") is not None:
        parts.append(f"validation loss={metrics['valid_loss']:.4f}")
    created = progress.get("timestamp") or job.created_at
    return FineTuningJobEvent(
        id=ident,
        created_at=int(float(created)),
        message=f"Step {step}/{total}: {', '.join(parts)}",
        type="metrics",
        data={**metrics, "total_steps": total},
    )


def step_metrics(progress: dict[str, Any]) -> dict[str, Any]:
    """One step's metrics under OpenAI's names (the validation ones only at evaluations), and
    the training method's own figures under their own names."""
    metrics: dict[str, Any] = {
        "step": int(progress.get("step", 0)),
        "train_loss": progress.get("loss"),
        "train_mean_token_accuracy": progress.get("mean_token_accuracy"),
    }
    metrics.update(progress.get("metrics") or {})  # a method's own figures (DPO's rewards/margins...), by TRL's names
    if progress.get("eval_loss") is not None:
        metrics["valid_loss"] = progress["eval_loss"]
        metrics["valid_mean_token_accuracy"] = progress.get("eval_mean_token_accuracy")
    return metrics


# -- checkpoints -------------------------------------------------------------------------


def checkpoint_folder(job: JobRecord, step: int) -> Optional[Path]:
    """The job's complete checkpoint of `step`, if it has one."""
    folder = JobFolder(Path(job.output_dir)).checkpoints / checkpoint_name(step)
    return folder if checkpoint_is_complete(folder) else None


def job_checkpoint_folders(job: JobRecord) -> list[tuple[int, Path]]:
    """(step, folder) of each complete checkpoint of the job, newest first. For a job
    created here, one at each epoch's end (the final one included), as OpenAI keeps
    them, and the one a pause (or a cancel) saved mid-epoch; for a /train job, one at
    every save_steps. Each is a chat model (`...:ckpt-step-N`, `checkpoint_folder`):
    what chat serves is what is listed. A step past SQLite's integers is left out (its
    progress event is looked up by step)."""
    found = complete_checkpoints(JobFolder(Path(job.output_dir)).checkpoints)
    return [(step, folder) for step, folder in found if step <= MAX_SQL_INTEGER]


def job_checkpoints(
    store: JobStore, job: JobRecord, after: Optional[str], limit: int
) -> tuple[list[FineTuningJobCheckpoint], bool]:
    below = None
    if after is not None:
        match = _CHECKPOINT_ID.match(after)
        if match is None or match.group(1) != job.id:
            raise InvalidChatRequest(f"after: {_quoted(after)} is not a checkpoint id of job {job.id}", param="after")
        below = _cursor(match.group(2), "step", after)
    listed = [(step, folder) for step, folder in job_checkpoint_folders(job) if below is None or step < below]
    page = [
        FineTuningJobCheckpoint(
            id=f"ftckpt-{job.id}-{step}",
            created_at=int(folder.stat().st_mtime),
            fine_tuned_model_checkpoint=checkpoint_model_name(job, step),
            fine_tuning_job_id=job.id,
            metrics=CheckpointMetrics.model_validate(step_metrics(store.progress_at(job.id, step) or {"step": step})),
            step_number=step,
        )
        for step, folder in listed[:limit]
    ]
    return page, len(listed) > limit
