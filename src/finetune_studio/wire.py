"""What the server and its children say to each other, and the job folder they share.

Plain Python (no FastAPI, no torch): the supervisor, the training child and the
tests import it alike.

The wire of a local child:

- stdin: one JSON line, the `WorkerSpec` (secrets included, so they never touch
  disk or the process's environment), then commands, one per line (`stop`). EOF
  on stdin means the server is gone: the child stops and saves.
- stdout: one JSON message per line, a `StatusMessage` or a `ProgressMessage`.
  The child moves everything else it prints to stderr at start-up.
- stderr: the job folder's `worker.log`.

The job folder (`<data-dir>/jobs/<id>/`, `JobFolder`): `worker.log`, `job.json`
(the base model and method, for export), `checkpoints/checkpoint-N`, and the
result: `adapter/` (LoRA) or `model/` (full fine-tuning). A result folder is
written as `.NAME.partial` and renamed (`atomic.save_atomically`), so it is complete
or absent.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, TypedDict, Union

from finetune_studio.schemas import ErrorCode, EvalPhase, ExportPhase, Phase

STOP_COMMAND = "stop"
# What the trainer names each checkpoint folder: checkpoint-<step> (checkpoint_name, checkpoint_step).
CHECKPOINT_PREFIX = "checkpoint-"
# What every child's process gets in its environment besides the user's (the local
# children: supervisor/launcher.child_environment; the Ray workers: ray_train/driver.py).
# The one setting of the server's that its children read too: where llama.cpp's tools are
# (export/tools.py); every other FINETUNE_STUDIO_* variable stays with the server.
TOOLS_ENV = "FINETUNE_STUDIO_LLAMA_CPP_TOOLS"
# How to install llama.cpp's Python binding (GGUF export and chat), for every message that says so.
GGUF_INSTALL = "pip install 'finetune-studio[gguf]'"
CHILD_ENV = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_TELEMETRY": "1"}
# torch.compile's caches on disk (inductor's FX graphs and AOTAutograd's): a training child
# sets these from its data dir (`DataDir.compile_environment`) where the user's environment
# names none, so that a second run of the same shape reuses the first one's compiled graphs.
COMPILE_CACHE_DIR_ENV = "TORCHINDUCTOR_CACHE_DIR"
COMPILE_CACHE_SWITCHES = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
# The longest message line the server reads from a child; a child keeps its
# messages far below it (bounded warnings and excerpts).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# What an evaluation's child leaves in its folder (`<data-dir>/evals/<id>/`) before it reports
# `completed`, each written whole (atomic.py): the results table, and one JSON line per sample.
# The server keeps both in SQLite (supervisor/eval_results.py) before it writes that status.
EVAL_RESULTS_FILE = "results.json"
EVAL_SAMPLES_FILE = "samples.jsonl"


class StatusMessage(TypedDict):
    type: Literal["status"]
    phase: Union[Phase, ExportPhase, EvalPhase]  # a training child's, the export child's, or the evaluation child's
    message: str
    error: Optional[str]
    details: dict[str, Any]


class ProgressMessage(TypedDict):
    type: Literal["progress"]
    progress: dict[str, Any]


Message = Union[StatusMessage, ProgressMessage]


def status_message(
    phase: Union[Phase, ExportPhase, EvalPhase], message: str, *, error: Optional[str] = None, details: Optional[dict[str, Any]] = None
) -> StatusMessage:
    return {"type": "status", "phase": phase, "message": message, "error": error, "details": dict(details or {})}


def error_details(code: ErrorCode, **facts: Any) -> dict[str, Any]:
    """The details of an `error` status: what was known, and the error code."""
    return {**facts, "error_code": code}


@dataclass
class WorkerSpec:
    """What a child is told when it starts (the first line on its stdin)."""

    job_id: str
    output_dir: Path
    request: dict[str, Any]  # the full request, secrets included: handle with care
    warnings: list[str] = field(default_factory=list)  # for the child to report with its first status

    def to_line(self) -> bytes:
        payload = {
            "job_id": self.job_id,
            "output_dir": str(self.output_dir),
            "request": self.request,
            "warnings": self.warnings,
        }
        return json.dumps(payload).encode() + b"\n"

    @classmethod
    def from_line(cls, line: str) -> WorkerSpec:
        payload = json.loads(line)
        return cls(
            job_id=str(payload["job_id"]),
            output_dir=Path(payload["output_dir"]),
            request=dict(payload["request"]),
            warnings=[str(w) for w in payload.get("warnings", [])],
        )


@dataclass(frozen=True)
class DataDir:
    """The layout of the data directory (docs/SETTINGS.md, `data_dir`); the settings, the
    job service and the CLI agree on it here."""

    root: Path

    @classmethod
    def of_jobs(cls, jobs_dir: Path) -> DataDir:
        """The data directory whose jobs folder is `jobs_dir`."""
        return cls(jobs_dir.parent)

    @property
    def db(self) -> Path:
        return self.root / "studio.db"

    @property
    def jobs(self) -> Path:
        """Each training job's folder (`JobFolder`), by its id."""
        return self.root / "jobs"

    @property
    def secret(self) -> Path:
        """The server's HMAC secret for API keys (jobs/accounts.py; mode 0600), made when accounts are first on."""
        return self.root / "secret"

    @property
    def files(self) -> Path:
        """The file store's files (finetune_studio/files/)."""
        return self.root / "files"

    @property
    def exports(self) -> Path:
        """Each export's files, in a folder named by its id."""
        return self.root / "exports"

    @property
    def evals(self) -> Path:
        """Each evaluation's folder (its log, and the results its child writes), by its id."""
        return self.root / "evals"

    @property
    def sweeps_db(self) -> Path:
        """Optuna's RDB storage of every sweep's study (supervisor/sweep_study.py)."""
        return self.root / "sweeps.db"

    @property
    def ray(self) -> Path:
        """Ray Train's storage_path when the settings name none."""
        return self.root / "ray"

    @property
    def compile_cache(self) -> Path:
        """torch.compile's caches (TORCHINDUCTOR_CACHE_DIR) and the compile times measured
        with them (training/compilation.py), shared by every training job."""
        return self.root / "compile-cache"

    def compile_environment(self) -> dict[str, str]:
        """The variables that point a training child's torch.compile at `compile_cache`."""
        return {COMPILE_CACHE_DIR_ENV: str(self.compile_cache), **COMPILE_CACHE_SWITCHES}

    def job(self, job_id: str) -> Path:
        return self.jobs / job_id


