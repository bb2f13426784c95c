"""The wire models: the seed's four models, the training request, and list shapes.

Names, fields and literal values follow the seed's models (docs/API.md, docs/EVENTS.md); the
request follows Unsloth Studio's `TrainingStartRequest` for text models (docs/API.md,
The training request). This module holds no logic beyond field validation.
"""

from __future__ import annotations

import copy
import math
import re
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

from finetune_studio.hardware import Precision
from finetune_studio.text import UnicodeChecked, refuse_invalid_text

# The request's `compile` (training/compilation.py): "auto", true or false.
CompileChoice = Union[Literal["auto"], bool]

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
    "evaluation_failed",
    "worker_died",
    "worker_failed_to_start",
    "cluster_unavailable",
    "storage_unavailable",
    "server_restarted",
    "internal_error",
]

TrainingType = Literal["LoRA/QLoRA", "Full Finetuning", "Continued Pretraining"]
FormatType = Literal["auto", "alpaca", "chatml", "sharegpt", "raw"]
# docs/API.md, Training methods: what the trainer optimises. sft learns the answers; dpo, orpo
# and kto learn preferences; grpo learns from rewards of its own completions.
TrainingMethod = Literal["sft", "dpo", "orpo", "kto", "grpo"]
# The request's `report_to` (training/trackers.py): the experiment trackers a run is logged to.
Tracker = Literal["mlflow", "trackio", "wandb", "tensorboard"]
# `beta` when the request leaves it out, per method (sft has none): training/methods.py,
# and OpenAI's "auto" beta for dpo (api/openai_jobs.py).
DEFAULT_BETA: dict[str, float] = {"dpo": 0.1, "orpo": 0.1, "kto": 0.1, "grpo": 0.0}

# Fields that hold secrets: never stored, logged or echoed.
SECRET_FIELDS = ("hf_token", "wandb_token")
# Fields whose values no error ever quotes: the secrets above, and an account's password (POST /auth/users).
REDACTED_FIELDS = (*SECRET_FIELDS, "password")
# Keys the server adds to a request as it stores it, beside the request's fields.
WITHHELD_SECRETS = "withheld_secrets"  # the names of the secrets it carried (never their values)
QUEUED_WARNINGS = "queued_warnings"  # what admission noticed, for the job's statuses to carry
OPENAI_JOB = "openai"  # a job created through /v1/fine_tuning/jobs: OpenAI's fields that have no twin here
SWEEP_TRIAL = "sweep"  # a sweep's trial (POST /sweeps): {sweep_id, trial}, shown as its statuses' details.sweep
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


def null_means_default(model: type[BaseModel], data: Any) -> Any:
    """A body with every `null` dropped that stands for a field's default (a field
    that has a default other than None): what the Studio's UI means by sending it."""
    if not isinstance(data, dict):
        return data
    fields = model.model_fields
    nulls = [
        name for name, value in data.items()
        if value is None and name in fields and not fields[name].is_required() and fields[name].default is not None
    ]
    return {k: v for k, v in data.items() if k not in nulls} if nulls else data


def method_of(training_type: Optional[str], use_lora: Optional[bool]) -> Literal["lora", "full"]:
    """How a request trains the weights: "lora" (an adapter) or "full" (every weight).
    The one rule, for the training child and for the server's run summary."""
    return "full" if training_type == "Full Finetuning" or use_lora is False else "lora"


# -- GRPO's built-in rewards (docs/API.md, Training methods; computed by training/rewards.py) --


def _valid_regex(value: Optional[str], info: ValidationInfo) -> Optional[str]:
    if value is None:
        return value
    try:
        re.compile(value)
    except re.error as exc:
        raise PydanticCustomError(
            "regex_invalid", "{field}: {value} is not a valid regular expression ({problem})",
            {"field": info.field_name or "pattern", "value": repr(value[:80]), "problem": str(exc)},
        ) from None
    return value


