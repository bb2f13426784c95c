"""Settings: one pydantic-settings object, built by `get_settings()`, never at import.

Every setting can come from the command line (`finetune-studio serve --port ...`)
or from the environment with the `FINETUNE_STUDIO_` prefix.
"""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from typing import Annotated, Any, Optional

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from finetune_studio.errors import UnsafeSettings
from finetune_studio.hardware import Precision
from finetune_studio.outbound import allowed_entry
from finetune_studio.wire import DataDir

MiB = 1024 * 1024
# Jobs handed to a Ray cluster at once when max_concurrent_jobs is not set (see the validator).
RAY_CONCURRENT_JOBS = 8
# A token shorter than this can be guessed: 16 random URL-safe characters are 96 bits.
MIN_TOKEN_CHARS = 16
_MAKE_ONE = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def default_data_dir() -> Path:
    return Path.home() / ".finetune-studio"


def token_problem(token: str) -> Optional[str]:
    """Why `token` cannot protect the server (never quoting it), or None when it can.

    A client sends the token as `Authorization: Bearer <token>`, so it must be
    something a header carries unchanged: visible ASCII only (0x21-0x7E). Whitespace
    at its ends is dropped by every HTTP parser (a token that has any could never be
    matched), inside it is not a bearer token; an empty token would let in anyone
    who sends "Bearer" and nothing after it.
    """
    fix = f"set it to a long random secret (make one with: {_MAKE_ONE})"
    if not token:
        return f"FINETUNE_STUDIO_TOKEN is set but empty, which protects nothing: {fix}, or unset it to serve on loopback without a token"
    if not token.strip():
        return f"FINETUNE_STUDIO_TOKEN is only whitespace, which no client can send: {fix}"
    if token != token.strip():
        return (
            "FINETUNE_STUDIO_TOKEN starts or ends with whitespace, which HTTP drops from a header, so no client could"
            " ever match it: remove the whitespace (a stray newline from a file, say)"
        )
    if any(not "\x21" <= char <= "\x7e" for char in token):
        return (
            "FINETUNE_STUDIO_TOKEN holds characters an HTTP header cannot carry unchanged (spaces, control or non-ASCII"
            f" characters): use visible ASCII only; {fix}"
        )
    if len(token) < MIN_TOKEN_CHARS:
        return f"FINETUNE_STUDIO_TOKEN is {len(token)} characters, too short to protect anything: use at least {MIN_TOKEN_CHARS}; {fix}"
    return None


def server_name(entry: str) -> str:
    """An entry of FINETUNE_STUDIO_SERVER_NAMES as the Host check compares it: lower case,
    an IPv6 address without brackets; a scheme, port or path is refused, saying so."""
    name = entry.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if not name or name.count(":") == 1 or any(char in name for char in "/[]@ \t\r\n"):
        raise ValueError(
            f"FINETUNE_STUDIO_SERVER_NAMES: {entry!r} is not a host name; list names only, without a scheme, port or"
            " path (studio.lan, 192.168.1.5, fd00::1), separated by commas"
        )
    return name


def listed(description: str, *, what: str = "names", separator: str = ",") -> Any:
    """A list setting's field: empty by default, written in the environment as `what` separated
    by `separator` or as a JSON list (`Settings._split` reads both)."""
    return Field(
        default_factory=list,
        description=f"{description} In the environment: {what} separated by '{separator}' (or a JSON list).",
    )