@dataclass(frozen=True)
class JobFolder:
    """The layout of one job's folder; the server and the child agree on it here."""

    root: Path

    @property
    def log(self) -> Path:
        return self.root / "worker.log"

    @property
    def job_file(self) -> Path:
        """The base model and method, written when training starts (export reads it)."""
        return self.root / "job.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def adapter(self) -> Path:
        return self.root / "adapter"

    @property
    def model(self) -> Path:
        return self.root / "model"

    def outputs(self) -> dict[str, str]:
        """The saved results, as status details (`adapter_dir` / `model_dir`)."""
        return {f"{path.name}_dir": str(path) for path in (self.adapter, self.model) if path.is_dir()}

    def last_checkpoint(self) -> Optional[Path]:
        return last_checkpoint(self.root)

    def remove_partial_checkpoints(self) -> list[Path]:
        """Remove every checkpoint folder written only in part (a save that a full disk or
        a crash cut short: no readable trainer_state.json), and say which. For a child
        whose training ended in error: nothing writes to the folder any more."""
        removed = []
        for path in self.checkpoints.glob(f"{CHECKPOINT_PREFIX}*"):
            if path.is_dir() and not path.is_symlink() and not checkpoint_is_complete(path):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        return removed


def checkpoint_is_complete(path: Path) -> bool:
    """Whether a `checkpoint-N` folder was written whole: its trainer_state.json, which
    the trainer writes last, reads."""
    try:
        json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False  # written only in part when the worker died, or the disk filled
    return True


def checkpoint_name(step: int) -> str:
    """The folder name of the checkpoint saved at `step` (the trainer's own: `checkpoint-N`)."""
    return f"{CHECKPOINT_PREFIX}{step}"


def checkpoint_step(name: str) -> Optional[int]:
    """The step of a `checkpoint-N` folder name, or None for any other name."""
    step = name.removeprefix(CHECKPOINT_PREFIX)
    if step == name or not step.isdigit() or not step.isascii():
        return None
    return int(step)


def complete_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """(step, folder) of each complete `checkpoint-N` right under `folder`, newest first."""
    found = []
    for path in folder.glob(f"{CHECKPOINT_PREFIX}*"):
        step = checkpoint_step(path.name)
        if step is not None and checkpoint_is_complete(path):
            found.append((step, path))
    return sorted(found, reverse=True)


def last_checkpoint(folder: Path) -> Optional[Path]:
    """The complete `checkpoint-N` with the highest N under folder (or folder/checkpoints); or None."""
    found = complete_checkpoints(folder) + complete_checkpoints(folder / "checkpoints")
    return max(found)[1] if found else None