class _Reward(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weight: float = Field(default=1.0, description="How much this reward counts in the sum of the rewards.")

    @field_validator("weight")
    @classmethod
    def _finite_weight(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("weight must be a finite number")
        return value


class ExactMatchReward(_Reward):
    """1 when the completion (or what `extract` captures of it) equals the row's `column`, else 0."""

    name: Literal["exact_match"]
    column: str = Field(default="answer", min_length=1, description="The dataset column that holds the reference answer.")
    extract: Optional[str] = Field(
        default=None,
        description="A regular expression; the completion's answer is its first match (group 1 if it has a group)."
        " Unset: the whole completion.",
    )
    ignore_case: bool = Field(default=True, description="Compare without regard to case (spaces at the ends never count).")

    _regex = field_validator("extract")(_valid_regex)


class NumericMatchReward(_Reward):
    """1 when the completion's number (the last one in it, or what `extract` captures) is within
    `tolerance` of the row's `column`, else 0."""

    name: Literal["numeric_match"]
    column: str = Field(default="answer", min_length=1, description="The dataset column that holds the reference number.")
    extract: Optional[str] = Field(
        default=None, description="A regular expression whose first match (group 1 if any) is the number; unset: the last number."
    )
    tolerance: float = Field(default=1e-6, ge=0.0, description="The largest difference that still counts as equal.")

    _regex = field_validator("extract")(_valid_regex)


class RegexReward(_Reward):
    """A format reward: `match_reward` when the completion matches `pattern`, else `miss_reward`."""

    name: Literal["regex"]
    pattern: str = Field(min_length=1, description="A Python regular expression.")
    full_match: bool = Field(default=False, description="The whole completion must match (else: a match anywhere in it).")
    match_reward: float = 1.0
    miss_reward: float = 0.0

    _regex = field_validator("pattern")(_valid_regex)


class LengthReward(_Reward):
    """1 at `target` length, falling smoothly with the distance: 1 / (1 + |length - target| / tolerance)."""

    name: Literal["length"]
    target: int = Field(ge=0, description="The wanted completion length, in `unit`s.")
    unit: Literal["characters", "words", "tokens"] = "characters"
    tolerance: float = Field(default=0.0, ge=0.0, description="The distance at which the reward is 0.5; 0 means max(target, 1) / 2.")


RewardFunction = Annotated[
    Union[ExactMatchReward, NumericMatchReward, RegexReward, LengthReward],
    Field(discriminator="name"),
]
REWARD_NAMES = ("exact_match", "numeric_match", "regex", "length")
# Fields that only a GRPO job reads.
_GRPO_FIELDS = ("reward_functions", "num_generations", "max_completion_length")
# The columns each method's rows have (child/datasets/methods.py reads them).
_METHOD_COLUMNS = {
    "dpo": "prompt, chosen, rejected",
    "orpo": "prompt, chosen, rejected",
    "kto": "prompt, completion, label",
    "grpo": "prompt (and the columns its rewards read)",
}


# -- evaluation suites (docs/API.md, Evaluation) -------------------------------
#
# Defined before the training request, whose `eval_after` takes them. What each
# suite measures is computed by the evaluation child (finetune_studio/evaluation/).

MAX_EVAL_MODELS = 8
# The most per-sample rows one GET /eval/results/{id}/samples answers (its `limit`); the page reads by it.
MAX_EVAL_SAMPLE_PAGE = 1000
MAX_EVAL_SUITES = 16
# lm-evaluation-harness task names: letters, digits and `_.-` (a group or a single task).
_TASK_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$"
# An environment variable's name, as POSIX shells spell them.
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


class HeldoutSuite(BaseModel):
    """Held-out data in any shape and file type training reads: loss, perplexity and token
    accuracy over the reference answers' tokens, and each model's greedy answer scored
    against the reference (exact match, ROUGE-L, BLEU, chrF)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["heldout"]
    data: list[PathText] = Field(min_length=1, max_length=64, description="Dataset files, read as training reads them.")
    format_type: FormatType = Field(default="auto", description="The data's shape, as in a training request.")
    custom_format_mapping: Optional[dict[str, str]] = Field(default=None, description="Column name to role, as in a training request.")
    max_new_tokens: int = Field(default=128, ge=1, le=4096, description="The longest greedy answer, in tokens.")
    limit: Optional[int] = Field(default=None, ge=1, description="Evaluate the first this many rows only.")


class LmEvalSuite(BaseModel):
    """lm-evaluation-harness tasks, run by lm-eval itself against each model through /v1/completions."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["lm_eval"]
    tasks: list[Annotated[str, Field(pattern=_TASK_NAME)]] = Field(
        min_length=1, max_length=32, description="Task (or group) names, of lm-eval's own or of tasks_dir's YAML files."
    )
    tasks_dir: Optional[PathText] = Field(default=None, description="A folder of task YAML files (with their data on this machine).")
    num_fewshot: Optional[int] = Field(default=None, ge=0, le=64, description="Examples in each prompt (lm-eval's --num_fewshot).")
    limit: Optional[float] = Field(
        default=None, gt=0, allow_inf_nan=False,
        description="Documents per task (lm-eval's --limit): a count, or below 1 a fraction of them.",
    )

    @field_validator("limit")
    @classmethod
    def _whole_count(cls, value: Optional[float]) -> Optional[float]:
        if value is not None and value >= 1 and value != int(value):
            raise ValueError("limit: a count of documents is a whole number (below 1 it is a fraction of them)")
        return value


class JudgeModel(BaseModel):
    """The model that judges: one this server serves (no base_url), or any OpenAI-compatible endpoint."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=512, description="The judge's model id.")
    base_url: Optional[str] = Field(
        default=None, max_length=2000, description="An OpenAI-compatible API (`https://host/v1`); unset: this server's /v1."
    )
    api_key_env: Optional[str] = Field(
        default=None, pattern=_ENV_NAME,
        description="The server's environment variable that holds the endpoint's API key (one the operator lists in"
        " FINETUNE_STUDIO_JUDGE_KEY_ENVS); the key itself is never sent, stored or shown.",
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: Optional[str]) -> Optional[str]:
        if value is None:
            return value
        text = value.strip()
        if not re.match(r"^https?://[^/?#\s@]+(/[^\s?#]*)?$", text):
            raise ValueError("judge.base_url: an http:// or https:// URL of an OpenAI-compatible API (https://host/v1), without credentials, query or fragment")
        return text.rstrip("/")


class JudgeSuite(BaseModel):
    """Every model answers every prompt; the judge compares each model's answer with the first
    model's, twice (positions swapped): a win, tie or loss per prompt."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["judge"]
    prompts: PathText = Field(description="A file of prompts (`prompt`, and optionally `reference`), in any file type training reads.")
    judge: JudgeModel
    max_new_tokens: int = Field(default=256, ge=1, le=4096, description="The longest answer of each model, in tokens.")
    limit: Optional[int] = Field(default=None, ge=1, description="Judge the first this many prompts only.")


EvalSuite = Annotated[Union[HeldoutSuite, LmEvalSuite, JudgeSuite], Field(discriminator="type")]
EVAL_SUITE_TYPES = ("heldout", "lm_eval", "judge")


def suite_names(types: list[str]) -> list[str]:
    """Each suite's name in the results (the first part of a metric's `suite/name`): its type,
    and from the second suite of a type on, `type_2`, `type_3` ..."""
    seen: dict[str, int] = {}
    names = []
    for kind in types:
        seen[kind] = seen.get(kind, 0) + 1
        names.append(kind if seen[kind] == 1 else f"{kind}_{seen[kind]}")
    return names


class EvalGuard(BaseModel):
    """`eval_guard`: warn when the fine-tuned model falls behind its base by more than `max_drop`."""

    model_config = ConfigDict(extra="forbid")

    metric: str = Field(
        min_length=3, max_length=300, pattern=r"^[A-Za-z0-9_]+/\S+$",
        description='A metric of eval_after\'s results, "suite/name": heldout/loss, heldout/rouge_l, judge/win_rate ...',
    )
    max_drop: float = Field(ge=0, allow_inf_nan=False, description="How far (in the metric's units) the fine-tuned model may fall behind.")


class TrainingStartRequest(UnicodeChecked):
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
    eval_sample_count: int = Field(
        default=2,
        ge=0,
        le=16,
        description="Extension. At each evaluation, the model answers this many prompts of the evaluation data"
        " (greedy, a few dozen tokens) and the progress event carries them as eval_samples (0: off).",
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
    report_to: list[Tracker] = Field(
        default_factory=list, max_length=4,
        description='Extension. Experiment trackers the run is logged to: "mlflow" (at MLFLOW_TRACKING_URI), "trackio"'
        ' (a local project named by project_name), "wandb", "tensorboard" (as enable_wandb/enable_tensorboard, which'
        " still work). Each run logs the request's settings as parameters and every step's metrics; a tracker that is"
        " not installed or cannot be reached is a warning, and the run goes on. details.trackers says where it was logged.",
    )
    resume_from_checkpoint: Optional[PathText] = None
    gpu_ids: Optional[list[int]] = None
    precision: Precision = Field(
        default="auto",
        description='Extension. The dtype the job computes in: "auto" (bf16 autocast where bf16 is native: a GPU'
        ' with bf16, a CPU with AMX or AVX512-BF16; fp32 elsewhere), "bf16" or "fp32" (forced). With LoRA in bf16'
        " the frozen base weights are held in bf16 and the adapter's in fp32; details.precision says what ran and why.",
    )
    compile: CompileChoice = Field(
        default="auto",
        description='Extension. torch.compile of the model: "auto" compiles when the run is long enough to earn back'
        " the compile time (estimated from its steps and its first steps' time; the default), true always, false"
        " never. Compiled graphs are cached under the data dir; a compile that fails falls back to eager with a"
        " warning. details.compile says what ran and why.",
    )
    eval_after: list[EvalSuite] = Field(
        default_factory=list, max_length=MAX_EVAL_SUITES,
        description="Extension. Evaluation suites (as POST /eval/start takes them) run on the job against its base once"
        " it completes: an evaluation queued by the completing status, whose id is its details.eval_id.",
    )
    eval_guard: Optional[EvalGuard] = Field(
        default=None,
        description="Extension. With eval_after: {metric, max_drop}, a warning when the fine-tuned model falls behind its"
        " base on that metric by more than max_drop (the run does not fail).",
    )

    # training methods (docs/API.md, Training methods)
    training_method: TrainingMethod = Field(
        default="sft",
        description="Extension. sft (default) trains on the answers; dpo, orpo and kto on preferences"
        " (prompt/chosen/rejected rows; kto: prompt/completion/label); grpo on rewards of its own completions.",
    )
    beta: Optional[float] = Field(
        default=None,
        ge=0.0,
        description="Extension. dpo/kto: how far from the reference the model may move (default 0.1); orpo: the weight"
        " of the odds-ratio term (default 0.1); grpo: the KL penalty (default 0: no reference model).",
    )
    reward_functions: list[RewardFunction] = Field(
        default_factory=list,
        description="Extension, grpo: built-in rewards, each {name, ...parameters}: exact_match, numeric_match, regex,"
        " length. Their sum (times each weight) is the completion's reward.",
    )
    num_generations: Optional[int] = Field(
        default=None, ge=2, le=256, description="Extension, grpo: completions sampled per prompt and compared (default 4)."
    )
    max_completion_length: Optional[int] = Field(
        default=None, ge=1, le=65_536, description="Extension, grpo: the longest completion sampled, in tokens (default 256)."
    )

    # scale-out (docs/API.md, Ray fields; docs/SCALE-OUT.md): extensions, used when the server runs jobs on Ray
    num_workers: int = Field(
        default=1, ge=1, le=4096,
        description="Extension. Data-parallel workers for the job (each trains on its share of every batch); above 1 needs"
        " a server started with --ray-address.",
    )
    resources_per_worker: Optional[dict[str, Annotated[float, Field(ge=0, allow_inf_nan=False)]]] = Field(
        default=None,
        description='Extension. What each Ray worker asks the cluster for, e.g. {"CPU": 4, "GPU": 1}; default {"CPU": 1}.'
        " A job waits in the cluster's queue until every worker's share is free.",
    )

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """The Studio's UI sends `null` for settings it leaves alone (`train_split`
        with local files, say): a null for a field that has a default and cannot be
        null means that default."""
        return null_means_default(cls, data)

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

    @model_validator(mode="after")
    def _check_method(self) -> TrainingStartRequest:
        """The method's fields, and the other fields that must agree with it."""
        method = self.training_method
        if method != "grpo":
            given = [name for name in _GRPO_FIELDS if getattr(self, name)]
            if given:
                raise ValueError(
                    f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to training_method grpo only;"
                    f" remove {'it' if len(given) == 1 else 'them'}, or set training_method to grpo"
                )
        elif not self.reward_functions:
            raise ValueError(
                'training_method grpo needs reward_functions, e.g. [{"name": "exact_match", "column": "answer"}];'
                f" the built-in rewards are {', '.join(REWARD_NAMES)}"
            )
        if method == "sft":
            if self.beta is not None:
                raise ValueError("beta applies to training_method dpo, orpo, kto and grpo; remove it for sft")
            return self
        if method != "grpo" and self.beta == 0:
            raise ValueError(f"beta must be above 0 for {method} (at 0 the preference term no longer depends on the model); 0.1 is usual")
        if self.training_type == "Continued Pretraining":
            raise ValueError(
                f"training_method {method} trains on prompts and answers; Continued Pretraining trains on raw text:"
                ' set training_type to "LoRA/QLoRA" or "Full Finetuning", or training_method to sft'
            )
        if self.custom_format_mapping:
            raise ValueError(
                f"custom_format_mapping maps columns to chat roles for sft; training_method {method} reads the columns"
                f" {_METHOD_COLUMNS[method]}: rename the dataset's columns, or leave custom_format_mapping out"
            )
        if method == "kto" and self.batch_size < 2:
            raise ValueError(
                "training_method kto needs batch_size 2 or more: its KL estimate pairs each prompt with another row's"
                " completion in the same batch"
            )
        return self

    @model_validator(mode="after")
    def _check_eval_guard(self) -> TrainingStartRequest:
        """eval_guard reads a metric of eval_after's results: it needs eval_after, and a suite of it."""
        if self.eval_guard is None:
            return self
        if not self.eval_after:
            raise ValueError("eval_guard reads the results of eval_after: add eval_after (the suites to run), or remove eval_guard")
        names = suite_names([suite.type for suite in self.eval_after])
        suite = self.eval_guard.metric.split("/", 1)[0]
        if suite not in names:
            raise ValueError(
                f"eval_guard.metric {self.eval_guard.metric!r} names no suite of eval_after (its suites: {', '.join(names)});"
                " write it as suite/name, e.g. heldout/loss"
            )
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


class EvalSample(BaseModel):
    """One evaluation prompt and what the model answered it at an evaluated step."""

    prompt: str = Field(description="The prompt as the model saw it (rendered with its chat template), maybe shortened.")
    completion: str = Field(description="The model's greedy continuation.")


# Fields of TrainingProgress that a NaN cannot simply be dropped from (they stay invalid).
_REQUIRED_METRICS = frozenset({"step", "total_steps", "learning_rate", "progress_percent"})


class TrainingProgress(BaseModel):
    """Training progress metrics - for streaming or polling"""

    step: int
    total_steps: int
    # Widened from the seed's float (docs/EVENTS.md, Progress events): a step whose loss is NaN or
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
    mfu: Optional[float] = Field(
        default=None,
        description="Model FLOPs utilization: the model's FLOPs per token times tokens_per_second, over the device's"
        " peak in the dtype the job computes in (measured once per machine by a short matmul probe); 0 to 1.",
    )
    mean_token_accuracy: Optional[float] = Field(
        default=None, description="The share (0 to 1) of the step's target tokens the model predicted right, as TRL logs it."
    )
    eval_mean_token_accuracy: Optional[float] = Field(
        default=None, description="On an evaluated step: mean_token_accuracy over the evaluation data."
    )
    memory_bytes: Optional[int] = Field(default=None, description="The training process's resident memory (RSS) at the step.")
    gpu_memory_bytes: Optional[int] = Field(
        default=None, description="GPU memory the training process holds (PyTorch's reserved bytes); absent without a GPU."
    )
    timestamp: Optional[float] = None  # Unix time when the step ended (for latency and time axes)
    metrics: Optional[dict[str, float]] = Field(
        default=None,
        description="Extension (docs/API.md, Training methods): what the training method logs beyond the loss, by TRL's names:"
        " dpo rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies; grpo reward, reward_std,"
        " rewards/<function>/mean, completions/mean_length; kto and orpo theirs. Finite values only.",
    )
    eval_samples: Optional[list[EvalSample]] = Field(
        default=None,
        description="On an evaluated step: the model's greedy answers to the first eval_sample_count prompts of the"
        " evaluation data, as it stands at that step.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_values_json_cannot_carry(cls, data: Any) -> Any:
        """A NaN or infinite loss becomes `loss: null, loss_finite: false`; any other
        optional metric that is not finite is left out (a child's message is parsed
        by Python's JSON reader, which takes NaN), inside `metrics` too."""
        if isinstance(data, dict) and isinstance(data.get("metrics"), dict):
            kept = {k: v for k, v in data["metrics"].items() if not (isinstance(v, float) and not math.isfinite(v))}
            if len(kept) != len(data["metrics"]):
                data = {**data, "metrics": kept}
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


class StoreProblem(BaseModel):
    """Why the server's last write to its data dir failed (`/health` while degraded)."""

    error_code: Literal["disk_full", "storage_unavailable"]
    message: str


class Health(BaseModel):
    """`ok`; or `degraded` while the server's writes to its data dir fail (a full disk,
    a read-only file system): it keeps serving what it can and retries on its own."""

    status: Literal["ok", "degraded"] = "ok"
    store: Optional[StoreProblem] = None


# -- exports (docs/API.md, Export) ---------------------------------------------

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
    error_code: Optional[ErrorCode] = None  # a refusal's code (export_tools_missing, say), for a client to act on


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


# -- dataset inspection (POST /datasets/inspect, `finetune-studio inspect`) ----

# The fields a dataset inspection shares with TrainingStartRequest: the same types,
# bounds, defaults and descriptions (taken from the request's own fields).
INSPECT_SHARED_FIELDS = (
    "hf_dataset", "local_datasets", "subset", "train_split", "dataset_slice_start", "dataset_slice_end",
    "custom_format_mapping", "bad_rows", "max_bad_row_fraction", "hf_token", "trust_remote_code",
    "max_seq_length", "train_on_completions",
)
# The model_name of the TrainingStartRequest an inspection without a model builds: a
# hub id in form (never a path), which nothing reads.
NO_MODEL = "inspection/no-model"
MAX_PREVIEW_ROWS = 20


def _as_in_request(name: str) -> Any:
    """TrainingStartRequest's definition of a field, for a model that takes the same field."""
    return copy.copy(TrainingStartRequest.model_fields[name])


class DatasetInspectRequest(BaseModel):
    """`POST /datasets/inspect`: the data fields of a training request, read and checked as a job would.

    Every field means what it means in TrainingStartRequest. `model_name` is
    optional: with it, the rows are rendered with that model's chat template and
    measured in its tokens (its tokenizer is loaded, never its weights).
    """

    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    hf_dataset: Optional[PathText] = _as_in_request("hf_dataset")
    local_datasets: list[PathText] = _as_in_request("local_datasets")
    format_type: FormatType = Field(default="auto", description="Dataset shape: auto (detected), alpaca, chatml, sharegpt or raw.")
    subset: Optional[str] = _as_in_request("subset")
    train_split: str = _as_in_request("train_split")
    dataset_slice_start: Optional[int] = _as_in_request("dataset_slice_start")
    dataset_slice_end: Optional[int] = _as_in_request("dataset_slice_end")
    custom_format_mapping: Optional[dict[str, str]] = _as_in_request("custom_format_mapping")
    bad_rows: Literal["error", "skip"] = _as_in_request("bad_rows")
    max_bad_row_fraction: float = _as_in_request("max_bad_row_fraction")
    model_name: Optional[PathText] = Field(
        default=None,
        description="A local model folder, a .gguf file or a hub id whose tokenizer and chat template shape the"
        " preview and count the tokens (no weights are loaded). Without it: no token statistics.",
    )
    hf_token: Optional[str] = _as_in_request("hf_token")
    trust_remote_code: bool = _as_in_request("trust_remote_code")
    max_seq_length: int = _as_in_request("max_seq_length")
    train_on_completions: bool = _as_in_request("train_on_completions")
    preview_rows: int = Field(default=3, ge=0, le=MAX_PREVIEW_ROWS, description="How many of the first rows to show.")

    @model_validator(mode="before")
    @classmethod
    def _as_the_request_reads_it(cls, data: Any) -> Any:
        return null_means_default(cls, refuse_invalid_text(cls.__name__, data))

    @model_validator(mode="after")
    def _a_job_would_take_it(self) -> DatasetInspectRequest:
        # TrainingStartRequest's own checks (slices, some data named), word for word.
        from pydantic import ValidationError

        try:
            self.training_request()
        except ValidationError as exc:
            raise ValueError("; ".join(str(error["msg"]).removeprefix("Value error, ") for error in exc.errors())) from None
        return self

    def training_request(self) -> TrainingStartRequest:
        """The training request that reads this data: what the dataset layer and admission take."""
        fields = {name: getattr(self, name) for name in INSPECT_SHARED_FIELDS}
        return TrainingStartRequest(
            model_name=self.model_name or NO_MODEL,
            training_type="LoRA/QLoRA",
            format_type=self.format_type,
            **fields,
        )


class PreviewSegment(BaseModel):
    """A stretch of a row's text as the model sees it, and whether the loss covers it."""

    text: str
    trains: bool = Field(description="The loss is computed on these tokens (train_on_completions: the answers only).")
    role: Optional[str] = Field(default=None, description="The turn it belongs to (system, user, assistant, tool); null for raw text.")
    truncated: bool = Field(default=False, description="Past max_seq_length: the trainer cuts it off.")


class PreviewRow(BaseModel):
    index: int = Field(description="The row's index among the rows a job trains on (after slicing).")
    segments: list[PreviewSegment]
    tokens: Optional[int] = Field(default=None, description="Its length in tokens (with model_name).")
    clipped: bool = Field(default=False, description="The row is longer than the preview shows; the rest is left out here.")


class TokenStatistics(BaseModel):
    """Tokens per row, as the trainer sees each row before truncation."""

    min: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: int
    total: int


class DatasetProblem(BaseModel):
    """One problem, located as a job's error locates it."""

    kind: str = Field(description="missing_field, bad_json, unknown_role... (per bad row); source for a whole source.")
    file: str = Field(description="The file (or dataset split) it is in; empty when it is not in one.")
    where: str = Field(description='"line N", "row N", "line N (row M)", or empty for the whole file.')
    problem: str


class DatasetInspection(BaseModel):
    """What a job would make of the data: shape, rows, a preview, token statistics, and every problem."""

    ok: bool = Field(description="A job would read this data and start training (no error).")
    error: Optional[str] = Field(default=None, description="The error a job would end with, word for word.")
    error_code: Optional[ErrorCode] = None
    problems: list[DatasetProblem] = Field(default_factory=list, description="Each kind of bad row's first examples, or the one problem.")
    problem_counts: dict[str, int] = Field(default_factory=dict, description="Bad rows by kind.")
    shape: Optional[str] = Field(default=None, description="alpaca, chatml, sharegpt, raw or custom (a+b when sources differ).")
    detected: bool = Field(default=False, description="format_type was auto: the shape is what was detected.")
    shapes: dict[str, str] = Field(default_factory=dict, description="Each source and the shape it was read as.")
    columns: list[str] = Field(default_factory=list, description="The columns of the first source's first record.")
    suggested_mapping: Optional[dict[str, str]] = Field(
        default=None, description="A custom_format_mapping that reads these columns, when they are not a known shape."
    )
    rows: int = Field(default=0, description="The rows a job would train on.")
    read: int = Field(default=0, description="Records read, before bad rows and empty conversations were left out.")
    per_file: dict[str, int] = Field(default_factory=dict)
    skipped_rows: int = 0
    dropped_rows: int = 0
    warnings: list[str] = Field(default_factory=list)
    model_name: Optional[str] = None
    rendered_with: Literal["chat_template", "messages", "text"] = Field(
        default="messages",
        description="chat_template: as the model sees it; messages: each turn's text (no model_name); text: raw text.",
    )
    preview: list[PreviewRow] = Field(default_factory=list)
    tokens: Optional[TokenStatistics] = Field(default=None, description="With model_name.")
    max_seq_length: int
    truncated_rows: Optional[int] = Field(default=None, description="Rows longer than max_seq_length (with model_name).")


# -- evaluations (docs/API.md, Evaluation) --------------------------------------

EvalPhase = Literal["idle", "loading_model", "evaluating", "judging", "completed", "error", "stopped"]
# A model the evaluation compares: a job id (its adapter or model), `base:<job id>` (that job's
# base model), or any id GET /v1/models lists.
BASE_MODEL_PREFIX = "base:"


class EvalStartRequest(UnicodeChecked):
    """`POST /eval/start`: evaluate one or more models on one or more suites."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    models: list[Annotated[str, Field(min_length=1, max_length=512)]] = Field(
        min_length=1, max_length=MAX_EVAL_MODELS,
        description="Job ids (their adapter or model), base:<job id> (that job's base), or any id GET /v1/models"
        " lists. The differences (and the judge) compare each with the first.",
    )
    suites: list[EvalSuite] = Field(min_length=1, max_length=MAX_EVAL_SUITES)
    label: Optional[str] = Field(default=None, max_length=200, description="A free label shown with the evaluation.")

    @field_validator("models")
    @classmethod
    def _each_once(cls, models: list[str]) -> list[str]:
        repeated = sorted({model for model in models if models.count(model) > 1})
        if repeated:
            raise ValueError(f"models: {', '.join(repr(m) for m in repeated)} named more than once; name each model once")
        return models

    def suite_names(self) -> list[str]:
        return suite_names([suite.type for suite in self.suites])


class EvalJobResponse(BaseModel):
    eval_id: str
    status: Literal["queued", "error"]
    message: str
    error: Optional[str] = None
    field: Optional[str] = None  # a refusal's request field at fault (`models[1]`, `suites[0].data[0]`)


class EvalStatus(BaseModel):
    eval_id: str
    phase: EvalPhase
    is_running: bool
    message: str
    error: Optional[str] = None
    details: Optional[dict[str, Any]] = None


class EvalProgress(BaseModel):
    """Samples done: each model's answer (or score) of one row, or one judged pair, counts one."""

    step: int = Field(description="Samples done, over every suite and model.")
    total_steps: int = Field(description="Samples in all (an lm_eval suite's are counted once lm-eval has built its requests).")
    progress_percent: float
    suite: Optional[str] = None  # the suite under way (heldout, lm_eval, judge, heldout_2 ...)
    model: Optional[str] = None  # the model under way
    elapsed_seconds: Optional[float] = None
    eta_seconds: Optional[float] = None
    timestamp: Optional[float] = None


class EvalList(BaseModel):
    data: list[EvalStatus]
    count: int


class EvalMetric(BaseModel):
    """One row of the results table: a metric of one suite, for every model."""

    suite: str
    name: str = Field(description='"suite/name": heldout/loss, lm_eval/arc_easy/acc, judge/win_rate ...')
    values: dict[str, Optional[float]] = Field(description="Each model's value (null: the model has none).")
    ci95: dict[str, list[float]] = Field(default_factory=dict, description="Each value's 95% interval, [low, high].")
    deltas: dict[str, float] = Field(default_factory=dict, description="Each model's value minus the first model's.")
    deltas_ci95: dict[str, list[float]] = Field(default_factory=dict, description="Each difference's 95% interval (paired).")
    higher_is_better: bool = True
    samples: Optional[int] = Field(default=None, description="The samples the metric is computed over.")


class EvalResults(BaseModel):
    eval_id: str
    models: list[str]
    metrics: list[EvalMetric]
    samples_url: str
    warnings: list[str] = Field(default_factory=list)


class EvalSampleRow(BaseModel):
    """One sample of one suite, as every model answered it."""

    suite: str
    index: int
    prompt: str
    reference: Optional[str] = None
    answers: dict[str, str] = Field(default_factory=dict)
    scores: dict[str, dict[str, float]] = Field(default_factory=dict)
    verdict: Optional[dict[str, Any]] = Field(
        default=None, description="judge: per model compared, its outcome and the judge's two verdicts with their reasons."
    )


class EvalSamplePage(BaseModel):
    data: list[EvalSampleRow]
    total: int
    offset: int
    limit: int


# -- webhooks (docs/API.md, Webhooks; the events: finetune_studio/jobs/webhooks.py EVENTS) --


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(max_length=2048, description="Where each delivery is POSTed (http:// or https://).")
    events: list[str] = Field(min_length=1, max_length=64, description="The event types to send (docs/API.md, Webhooks; a 400 names them all).")
    secret: Optional[str] = Field(
        default=None, max_length=200,
        description="The signing secret, `whsec_` and base64 of 24 to 64 bytes; left out, the server makes one (answered once).",
    )


class Webhook(BaseModel):
    id: str
    object: Literal["webhook"] = "webhook"
    url: str
    events: list[str]
    created_at: int
    disabled: bool = False
    disabled_reason: Optional[str] = Field(default=None, description="Why the server stopped sending (a target that kept failing).")


class WebhookCreated(Webhook):
    secret: str = Field(description="The signing secret: shown here only, keep it to verify deliveries.")


class WebhookList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Webhook]


class WebhookDeleted(BaseModel):
    id: str
    object: Literal["webhook"] = "webhook"
    deleted: bool = True


class WebhookAttempt(BaseModel):
    number: int
    at: float = Field(description="When it was sent, seconds since the epoch.")
    status_code: Optional[int] = Field(default=None, description="The receiver's HTTP status (null: no answer).")
    error: Optional[str] = None
    duration_ms: float


class WebhookDelivery(BaseModel):
    id: str = Field(description="The delivery's `webhook-id` header, the same on every attempt.")
    object: Literal["webhook.delivery"] = "webhook.delivery"
    webhook_id: str
    event_type: str
    created_at: float
    state: Literal["pending", "delivered", "failed"]
    next_attempt_at: Optional[float] = None
    last_error: Optional[str] = None
    payload: dict[str, Any] = Field(description="The body as it is sent.")
    attempts: list[WebhookAttempt]


class WebhookDeliveryList(BaseModel):
    object: Literal["list"] = "list"
    data: list[WebhookDelivery]


class WebhookEventType(BaseModel):
    name: str
    description: str


class WebhookEventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[WebhookEventType]



# -- sweeps (docs/API.md, Sweeps; DESIGN section 14; the server's side: supervisor/sweeps.py) --

SweepState = Literal["queued", "running", "completed", "stopped", "error"]
TrialState = Literal["queued", "running", "complete", "pruned", "failed"]
# The objectives a trial reports while it trains: only these may be pruned on.
TRAINING_OBJECTIVES = ("eval_loss", "train_loss")
# `train_loss` as an objective: the mean of a trial's last this many logged losses.
TRAIN_LOSS_WINDOW = 10
MAX_SWEEP_TRIALS = 1000
MAX_SPACE_FIELDS = 32
MAX_CHOICES = 256


class SweepParameter(BaseModel):
    """One field of the training request and the values a trial may give it."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["float", "int", "categorical"]
    low: Optional[float] = None
    high: Optional[float] = None
    log: bool = False
    step: Optional[float] = Field(default=None, gt=0)
    choices: Optional[list[Union[bool, int, float, str, None]]] = Field(default=None, min_length=1, max_length=MAX_CHOICES)

    @model_validator(mode="after")
    def _consistent(self) -> SweepParameter:
        if self.type == "categorical":
            if self.choices is None:
                raise ValueError("a categorical parameter needs `choices`")
            if self.low is not None or self.high is not None or self.step is not None or self.log:
                raise ValueError("a categorical parameter takes `choices` only (no low, high, step or log)")
            return self
        if self.choices is not None:
            raise ValueError(f"a {self.type} parameter takes low and high, not `choices` (use type categorical)")
        if self.low is None or self.high is None:
            raise ValueError(f"a {self.type} parameter needs `low` and `high`")
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.low > self.high:
            raise ValueError(f"`low` ({self.low}) must be a finite number not above `high` ({self.high})")
        if self.log and self.step is not None:
            raise ValueError("`log` and `step` cannot go together (Optuna samples a log scale without steps)")
        if self.log and self.low <= 0:
            raise ValueError(f"a log scale needs `low` above 0 (it is {self.low})")
        if self.type == "int" and (self.low != int(self.low) or self.high != int(self.high)
                                   or (self.step is not None and self.step != int(self.step))):
            raise ValueError("an int parameter needs whole numbers for low, high and step")
        return self

    def edges(self) -> list[Any]:
        """The values whose requests are checked when the sweep is created: every choice, or low and high."""
        if self.choices is not None:
            return list(self.choices)
        low, high = self.bounds()
        if self.type == "int":
            return [int(low), int(high)]
        return [low, high]

    def bounds(self) -> tuple[float, float]:
        """low and high of a float or int parameter (the validator made sure both are there)."""
        if self.low is None or self.high is None:
            raise ValueError(f"a {self.type} parameter needs `low` and `high`")
        return self.low, self.high

    def grid(self) -> Optional[list[Any]]:
        """The values of a grid over this parameter: its choices, or low to high by step (None: no step)."""
        if self.choices is not None:
            return list(self.choices)
        if self.step is None:
            return None
        low, high = self.bounds()
        count = int(math.floor((high - low) / self.step + 1e-9)) + 1
        values = [low + index * self.step for index in range(count)]
        return [int(round(value)) for value in values] if self.type == "int" else values


class SweepObjective(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metric: str = Field(
        min_length=1, max_length=200,
        description="`eval_loss` (a trial's last evaluation), `train_loss` (the mean of its last 10 logged losses), or"
        " a metric `SUITE/NAME` of an `eval_after` suite run after each trial (heldout/loss, lm_eval/arc_easy/acc: the trial's model's value).",
    )
    direction: Literal["minimize", "maximize"] = "minimize"


class SweepPruner(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["none", "median", "hyperband"] = "none"
    n_startup_trials: int = Field(default=5, ge=0, le=MAX_SWEEP_TRIALS, description="median: trials that complete before any is pruned.")
    n_warmup_steps: int = Field(default=0, ge=0, description="median: steps of a trial before it may be pruned.")


class SweepCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request: dict[str, Any] = Field(description="A training request, as POST /train/start takes it.")
    space: dict[str, SweepParameter] = Field(min_length=1, max_length=MAX_SPACE_FIELDS)
    objective: SweepObjective
    trials: int = Field(ge=1, le=MAX_SWEEP_TRIALS)
    max_parallel: int = Field(default=1, ge=1, le=64)
    max_failed_trials: int = Field(default=3, ge=1, le=MAX_SWEEP_TRIALS)
    sampler: Literal["tpe", "random", "grid"] = "tpe"
    pruner: Union[Literal["none", "median", "hyperband"], SweepPruner] = "none"
    seed: Optional[int] = Field(default=None, ge=0, le=2**32 - 1)
    label: Optional[str] = Field(default=None, max_length=200)

    def pruner_spec(self) -> SweepPruner:
        return SweepPruner(type=self.pruner) if isinstance(self.pruner, str) else self.pruner


class SweepCreated(BaseModel):
    sweep_id: str
    status: Literal["queued"] = "queued"
    message: str


class SweepTrial(BaseModel):
    number: int
    job_id: str
    params: dict[str, Any]
    value: Optional[float] = None
    state: TrialState
    steps: Optional[int] = Field(default=None, description="A pruned trial's last step.")
    requeued: bool = Field(default=False, description="Interrupted by a server restart: its values were queued again (not counted).")


class SweepBest(BaseModel):
    number: int
    job_id: str
    params: dict[str, Any]
    value: float


class SweepStatus(BaseModel):
    sweep_id: str
    status: SweepState
    message: str
    error: Optional[str] = None
    label: Optional[str] = None
    objective: SweepObjective
    trials_planned: int
    counted: int = Field(description="Trials that count towards `trials_planned`: complete, pruned and failed.")
    failed: int
    trials: list[SweepTrial]
    best: Optional[SweepBest] = None
    importances: dict[str, float] = Field(default_factory=dict, description="Optuna's parameter importances (two complete trials or more).")
    created_at: float


class SweepList(BaseModel):
    sweeps: list[SweepStatus]


# -- accounts (jobs/accounts.py; docs/API.md, Accounts) ---------------------------


class KeyCreate(BaseModel):
    """POST /auth/keys: a key for the caller (an admin may name another `user`)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=100, description="A label to tell keys apart.")
    scopes: list[str] = Field(min_length=1, description="read, train, chat, files, admin (at most the caller's own).")
    expires_in_days: Optional[float] = Field(default=None, gt=0, le=3650)
    user: Optional[str] = Field(default=None, description="Admins only: the user the key is for.")


class UserCreate(BaseModel):
    """POST /auth/users (admins)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    password: Optional[str] = Field(default=None, min_length=8, max_length=1024, description="For the page's sign-in.")
    admin: bool = False


class SessionCreate(BaseModel):
    """POST /auth/session: the page's sign-in with a user's name and password."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=1024)
