"""The wire models: the seed's four models, the training request, and list shapes.

Names, fields and literal values follow `shared/seed/training_pydantic.md`; the
request follows Unsloth Studio's `TrainingStartRequest` for text models (DESIGN.md
section 3). This module holds no logic beyond field validation.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Optional, Union, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from finetune_studio.text import refuse_invalid_text

Phase = Literal[
    "idle",
    "loading_model",
    "loading_dataset",
    "configuring",
    "training",
    "completed",
    "error",
    "stopped",
]

# `details.error_code` of a job that ended in `error`: the child's codes (what was
# wrong with the job), then the supervisor's (what happened to the process). The UI
# has a headline for each (web/format.js; tests check it knows them all).
ErrorCode = Literal[
    "model_not_found",
    "dataset_invalid",
    "dataset_not_found",
    "config_invalid",
    "out_of_memory",
    "disk_full",
    "training_failed",
    "diverged",
    "export_failed",
    "export_tools_missing",
    "worker_died",
    "worker_failed_to_start",
    "server_restarted",
    "internal_error",
]

TrainingType = Literal["LoRA/QLoRA", "Full Finetuning", "Continued Pretraining"]
FormatType = Literal["auto", "alpaca", "chatml", "sharegpt", "raw"]

# Fields that hold secrets: never stored, logged or echoed.
SECRET_FIELDS = ("hf_token", "wandb_token")
# Keys the server adds to a request as it stores it, beside the request's fields.
WITHHELD_SECRETS = "withheld_secrets"  # the names of the secrets it carried (never their values)
QUEUED_WARNINGS = "queued_warnings"  # what admission noticed, for the job's statuses to carry
# An ignored-fields warning names at most this many fields, each cut to this length.
_NAMED_FIELDS, _NAME_CHARS = 10, 40


def _not_blank(value: str, info: ValidationInfo) -> str:
    # An empty path is no path: the child would read its working folder instead.
    if not value.strip():
        what = "a local model folder, a .gguf file or a hub id" if info.field_name == "model_name" else (
            "a file or folder, or leave the field out")
        raise PydanticCustomError(
            "path_empty", "{field}: a path that is empty or only spaces names nothing; name {what}",
            {"field": info.field_name or "the path", "what": what},
        )
    return value


# A field that names a file, folder or hub id: never empty or only spaces.
PathText = Annotated[str, AfterValidator(_not_blank)]


def method_of(training_type: Optional[str], use_lora: Optional[bool]) -> Literal["lora", "full"]:
    """How a request trains the weights: "lora" (an adapter) or "full" (every weight).
    The one rule, for the training child and for the server's run summary."""
    return "full" if training_type == "Full Finetuning" or use_lora is False else "lora"