# -- the inference child -------------------------------------------------------
#
# One long-lived child (`python -m finetune_studio.inference.child`) serves every
# chat request; the server multiplexes requests over its pipes by `id`.
#
# stdin, one JSON object per line:
#   GenerateCommand   start a completion (the child decodes all running ones together, one
#                     batched forward pass per step; beyond --max-batch-size they wait, in order):
#                     a chat's `messages`, or a `prompt` (/v1/completions: a text, or token ids
#                     used exactly as given)
#   {"type": "cancel", "id": ...}   the client went away: stop generating it (nothing more
#                                   is sent for it; an unknown or finished id is ignored)
#   {"type": "unload"}              free every loaded model (training needs the memory); one
#                                   still answering goes as soon as its answers end
# stdout, one JSON object per line:
#   {"type": "ready"}                                   once, when it takes commands
#   {"type": "started", "id", "prompt_tokens"}          the prompt was read (with "prompt_logprobs",
#                                                       a TokenLogprob per prompt token, when asked)
#   {"type": "delta", "id", "text"}                     new text (may be ""); with "logprobs", a
#                                                       TokenLogprob per token chosen since the last
#                                                       delta, when asked
#   {"type": "done", "id", "finish_reason", "usage"}    finish_reason "stop" | "length"
#   {"type": "failed", "id", "code", "message", "param"} the request cannot be served
#   {"type": "stats", "batch_size", "tokens", "seconds", "running"}  how it decodes (no id; at most
#                                                       once a second, and when the last answer ends)
# EOF on stdin: the server is gone; the child exits.


# Who runs a model in the chat child: transformers (a folder, a hub id, or a `.gguf`
# file dequantized by transformers, as training loads it), or llama.cpp (a `.gguf`
# file as it is: an export, run as llama.cpp users will run it).
InferenceBackend = Literal["transformers", "llama_cpp"]
INFERENCE_BACKENDS: tuple[InferenceBackend, ...] = ("transformers", "llama_cpp")


class _ModelRefFields(TypedDict):
    base: dict[str, str]  # training.models.ModelSource.to_json(): {"kind", "location"}
    adapter: Optional[str]
    trust_remote_code: bool


class ModelRef(_ModelRefFields, total=False):
    """What to load: a base model, and the LoRA adapter to apply (None: the base alone).
    A full fine-tuning result is a base of its own (`{"kind": "folder", ...}`).

    `backend` (absent: "transformers") says who runs it. With "llama_cpp" the base is
    `{"kind": "gguf", "location": a .gguf file}` and `adapter`, when set, a LoRA GGUF
    file for that base (llama.cpp's `--lora`)."""

    backend: InferenceBackend


class _SamplingFields(TypedDict):
    temperature: float  # 0: greedy
    top_p: float
    max_tokens: Optional[int]  # None: up to the context length; 0 (with prompt_logprobs): the prompt's alone
    stop: list[str]
    seed: Optional[int]


# The most alternatives a TokenLogprob lists (`top_logprobs`).
MAX_TOP_LOGPROBS = 5


class SamplingParams(_SamplingFields, total=False):
    """How to choose the tokens of an answer, and what to say about them. The optional
    fields (absent: false, 0) ask for log-probabilities, of the model's own distribution
    (the raw logits, before temperature and top_p): `logprobs`, each chosen token's, on
    the `delta` that carries it; `top_logprobs` (0 to MAX_TOP_LOGPROBS, with `logprobs`),
    that many most likely alternatives beside each; `prompt_logprobs`, each prompt
    token's, on `started` (what /v1/completions' `echo` needs); `eos_logprobs`, the
    end-of-text token that ends an answer listed too (on a `delta` with no text), as
    OpenAI's completions list it, where a chat leaves it out."""

    logprobs: bool
    top_logprobs: int
    prompt_logprobs: bool
    eos_logprobs: bool


class TopLogprob(TypedDict):
    id: int
    token: str  # the token's bytes as text (U+FFFD for a part of a character)
    bytes: list[int]  # its UTF-8 bytes, as OpenAI gives them
    logprob: float


class TokenLogprob(TypedDict):
    """One token of an answer (or of a prompt, whose first token has `logprob` None: nothing
    comes before it) and its most likely alternatives, best first."""

    id: int
    token: str
    bytes: list[int]
    logprob: Optional[float]
    top_logprobs: list[TopLogprob]


class _GenerateFields(TypedDict):
    type: Literal["generate"]
    id: str
    model: ModelRef
    params: SamplingParams


class GenerateCommand(_GenerateFields, total=False):
    """One of `messages` (a chat) and `prompt` (a completion) is given."""

    messages: list[dict[str, str]]  # {"role", "content"}, shaped by the model's chat template
    # A text (its tokens, a BOS put first where the model's tokenizer adds one and the text has
    # none), or token ids, used exactly as given (no BOS added).
    prompt: Union[str, list[int]]


InferenceFailureCode = Literal["model_not_found", "context_length_exceeded", "invalid_request", "internal_error"]
