"""OpenAI's wire models for chat (docs/API.md, Chat): the request, the answer, its
streamed chunks, the model list and the error shape; and for fine-tuning (docs/API.md, Files and Fine-tuning jobs):
files, jobs, their events and checkpoints.

Field names and values are OpenAI's, so that any OpenAI client (the official SDK,
LangChain, curl) talks to the server unchanged. Only what the server serves is
modelled; other fields of OpenAI's request are accepted and ignored, except those
whose meaning cannot be honoured (`n` above 1), which are refused with a 400 that
names them. This module holds no logic beyond field validation.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from finetune_studio.paths import name_problem
from finetune_studio.text import UnicodeChecked
from finetune_studio.wire import MAX_TOP_LOGPROBS, SamplingParams

OWNED_BY = "finetune-studio"
# The longest id a request may name (a file's is 29 characters: file- and 24 hex digits).
MAX_ID_CHARS = 128
# OpenAI takes at most 4 stop sequences; a few more cost nothing here.
MAX_STOP_SEQUENCES = 16
FinishReason = Literal["stop", "length"]
# OpenAI's `developer` role is its newer name for `system`: chat templates know only the latter.
Role = Literal["system", "developer", "user", "assistant"]


# -- the request ----------------------------------------------------------------


class ChatMessage(BaseModel):
    """One message of the conversation. `content` may be a string or a list of text parts
    (`{"type": "text", "text": ...}`), as OpenAI allows; other parts (images, audio) are refused."""

    model_config = ConfigDict(extra="ignore")

    role: Role
    content: Union[str, list[dict[str, Any]], None] = None
    name: Optional[str] = None

    @field_validator("content")
    @classmethod
    def _text_parts_only(cls, value: Union[str, list[dict[str, Any]], None]) -> Union[str, list[dict[str, Any]], None]:
        if isinstance(value, list):
            for part in value:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise PydanticCustomError(
                        "content_part",
                        "only text parts ({\"type\": \"text\", \"text\": ...}) can be served; got a part of type {kind}",
                        {"kind": repr(part.get("type"))},
                    )
        return value

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(part["text"]) for part in self.content)

    @property
    def template_role(self) -> str:
        """The role as chat templates know it."""
        return "system" if self.role == "developer" else self.role


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class _GenerationRequest(UnicodeChecked):
    """What OpenAI's chat and completions requests share: the model, how to sample, streaming."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, description="A job id (its adapter or model) or a base model a job used: see GET /v1/models")
    temperature: Optional[float] = Field(default=None, ge=0, le=2, description="0 is greedy (default 1)")
    top_p: Optional[float] = Field(default=None, gt=0, le=1, description="nucleus sampling (default 1)")
    stop: Union[str, list[str], None] = Field(default=None, description="text that ends the answer (not included in it)")
    seed: Optional[int] = Field(default=None, ge=0, le=2**64 - 1, description="the same seed and request give the same answer")
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None

    @field_validator("stop")
    @classmethod
    def _usable_stops(cls, value: Union[str, list[str], None]) -> Union[str, list[str], None]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if any(stop == "" for stop in stops):
            raise PydanticCustomError("stop_empty", "an empty stop string would end every answer before it starts: leave it out", {})
        if len(stops) > MAX_STOP_SEQUENCES:
            raise PydanticCustomError("stop_too_many", "at most {limit} stop strings", {"limit": MAX_STOP_SEQUENCES})
        return value

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def token_limit(self) -> Optional[int]:
        """The answer's tokens at most (None: the rest of the model's context)."""
        raise NotImplementedError

    def sampling(self) -> SamplingParams:
        """How the chat child is to choose the tokens (temperature 1 and top_p 1 unless given)."""
        return {
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "max_tokens": self.token_limit,
            "stop": self.stops,
            "seed": self.seed,
        }