class TrainingStartRequest(BaseModel):
    """Request payload to start training (Unsloth Studio's request, text models).

    Unknown fields are ignored rather than rejected, so that a body written for a
    newer or older Studio is still accepted; the job's first status lists them in
    `details.warnings`.
    """

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    # model
    model_name: PathText = Field(description="A local Hugging Face model folder, a .gguf file, or a hub id.")
    training_type: TrainingType = Field(description="LoRA/QLoRA, Full Finetuning or Continued Pretraining.")
    hf_token: Optional[str] = Field(default=None, description="Hub token; never stored or echoed.")
    load_in_4bit: bool = Field(default=True, description="Load the base model in 4 bits (QLoRA) where CUDA and bitsandbytes allow.")
    max_seq_length: int = Field(default=2048, ge=8, le=1_048_576, description="Longest sequence in tokens; longer rows are truncated.")
    trust_remote_code: bool = Field(default=False, description="Run model code shipped with the checkpoint.")
    model_local_path: Optional[PathText] = Field(default=None, description="A local folder that overrides model_name for loading.")
    project_name: Optional[str] = Field(default=None, description="A free label shown with the job.")

    # data
    hf_dataset: Optional[PathText] = Field(default=None, description="A hub dataset id.")
    local_datasets: list[PathText] = Field(default_factory=list, description="Local dataset files (JSONL).")
    local_eval_datasets: list[PathText] = Field(default_factory=list, description="Local evaluation dataset files.")
    format_type: FormatType = Field(description="Dataset shape: auto, alpaca, chatml, sharegpt or raw.")
    subset: Optional[str] = None
    train_split: str = "train"
    eval_split: Optional[str] = None
    eval_steps: float = Field(default=0.0, ge=0.0, description="Evaluate every this fraction of total steps (0: never).")
    early_stopping_patience: Optional[int] = Field(
        default=None,
        ge=1,
        description="Extension. Stop training once the evaluation loss has not improved for this many evaluations"
        " in a row; the best checkpoint is the result. Needs evaluation data and eval_steps (None: off).",
    )
    early_stopping_threshold: float = Field(
        default=0.0,
        ge=0.0,
        description="Extension. With early_stopping_patience, how much the evaluation loss must fall to count as improved.",
    )
    dataset_slice_start: Optional[int] = Field(default=None, ge=0)
    dataset_slice_end: Optional[int] = Field(default=None, ge=0)
    custom_format_mapping: Optional[dict[str, str]] = Field(
        default=None, description='Column name to role, e.g. {"question": "user", "answer": "assistant"}.'
    )
    bad_rows: Literal["error", "skip"] = Field(
        default="error",
        description='Extension. What a bad dataset row does: "error" fails the job naming every kind of problem'
        ' (counts and first examples); "skip" trains without the bad rows and counts them.',
    )
    max_bad_row_fraction: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description='Extension. With bad_rows "skip", the job still fails when more than this fraction of rows is bad.',
    )

    # hyperparameters
    num_epochs: int = Field(default=1, ge=0, description="Passes over the data; 0 means use max_steps.")
    learning_rate: float = Field(default=2e-4, gt=0.0, description='Peak learning rate; a string such as "2e-4" is accepted.')
    batch_size: int = Field(default=1, ge=1, le=65_536)
    gradient_accumulation_steps: int = Field(default=1, ge=1, le=65_536)
    warmup_steps: Optional[int] = Field(default=None, ge=0)
    warmup_ratio: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    max_steps: Optional[int] = Field(default=None, ge=0, description="Optimizer steps; above 0 it overrides num_epochs.")
    save_steps: int = Field(default=100, ge=0, description="Save a checkpoint every this many steps (0: never).")
    weight_decay: float = Field(default=0.001, ge=0.0)
    max_grad_norm: Optional[float] = Field(default=None, ge=0.0)
    # numpy's seeds stop at 2**32 - 1: a larger one failed the job only once it had loaded the model.
    random_seed: int = Field(default=3407, ge=0, le=2**32 - 1)
    packing: bool = False
    optim: str = "adamw_8bit"
    lr_scheduler_type: str = "linear"

    # LoRA
    use_lora: bool = True
    lora_r: int = Field(default=16, ge=1, le=4096)
    lora_alpha: int = Field(default=16, ge=1)
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=list, description="Module names to adapt; empty means all linear layers.")
    gradient_checkpointing: str = ""
    use_rslora: bool = False
    use_loftq: bool = False
    use_dora: bool = False
    train_on_completions: bool = False

    # logging and more
    enable_wandb: bool = False
    wandb_token: Optional[str] = None
    wandb_project: Optional[str] = None
    enable_tensorboard: bool = False
    tensorboard_dir: Optional[PathText] = None
    resume_from_checkpoint: Optional[PathText] = None
    gpu_ids: Optional[list[int]] = None

    @model_validator(mode="before")
    @classmethod
    def _text_is_unicode(cls, data: Any) -> Any:
        """Refuse any string, or field name, that is not valid Unicode (a lone surrogate
        such as "\\ud800"): stored, it could never be sent back (finetune_studio/text.py)."""
        return refuse_invalid_text(cls.__name__, data)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """The Studio's UI sends `null` for settings it leaves alone (`train_split`
        with local files, say): a null for a field that has a default and cannot be
        null means that default."""
        if not isinstance(data, dict):
            return data
        nulls = [
            name for name, value in data.items()
            if value is None and name in cls.model_fields and not cls.model_fields[name].is_required()
            and cls.model_fields[name].default is not None
        ]
        return {k: v for k, v in data.items() if k not in nulls} if nulls else data

    @field_validator("learning_rate", mode="before")
    @classmethod
    def _learning_rate_from_string(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                raise ValueError(f"learning_rate must be a number such as 2e-4, not {value!r}") from None
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> TrainingStartRequest:
        if self.num_epochs == 0 and not self.max_steps:
            raise ValueError("num_epochs and max_steps are both 0: set num_epochs >= 1 or max_steps >= 1")
        if sum((self.use_rslora, self.use_loftq, self.use_dora)) > 1:
            raise ValueError("use_rslora, use_loftq and use_dora are exclusive: set at most one of them")
        if (
            self.dataset_slice_start is not None
            and self.dataset_slice_end is not None
            and self.dataset_slice_end <= self.dataset_slice_start
        ):
            raise ValueError("dataset_slice_end must be greater than dataset_slice_start")
        if not self.local_datasets and not self.hf_dataset:
            raise ValueError("no training data: set local_datasets (a list of files) or hf_dataset")
        return self

    def unknown_fields(self) -> list[str]:
        """The names of fields the request carried that this model does not know."""
        return sorted((self.model_extra or {}).keys())

    def ignored_fields_warning(self) -> Optional[str]:
        """One bounded warning about the unknown fields, however many there are."""
        names = self.unknown_fields()
        if not names:
            return None
        shown = ", ".join(repr(name if len(name) <= _NAME_CHARS else name[:_NAME_CHARS] + "...") for name in names[:_NAMED_FIELDS])
        more = f" and {len(names) - _NAMED_FIELDS} more" if len(names) > _NAMED_FIELDS else ""
        return f"unknown field{'s' if len(names) > 1 else ''} {shown}{more} ignored"

    def redacted(self) -> dict[str, Any]:
        """The request as stored and shown: known fields only, secrets removed."""
        data = self.model_dump(exclude=set(SECRET_FIELDS))
        for name in self.unknown_fields():
            data.pop(name, None)
        return data


class TrainingJobResponse(BaseModel):
    """Immediate response when training is initiated"""

    job_id: str
    status: Literal["queued", "error"]
    message: str
    error: Optional[str] = None


class TrainingStatus(BaseModel):
    """Current training job status - works for streaming or polling"""

    job_id: str
    phase: Phase
    is_training_running: bool
    message: str
    error: Optional[str] = None
    details: Optional[dict[str, Any]] = None


# Fields of TrainingProgress that a NaN cannot simply be dropped from (they stay invalid).
_REQUIRED_METRICS = frozenset({"step", "total_steps", "learning_rate", "progress_percent"})


class TrainingProgress(BaseModel):
    """Training progress metrics - for streaming or polling"""

    step: int
    total_steps: int
    # Widened from the seed's float (DESIGN.md section 1): a step whose loss is NaN or
    # infinite is still an event, with `loss: null` and `loss_finite: false` (JSON
    # has no NaN).
    loss: Optional[float] = Field(description="The step's training loss; null when it was not finite.")
    learning_rate: float
    progress_percent: float
    loss_finite: bool = Field(default=True, description="False when the step's loss was NaN or infinite.")
    # Widened from the seed's int: a fractional epoch says where in the data we are.
    epoch: Optional[float] = None
    elapsed_seconds: Optional[float] = None
    eta_seconds: Optional[float] = None
    grad_norm: Optional[float] = None
    eval_loss: Optional[float] = None
    num_tokens: Optional[int] = None  # tokens trained on so far
    tokens_per_second: Optional[float] = Field(
        default=None,
        description="Tokens trained per second over the latest 10 steps (fewer at the start): a recent rate,"
        " not an average since the start.",
    )
    mean_token_accuracy: Optional[float] = Field(
        default=None, description="The share (0 to 1) of the step's target tokens the model predicted right, as TRL logs it."
    )
    memory_bytes: Optional[int] = Field(default=None, description="The training process's resident memory (RSS) at the step.")
    gpu_memory_bytes: Optional[int] = Field(
        default=None, description="GPU memory the training process holds (PyTorch's reserved bytes); absent without a GPU."
    )
    timestamp: Optional[float] = None  # Unix time when the step ended (for latency and time axes)

    @model_validator(mode="before")
    @classmethod
    def _no_values_json_cannot_carry(cls, data: Any) -> Any:
        """A NaN or infinite loss becomes `loss: null, loss_finite: false`; any other
        optional metric that is not finite is left out (a child's message is parsed
        by Python's JSON reader, which takes NaN)."""
        if not isinstance(data, dict) or all(not isinstance(v, float) or math.isfinite(v) for v in data.values()):
            return data  # every event but a diverged one
        clean = dict(data)
        for key, value in data.items():
            if isinstance(value, float) and not math.isfinite(value):
                if key == "loss":
                    clean["loss"], clean["loss_finite"] = None, False
                elif key not in _REQUIRED_METRICS:
                    del clean[key]
        return clean

    @model_validator(mode="after")
    def _null_loss_is_not_finite(self) -> TrainingProgress:
        if self.loss is None:
            self.loss_finite = False
        return self


class JobList(BaseModel):
    """Every job's current status, newest first."""

    data: list[TrainingStatus]
    count: int


class Health(BaseModel):
    status: Literal["ok"] = "ok"


# -- exports (DESIGN.md section 8) ---------------------------------------------

ExportPhase = Literal[
    "idle",
    "loading_model",
    "merging",
    "converting",
    "quantizing",
    "completed",
    "error",
    "stopped",
]
ExportFormat = Literal["merged_16bit", "gguf", "lora_gguf"]
# llama.cpp's names, lower case; the one list the API, the child and the UI share.
GgufQuantization = Literal["f16", "bf16", "q8_0", "q4_k_m", "q5_k_m", "q6_k"]
# lora_gguf: llama.cpp's LoRA converter writes these.
LoraGgufType = Literal["f16", "bf16", "q8_0"]
DEFAULT_GGUF_QUANTIZATION = "q4_k_m"


class ExportStartRequest(BaseModel):
    """`POST /export/start`: export a completed training job's result."""

    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(description="The training job whose result (adapter or model) to export.")
    format: ExportFormat = Field(description="merged_16bit (safetensors), gguf, or lora_gguf (the adapter alone).")
    quantization: Optional[Union[str, list[str]]] = Field(
        default=None,
        description="gguf: one or several of f16, bf16, q8_0, q4_k_m, q5_k_m, q6_k (default q4_k_m), one file"
        " each; lora_gguf: one of f16, bf16, q8_0 (default f16); merged_16bit: none.",
    )

    @field_validator("quantization", mode="after")
    @classmethod
    def _known_quantizations(cls, value: Optional[Union[str, list[str]]], info: ValidationInfo) -> Optional[list[str]]:
        if value is None:
            return None
        names = [value] if isinstance(value, str) else list(value)
        names = [name.strip().lower() for name in names]
        valid = get_args(GgufQuantization)
        unknown = [name for name in names if name not in valid]
        if unknown:
            raise PydanticCustomError(
                "quantization_unknown",
                "quantization: {unknown} is not one llama.cpp makes here; choose among {valid}",
                {"unknown": ", ".join(repr(n) for n in unknown), "valid": ", ".join(valid)},
            )
        if not names:
            raise PydanticCustomError("quantization_empty", "quantization: name at least one, e.g. [\"q4_k_m\"]", {})
        return list(dict.fromkeys(names))  # each once, in the order asked

    @model_validator(mode="after")
    def _quantization_fits_format(self) -> ExportStartRequest:
        names = self.quantization
        if self.format == "merged_16bit" and names:
            raise PydanticCustomError(
                "quantization_not_applicable", "quantization: merged_16bit writes 16-bit safetensors; leave quantization out", {}
            )
        if self.format == "lora_gguf" and names:
            allowed = get_args(LoraGgufType)
            if len(names) != 1 or names[0] not in allowed:
                raise PydanticCustomError(
                    "quantization_not_applicable",
                    "quantization: lora_gguf writes one adapter file, as one of {allowed}",
                    {"allowed": ", ".join(allowed)},
                )
        return self

    def quantizations(self) -> list[str]:
        """The files to write, one per name ([] for merged_16bit)."""
        if self.format == "merged_16bit":
            return []
        if self.quantization:
            return list(self.quantization)
        return [DEFAULT_GGUF_QUANTIZATION] if self.format == "gguf" else ["f16"]


class ExportJobResponse(BaseModel):
    export_id: str
    status: Literal["queued", "error"]
    message: str
    error: Optional[str] = None


class ExportFile(BaseModel):
    """One finished file of a completed export (`details.files`)."""

    name: str  # relative to the export's folder; what /export/download/{id}/{name} takes
    format: ExportFormat
    quantization: Optional[str] = None  # None for merged_16bit files and the Modelfile
    bytes: int
    sha256: str


class ExportStatus(BaseModel):
    export_id: str
    job_id: str  # the training job exported
    phase: ExportPhase
    is_running: bool
    message: str
    error: Optional[str] = None
    details: Optional[dict[str, Any]] = None


class ExportProgress(BaseModel):
    """Progress through one stage of an export, per tensor while converting or quantizing."""

    stage: Literal["merging", "converting", "quantizing"]
    file: Optional[str] = None  # the file being written
    done: int  # tensors (or, while merging, layers) finished in this stage's file
    total: int
    progress_percent: float  # the whole export, 0 to 100
    elapsed_seconds: Optional[float] = None
    eta_seconds: Optional[float] = None
    timestamp: Optional[float] = None


class ExportList(BaseModel):
    data: list[ExportStatus]
    count: int