def split_list(value: Any, separator: str) -> Any:
    """A list setting from the environment: a JSON list, or items separated by `separator` (blank ones dropped)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(separator) if part.strip()]
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FINETUNE_STUDIO_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    data_dir: Path = Field(default_factory=default_data_dir)
    max_concurrent_jobs: int = Field(default=1, ge=1, description="Jobs that train at the same time.")
    max_concurrent_exports: int = Field(
        default=1, ge=1, description="Exports that run at the same time, beside training (an export never waits for a training job)."
    )
    max_queued_jobs: int = Field(default=1000, ge=1, description="Jobs waiting beyond this are refused.")
    max_queued_jobs_per_user: int = Field(
        default=100, ge=1, description="With accounts on: a user's jobs waiting beyond this are refused (beside max_queued_jobs)."
    )
    accounts: bool = Field(
        default=False,
        description="Users, API keys with scopes, and owners of every job and file (docs/API.md, Accounts); off: one user, as before.",
    )
    max_concurrent_evals: int = Field(
        default=1, ge=1, description="Evaluations that run at the same time, beside training and exports (slots of their own)."
    )
    judge_key_envs: Annotated[list[str], NoDecode] = listed(
        "Names of the server's environment variables an evaluation's external judge may take its API key from "
        "(`api_key_env`); none may be a FINETUNE_STUDIO_* variable.",
    )
    judge_allowed_hosts: Annotated[list[str], NoDecode] = listed(
        "Hosts an exposed server lets an evaluation's judge `base_url` name (a loopback server lets it name "
        "any).",
    )
    webhook_allowed_hosts: Annotated[list[str], NoDecode] = listed(
        "Hosts an exposed server sends webhooks to (a loopback server sends them anywhere): names, addresses "
        "or networks (10.0.0.0/8). A loopback, private or link-local address is refused unless it (or its "
        "network) is listed too.", what="entries",
    )
    webhook_retry_seconds: Annotated[list[float], NoDecode] = Field(
        default_factory=lambda: [5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0],
        description=(
            "The waits between a webhook delivery's attempts (the first is sent at once): Standard Webhooks' schedule,"
            " about 28 hours in all. A delivery that fails its last attempt disables its webhook. In the environment:"
            " seconds separated by ','."
        ),
    )
    webhook_retry_jitter: float = Field(
        default=0.2, ge=0, le=1, description="Each wait between attempts is drawn within this fraction of itself (0.2: +/-20%)."
    )
    webhook_timeout_seconds: float = Field(
        default=10.0, gt=0, description="One webhook attempt (connect, send, answer) that takes longer has failed."
    )
    metrics_public: bool = Field(
        default=False, description="GET /metrics answers without the token (for a Prometheus that holds none)."
    )
    max_concurrent_inspections: int = Field(
        default=2, ge=1, description="Dataset inspections (POST /datasets/inspect) that run at once; more are refused (429)."
    )
    inspect_timeout_seconds: float = Field(
        default=120.0, gt=0, description="A dataset inspection that takes longer is killed and answered 503."
    )
    stop_grace_seconds: float = Field(
        default=60.0, gt=0, description="How long a stopping job may take to finish its step and save before it is terminated."
    )
    kill_grace_seconds: float = Field(default=5.0, gt=0, description="From SIGTERM to SIGKILL when a worker will not exit.")
    token: Optional[SecretStr] = Field(
        default=None,
        description=f"API token; required when binding beyond loopback. At least {MIN_TOKEN_CHARS} visible ASCII characters.",
    )
    worker_python: Optional[str] = Field(
        default=None, description="Python that runs training and inference children (default: this one)."
    )
    inference_idle_seconds: float = Field(
        default=600.0, gt=0, description="The chat child unloads its models after this long without a request."
    )
    max_loaded_models: int = Field(
        default=1, ge=1, description="Base models the chat child keeps loaded at once (each with all its adapters)."
    )
    inference_precision: Precision = Field(
        default="auto",
        description="The dtype the chat child answers in with transformers: auto (bf16 where it is native: a GPU with"
        " bf16, a CPU with AMX or AVX512-BF16; else fp32), bf16 or fp32.",
    )
    max_batch_size: int = Field(
        default=16, ge=1,
        description="Chat answers the chat child decodes at once, in one batch per base model; more requests wait their"
        " turn, in order (each running answer holds its KV cache in memory).",
    )
    unload_chat_for_training: bool = Field(
        default=True, description="When a training job starts, the chat child unloads its models to free the memory."
    )
    allowed_roots: Annotated[list[Path], NoDecode] = listed(
        "Folders that every model, dataset and output path of a request must lie under. When empty, any path "
        "may be named on loopback, and only paths under the data directory when the server is exposed.",
        what="folders", separator=":",
    )
    server_names: Annotated[list[str], NoDecode] = listed(
        "Host names a loopback server answers besides 127.0.0.1, [::1], localhost and *.localhost (a request "
        "addressed to any other name gets 421: a web page's DNS rebinding). An exposed server checks no name.",
    )
    max_request_bytes: int = Field(default=1 * MiB, ge=1024, description="Largest request body accepted (413 beyond).")
    max_dataset_bytes: int = Field(default=1024 * MiB, ge=1, description="Largest dataset file a job may name.")
    max_file_bytes: int = Field(
        default=512 * MiB, ge=1, description="Largest file POST /v1/files stores (the page's uploads too); 413 beyond."
    )
    max_streams_per_job: int = Field(
        default=2500, ge=1, description="Open event streams one job may have; more are refused (503, Retry-After)."
    )
    stream_stall_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A stream client that reads nothing of what it was sent for this long is dropped (it can resume with Last-Event-ID).",
    )
    # Scale-out (docs/SCALE-OUT.md, docs/SETTINGS.md). Unset: jobs train in local
    # children and nothing of Ray is imported.
    ray_address: Optional[str] = Field(
        default=None,
        description="Run training jobs on this Ray cluster (`auto`: the cluster this machine belongs to; or ray://HOST:10001,"
        " or HOST:6379). Exports and chat stay on this machine.",
    )
    ray_max_failures: int = Field(
        default=2, ge=0, description="Times Ray Train restarts a job from its last checkpoint after losing a worker, before the job fails."
    )
    ray_storage_path: Optional[str] = Field(
        default=None,
        description="Where a Ray job's files meet (docs/SCALE-OUT.md, section 5). A folder every node sees (default:"
        " <data-dir>/ray; the data directory must then be shared with the nodes too), or a URI pyarrow understands"
        " (s3://, gs://, hdfs://) for nodes that share no folder: the job's local inputs, checkpoints and result travel"
        " through it, and the driver copies them into the job folder here.",
    )

    @field_validator("token")
    @classmethod
    def _token_can_protect(cls, value: Optional[SecretStr]) -> Optional[SecretStr]:
        problem = None if value is None else token_problem(value.get_secret_value())
        if problem:
            # Not a ValueError: pydantic would quote the token in its message.
            raise UnsafeSettings(problem)
        return value

    @model_validator(mode="after")
    def _ray_jobs_queue_in_the_cluster(self) -> Settings:
        """On a Ray cluster a job waits for its resources in Ray's own queue (its placement
        group), so the server hands the cluster several jobs at once unless told otherwise;
        each one waiting costs a small driver process here."""
        if self.ray_address and "max_concurrent_jobs" not in self.model_fields_set:
            self.max_concurrent_jobs = RAY_CONCURRENT_JOBS
        return self

    @field_validator("server_names")
    @classmethod
    def _names_are_host_names(cls, names: list[str]) -> list[str]:
        return [server_name(name) for name in names]

    @field_validator("judge_key_envs", "judge_allowed_hosts", "webhook_allowed_hosts", "webhook_retry_seconds",
                     "server_names", "allowed_roots", mode="before")
    @classmethod
    def _split(cls, value: Any, info: ValidationInfo) -> Any:
        return split_list(value, os.pathsep if info.field_name == "allowed_roots" else ",")

    @field_validator("judge_key_envs")
    @classmethod
    def _key_envs_are_not_settings(cls, names: list[str]) -> list[str]:
        for name in names:
            if name.upper().startswith("FINETUNE_STUDIO_"):
                raise ValueError(
                    f"FINETUNE_STUDIO_JUDGE_KEY_ENVS: {name} is one of the server's own settings, which no judge may"
                    " read; list only the variables that hold judges' API keys (OPENAI_API_KEY, say)"
                )
            if not name.replace("_", "a").isalnum() or name[0].isdigit():
                raise ValueError(f"FINETUNE_STUDIO_JUDGE_KEY_ENVS: {name!r} is not an environment variable's name")
        return names

    @field_validator("judge_allowed_hosts")
    @classmethod
    def _hosts_are_host_names(cls, names: list[str]) -> list[str]:
        return [server_name(name) for name in names]

    @field_validator("webhook_allowed_hosts")
    @classmethod
    def _webhook_hosts(cls, entries: list[str]) -> list[str]:
        return [allowed_entry(entry, "FINETUNE_STUDIO_WEBHOOK_ALLOWED_HOSTS") for entry in entries]

    @field_validator("webhook_retry_seconds")
    @classmethod
    def _waits(cls, waits: list[float]) -> list[float]:
        if any(wait < 0 for wait in waits):
            raise ValueError("FINETUNE_STUDIO_WEBHOOK_RETRY_SECONDS: a wait cannot be negative; list seconds >= 0, separated by ','")
        return waits

    # The data directory's layout is wire.DataDir's.
    @property
    def db_path(self) -> Path:
        return DataDir(self.data_dir).db

    @property
    def jobs_dir(self) -> Path:
        return DataDir(self.data_dir).jobs

    @property
    def files_dir(self) -> Path:
        """The file store's files (finetune_studio/files/)."""
        return DataDir(self.data_dir).files

    @property
    def ray_storage(self) -> str:
        """Ray Train's storage_path for the runs of this server."""
        return self.ray_storage_path or str(DataDir(self.data_dir).ray)

    @property
    def exports_dir(self) -> Path:
        return DataDir(self.data_dir).exports

    @property
    def evals_dir(self) -> Path:
        return DataDir(self.data_dir).evals

    @property
    def loopback_url(self) -> str:
        """Where this server's own children reach it: its URL, with an address that listens on every
        interface (0.0.0.0, ::) replaced by loopback's."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)  # noqa: S104 (a bind address, compared)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """Where this server answers (as configured), for messages."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def path_roots(self) -> Optional[list[Path]]:
        """The folders request paths must lie under (symlinks resolved), or None when any path may be named.
        With accounts on, only ALLOWED_ROOTS (none when unset), and never the data dir: a user reaches
        what lies there (others' uploads and checkpoints) only through ids they own."""
        if self.accounts:
            return PathRoots([root.expanduser().resolve() for root in self.allowed_roots], self.data_dir.expanduser().resolve())
        if self.allowed_roots:
            return [root.expanduser().resolve() for root in self.allowed_roots]
        if not self.is_loopback():
            return [self.data_dir.expanduser().resolve()]
        return None


class PathRoots(list[Path]):
    """The roots of `Settings.path_roots` with accounts on: a path must lie under one of them and
    never under `excluded` (the data dir). Every path check asks `within`."""

    def __init__(self, roots: list[Path], excluded: Path) -> None:
        super().__init__(roots)
        self.excluded = excluded


def within(path: Path, roots: list[Path]) -> bool:
    """Whether the resolved `path` may be named under `roots` (Settings.path_roots, not None)."""
    if isinstance(roots, PathRoots) and path.is_relative_to(roots.excluded):
        return False
    return any(path.is_relative_to(root) for root in roots)


def roots_named(roots: list[Path]) -> str:
    """The roots as a message names them."""
    named = ", ".join(str(root) for root in roots) or "no folder (FINETUNE_STUDIO_ALLOWED_ROOTS is unset)"
    if isinstance(roots, PathRoots):
        named += f", and never under the data dir {roots.excluded}"
    return named


def get_settings(**overrides: object) -> Settings:
    """Settings from the environment, with explicit overrides (e.g. CLI flags) on top."""
    given = {key: value for key, value in overrides.items() if value is not None}
    settings = Settings(**given)  # type: ignore[arg-type]
    settings.data_dir = settings.data_dir.expanduser().resolve()
    return settings