class ChatCompletionRequest(_GenerationRequest):
    """`POST /v1/chat/completions`: OpenAI's request, the fields this server honours."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(default=None, ge=1, description="default: the rest of the model's context")
    max_completion_tokens: Optional[int] = Field(default=None, ge=1, description="OpenAI's newer name for max_tokens; wins over it")
    logprobs: Optional[bool] = Field(default=None, description="return the log-probability of each token of the answer")
    top_logprobs: Optional[int] = Field(
        default=None, ge=0, le=20,
        description=f"with logprobs: this many most likely alternatives beside each token (at most {MAX_TOP_LOGPROBS} here)",
    )
    n: Optional[int] = Field(default=None, description="must be 1: one choice per request")

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: Optional[int]) -> Optional[int]:
        if value is not None and value != 1:
            raise PydanticCustomError(
                "n_unsupported", "this server returns one choice per request: send n=1 (or leave n out), and send {n} requests for {n} answers",
                {"n": value},
            )
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_served(cls, value: Optional[int], info: ValidationInfo) -> Optional[int]:
        if value is None:
            return value
        if value > MAX_TOP_LOGPROBS:
            raise PydanticCustomError(
                "top_logprobs_too_many", "this server lists at most {limit} alternatives per token: ask for top_logprobs <= {limit}",
                {"limit": MAX_TOP_LOGPROBS},
            )
        if not info.data.get("logprobs"):
            raise PydanticCustomError("top_logprobs_without_logprobs", "top_logprobs needs logprobs: true", {})
        return value

    @property
    def token_limit(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# OpenAI's completions answer 16 tokens when max_tokens is not given.
COMPLETION_DEFAULT_MAX_TOKENS = 16
# The most choices one completions request asks for (prompts times n): each is an answer
# of its own in the chat child, where they decode together.
MAX_COMPLETION_CHOICES = 256
Prompt = Union[str, list[StrictInt]]


class CompletionRequest(_GenerationRequest):
    """`POST /v1/completions`: OpenAI's (legacy) completions request, the fields this server honours."""

    prompt: Union[str, list[str], list[StrictInt], list[list[StrictInt]]] = Field(
        description="a text, a list of texts, token ids, or a list of token-id lists (token ids are used exactly as given,"
        " no BOS added); one choice per prompt (times n)")
    echo: bool = Field(default=False, description="put the prompt (and, with logprobs, its tokens' log-probabilities) before the answer")
    max_tokens: Optional[int] = Field(default=None, ge=0, description=f"default {COMPLETION_DEFAULT_MAX_TOKENS}; 0 (with echo): the prompt alone")
    logprobs: Optional[int] = Field(
        default=None, ge=0, le=MAX_TOP_LOGPROBS,
        description=f"return each token's log-probability and this many most likely alternatives (0 to {MAX_TOP_LOGPROBS})",
    )
    n: Optional[int] = Field(default=None, ge=1, description="choices per prompt (default 1)")
    suffix: Optional[str] = Field(default=None, description="not served: must be left out")
    best_of: Optional[int] = Field(default=None, description="not served: must be 1 or left out")

    @field_validator("prompt")
    @classmethod
    def _some_prompt(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise PydanticCustomError("prompt_empty", "prompt must hold at least one text or token id", {})
        if isinstance(value, list) and any(isinstance(item, list) and not item for item in value):
            raise PydanticCustomError("prompt_empty", "a token-id prompt must hold at least one token id", {})
        ids = [item for item in value if isinstance(item, int)] if isinstance(value, list) else []
        ids += [token for item in value if isinstance(item, list) for token in item] if isinstance(value, list) else []
        if any(token < 0 for token in ids):
            raise PydanticCustomError("prompt_token", "token ids are 0 or more", {})
        return value

    @field_validator("max_tokens")
    @classmethod
    def _zero_with_echo(cls, value: Optional[int], info: ValidationInfo) -> Optional[int]:
        if value == 0 and not info.data.get("echo"):
            raise PydanticCustomError("max_tokens_zero", "max_tokens 0 asks for no answer: it needs echo: true (the prompt's"
                                      " own log-probabilities), else ask for 1 or more", {})
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: Optional[str]) -> Optional[str]:
        if value:
            raise PydanticCustomError("suffix_unsupported", "this server does not insert text before a suffix: leave suffix out", {})
        return value

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: Optional[int]) -> Optional[int]:
        if value is not None and value != 1:
            raise PydanticCustomError("best_of_unsupported", "this server returns the choices it generates, none picked among"
                                      " more: send best_of 1 (or leave it out), and n for more choices", {})
        return value

    @model_validator(mode="after")
    def _few_enough_choices(self) -> CompletionRequest:
        if len(self.prompts) * (self.n or 1) > MAX_COMPLETION_CHOICES:
            raise PydanticCustomError("too_many_choices", "prompts times n comes to {count} choices, over {limit}: send fewer"
                                      " prompts (or a smaller n) per request",
                                      {"count": len(self.prompts) * (self.n or 1), "limit": MAX_COMPLETION_CHOICES})
        return self

    @property
    def prompts(self) -> list[Prompt]:
        """Each prompt: a text, or token ids."""
        value = self.prompt
        if isinstance(value, str) or (value and all(isinstance(item, int) for item in value)):
            return [value]  # type: ignore[list-item]
        return list(value)  # type: ignore[arg-type]

    @property
    def token_limit(self) -> int:
        return COMPLETION_DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens


# -- the answer -----------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    """`choices[].logprobs` when the request asked for `logprobs`: one entry per token of the answer."""

    content: Optional[list[TokenLogprob]] = None
    refusal: Optional[list[TokenLogprob]] = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: Optional[ChoiceLogprobs] = None
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    system_fingerprint: Optional[str] = None


class Delta(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: Optional[ChoiceLogprobs] = None
    finish_reason: Optional[FinishReason] = None


class ChatCompletionChunk(BaseModel):
    """One `data:` line of a streamed answer. The last one, when the request asked for
    `stream_options.include_usage`, has no choices and carries `usage`."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Optional[Usage] = None
    system_fingerprint: Optional[str] = None


class CompletionLogprobs(BaseModel):
    """`choices[].logprobs` of a completion, OpenAI's legacy shape: per token its text, its
    log-probability (None for a prompt's first), the most likely alternatives with it
    (`{token: logprob}`; None for a prompt's first), and where it starts in the choice's text."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    text: str
    index: int = 0
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[FinishReason] = None


class Completion(BaseModel):
    """A completions answer, or (streamed) one `data:` line of it: then a choice's text is what
    it adds, and the last line, with `stream_options.include_usage`, has no choices and `usage`."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None
    system_fingerprint: Optional[str] = None


# -- models ---------------------------------------------------------------------


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = OWNED_BY


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


# -- errors ---------------------------------------------------------------------

class ErrorBody(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape: what the SDK turns into its exception types by status code."""

    error: ErrorBody


def error_body(message: str, type: str, param: Optional[str] = None, code: Optional[str] = None) -> dict[str, Any]:
    """`{"error": {message, type, param, code}}` as JSON-ready data."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# -- files (docs/API.md, Files) --------------------------------------------------


class FileObject(BaseModel):
    """A stored file, as OpenAI's Files API shows it."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"] = "processed"
    status_details: Optional[str] = None
    expires_at: Optional[int] = None
    # Extension: where the server keeps a `studio` file (the page's uploads), which is
    # what a training request names in `local_datasets`; absent for other purposes.
    path: Optional[str] = None


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    has_more: bool
    first_id: Optional[str] = None
    last_id: Optional[str] = None


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


# -- fine-tuning jobs (docs/API.md, Fine-tuning jobs) -----------------------------

Auto = Literal["auto"]
# OpenAI's statuses, and `paused` (its pause and resume).
FineTuningStatus = Literal["validating_files", "queued", "running", "succeeded", "failed", "cancelled", "paused"]


class Hyperparameters(BaseModel):
    """`"auto"` or a number each; what "auto" means here is documented in the README
    ("From OpenAI's SDK")."""

    model_config = ConfigDict(extra="forbid")

    # Strict: a whole number is a JSON integer, never `true` (which pydantic would read as 1).
    n_epochs: Union[Auto, StrictInt] = Field(default="auto", description="Passes over the training file (auto: 3).")
    batch_size: Union[Auto, StrictInt] = Field(default="auto", description="Rows per optimizer step (auto: 1).")
    learning_rate_multiplier: Union[Auto, float] = Field(
        default="auto", description="Scales the base learning rate, 2e-4 for LoRA (auto: 1)."
    )

    @field_validator("n_epochs", "batch_size", mode="before")
    @classmethod
    def _auto_or_whole(cls, value: Any) -> Any:
        return auto_or_number(value, whole=True)

    @field_validator("learning_rate_multiplier", mode="before")
    @classmethod
    def _auto_or_number(cls, value: Any) -> Any:
        return auto_or_number(value, whole=False)

    @field_validator("n_epochs", "batch_size")
    @classmethod
    def _positive_count(cls, value: Union[str, int]) -> Union[str, int]:
        if isinstance(value, int) and not 1 <= value <= 1024:
            raise PydanticCustomError("count_range", "must be \"auto\" or a whole number from 1 to 1024", {})
        return value

    @field_validator("learning_rate_multiplier")
    @classmethod
    def _positive_multiplier(cls, value: Union[str, float]) -> Union[str, float]:
        if isinstance(value, float) and not 0 < value <= 100:
            raise PydanticCustomError("multiplier_range", "must be \"auto\" or a number above 0 and at most 100", {})
        return value


class DpoHyperparameters(Hyperparameters):
    beta: Union[Auto, float] = Field(default="auto", description="DPO's beta (auto: 0.1).")

    @field_validator("beta", mode="before")
    @classmethod
    def _auto_or_beta(cls, value: Any) -> Any:
        return auto_or_number(value, whole=False)


def auto_or_number(value: Any, whole: bool) -> Any:
    """A hyperparameter as given, when it is "auto" or a JSON number (an integer, when
    `whole`); anything else, `true` included (which pydantic's lax mode reads as 1), is
    refused here with one error at the field, not one per member of the union."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, float) and not whole:
        return value
    kind = "a whole number (a JSON integer)" if whole else "a number"
    given = "true or false" if isinstance(value, bool) else f"a JSON {_json_kind(value)}"
    raise PydanticCustomError("hyperparameter_type", 'must be "auto" or {kind}, not {given}', {"kind": kind, "given": given})


def _json_kind(value: Any) -> str:
    if isinstance(value, str):
        return "string"
    if isinstance(value, float):
        return "number with a fraction"
    if value is None:
        return "null"
    return "array" if isinstance(value, list) else "object" if isinstance(value, dict) else type(value).__name__


class SupervisedMethod(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hyperparameters: Optional[Hyperparameters] = None


class DpoMethod(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hyperparameters: Optional[DpoHyperparameters] = None


class Method(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["supervised", "dpo", "reinforcement"]
    supervised: Optional[SupervisedMethod] = None
    dpo: Optional[DpoMethod] = None
    reinforcement: Optional[dict[str, Any]] = None


class WandbIntegration(BaseModel):
    # W&B's own limits: names of at most 128 characters, tags of at most 64.
    project: str = Field(min_length=1, max_length=128)
    name: Optional[str] = Field(default=None, max_length=128)
    entity: Optional[str] = Field(default=None, max_length=128)
    tags: Optional[list[Annotated[str, Field(max_length=64)]]] = Field(default=None, max_length=64)


class Integration(BaseModel):
    type: Literal["wandb"]
    wandb: WandbIntegration


class FineTuningJobRequest(UnicodeChecked):
    """`POST /v1/fine_tuning/jobs`: OpenAI's request. `model` is what `/train/start` takes
    as `model_name` (a local folder, a .gguf file or a hub id)."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    model: str = Field(min_length=1, description="A local model folder, a .gguf file or a hub id.")
    training_file: str = Field(
        min_length=1, max_length=MAX_ID_CHARS, description="A file id from POST /v1/files (purpose fine-tune)."
    )
    validation_file: Optional[str] = Field(default=None, max_length=MAX_ID_CHARS)
    hyperparameters: Optional[Hyperparameters] = Field(default=None, description="OpenAI's older place for them.")
    method: Optional[Method] = None
    suffix: Optional[str] = Field(default=None, max_length=64, pattern=r"^[A-Za-z0-9_.-]*$")
    seed: Optional[StrictInt] = Field(default=None, ge=0, le=2**31 - 1)
    metadata: Optional[dict[str, str]] = None
    integrations: Optional[list[Integration]] = None

    @field_validator("model")
    @classmethod
    def _a_name_a_machine_can_have(cls, value: str) -> str:
        problem = name_problem(value)
        if problem:
            raise PydanticCustomError("name_too_long", "{problem}", {"problem": problem})
        return value

    @field_validator("metadata")
    @classmethod
    def _small_metadata(cls, value: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        if value is not None and (len(value) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in value.items())):
            raise PydanticCustomError(
                "metadata_size", "at most 16 pairs, keys of at most 64 characters and values of at most 512", {}
            )
        return value


class FineTuningJobError(BaseModel):
    code: str
    message: str
    param: Optional[str] = None


class JobHyperparameters(BaseModel):
    n_epochs: Union[Auto, int, None] = None
    batch_size: Union[Auto, int, None] = None
    learning_rate_multiplier: Union[Auto, float, None] = None
    beta: Union[Auto, float, None] = None


class FineTuningJob(BaseModel):
    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    error: Optional[FineTuningJobError] = None
    fine_tuned_model: Optional[str] = None
    finished_at: Optional[int] = None
    hyperparameters: JobHyperparameters
    model: str
    organization_id: str = OWNED_BY
    result_files: list[str] = Field(default_factory=list)
    seed: int
    status: FineTuningStatus
    trained_tokens: Optional[int] = None
    training_file: str
    validation_file: Optional[str] = None
    estimated_finish: Optional[int] = None
    integrations: Optional[list[Integration]] = None
    metadata: Optional[dict[str, str]] = None
    method: Optional[dict[str, Any]] = None
    user_provided_suffix: Optional[str] = None


class FineTuningJobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJob]
    has_more: bool


class FineTuningJobEvent(BaseModel):
    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: Literal["info", "warn", "error"] = "info"
    message: str
    data: Optional[dict[str, Any]] = None
    type: Literal["message", "metrics"] = "message"


class FineTuningJobEventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJobEvent]
    has_more: bool


class CheckpointMetrics(BaseModel):
    step: Optional[float] = None
    train_loss: Optional[float] = None
    train_mean_token_accuracy: Optional[float] = None
    valid_loss: Optional[float] = None
    valid_mean_token_accuracy: Optional[float] = None
    full_valid_loss: Optional[float] = None
    full_valid_mean_token_accuracy: Optional[float] = None


class FineTuningJobCheckpoint(BaseModel):
    id: str
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    metrics: CheckpointMetrics
    step_number: int


class FineTuningJobCheckpointList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJobCheckpoint]
    has_more: bool
    first_id: Optional[str] = None
    last_id: Optional[str] = None
