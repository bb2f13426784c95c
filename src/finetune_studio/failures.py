"""What went wrong, from an exception: the one table of failure causes and their advice.

Every process asks this module: the server (a write to its database or its files
that failed: `storage_fault`; a child killed by SIGKILL: `advice`), and the children
(`classify`: the training child, and the export child for what is not a tool's
failure; `cause_of`: the chat child). Plain Python, importable anywhere.

    cause              how it is recognised
    out_of_memory      MemoryError, torch's OutOfMemoryError, ENOMEM, "out of memory" ...
    disk_full          ENOSPC, EDQUOT, SQLite's "database or disk is full", "no space left on device" ...
    storage_unavailable EROFS, EACCES/EPERM on a write, EIO, SQLite's "database is locked",
                       "readonly database", "disk I/O error", "unable to open database file"
"""

from __future__ import annotations

import contextlib
import errno
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, Optional

from finetune_studio.errors import StorageFailed, StudioError

Cause = Literal["out_of_memory", "disk_full", "storage_unavailable"]


@dataclass(frozen=True)
class _Rule:
    cause: Cause
    errnos: tuple[int, ...]
    words: tuple[str, ...]
    type_names: tuple[str, ...] = ()


# The table: the first rule that matches any exception of the chain names the cause.
RULES: tuple[_Rule, ...] = (
    _Rule(
        "out_of_memory",
        (errno.ENOMEM,),
        ("out of memory", "can't allocate memory", "cannot allocate memory", "bad_alloc", "memoryerror"),
        ("MemoryError", "OutOfMemoryError"),
    ),
    _Rule(
        "disk_full",
        (errno.ENOSPC, errno.EDQUOT),
        ("no space left on device", "disk quota exceeded", "database or disk is full"),
    ),
    _Rule(
        "storage_unavailable",
        (errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM),
        (
            "read-only file system",
            "readonly database",
            "database is locked",
            "disk i/o error",
            "unable to open database file",
        ),
    ),
)

# Who is told: the process whose work failed.
Process = Literal["train", "export", "chat", "server"]

# What to do about each cause, in each process: the one place each advice is phrased.
ADVICE: dict[tuple[Cause, Process], str] = {
    ("out_of_memory", "train"): (
        "Try a smaller batch_size with more gradient_accumulation_steps (the same effective batch), a shorter"
        " max_seq_length, load_in_4bit, gradient_checkpointing, or a smaller model."
    ),
    ("out_of_memory", "export"): (
        "An export loads the whole model: free memory (stop a training job or the chat's loaded models) and start"
        " it again, or export on a machine with more memory."
    ),
    ("out_of_memory", "chat"): (
        "Ask for fewer tokens (max_tokens), keep fewer models loaded (max_loaded_models), or answer while no"
        " training job runs."
    ),
    ("out_of_memory", "server"): "Free memory on the server's machine; the server retries on its own.",
    ("disk_full", "train"): (
        "Free space on the disk that holds the data directory (each job's checkpoints are written there), or"
        " raise save_steps (0 saves no checkpoints) so fewer are written."
    ),
    ("disk_full", "export"): (
        "Free space on the disk that holds the data directory: while it runs, a GGUF export holds the merged model"
        " and a 16-bit GGUF (each about twice the parameter count in bytes) besides the files asked for."
    ),
    ("disk_full", "server"): (
        "Free space on the disk that holds the data directory (old jobs' checkpoints and exports are the"
        " largest files there: delete finished jobs you no longer need); the server retries on its own."
    ),
    ("storage_unavailable", "server"): (
        "Check that the data directory is on a writable, mounted file system and that no other program holds"
        " its database; the server retries on its own."
    ),
}
# What the sentence that names each cause starts with.
_HEADLINE: dict[Cause, str] = {
    "out_of_memory": "Out of memory",
    "disk_full": "The disk is full",
    "storage_unavailable": "The data directory cannot be written",
}


def advice(cause: Cause, process: Process) -> str:
    """What the user of `process` should do about `cause` (the server's advice where the process has none)."""
    return ADVICE.get((cause, process)) or ADVICE[(cause, "server")]


def first_line(exc: BaseException) -> str:
    """The exception's first line (at most 200 characters), or its type's name."""
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def classify(exc: BaseException, process: Process) -> Optional[tuple[Cause, str]]:
    """For a child's unexpected failure: `out_of_memory` or `disk_full` with a sentence
    that says what to do, or None (the caller's own code: `training_failed` ...). A
    child's other OSErrors (a file it may not read) are its own to explain."""
    cause = cause_of(exc)
    if cause not in ("out_of_memory", "disk_full"):
        return None
    return cause, f"{_HEADLINE[cause]} ({first_line(exc)}). {advice(cause, process)}"


def chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and those it was raised from (libraries often wrap an OSError)."""
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def cause_in_text(text: str) -> Optional[Cause]:
    """The cause whose words a tool's output shows (llama.cpp's converter or quantizer), if any."""
    lowered = text.lower()
    for rule in RULES:
        if any(word in lowered for word in rule.words):
            return rule.cause
    return None


def cause_of(exc: BaseException) -> Optional[Cause]:
    """The cause in RULES that the exception (or one it was raised from) shows, if any."""
    for rule in RULES:
        for link in chain(exc):
            if type(link).__name__ in rule.type_names:
                return rule.cause
            if isinstance(link, OSError) and link.errno in rule.errnos:
                return rule.cause
            text = str(link).lower()
            if any(word in text for word in rule.words):
                return rule.cause
    return None


@dataclass(frozen=True)
class StorageFault:
    """A write of the server's that failed for a reason outside the request: the error
    code (`disk_full` or `storage_unavailable`) and a sentence that says what to do."""

    error_code: Cause
    message: str


def storage_fault(exc: BaseException) -> Optional[StorageFault]:
    """The fault a failed write shows, or None when it is no storage fault (a bug, say).

    Every SQLite OperationalError and every OSError of a write is a storage fault:
    the ones the table does not name are `storage_unavailable`."""
    cause = cause_of(exc)
    if cause is None:
        if not any(isinstance(link, (sqlite3.OperationalError, sqlite3.DatabaseError, OSError)) for link in chain(exc)):
            return None
        cause = "storage_unavailable"
    if cause == "out_of_memory":
        return None  # not the storage's fault: the caller's own handling applies
    return StorageFault(cause, f"{_HEADLINE[cause]} ({first_line(exc)}). {advice(cause, 'server')}")


class StorageHealth:
    """Whether the server's last write to its data dir succeeded: what `/health` says.

    Every writer of the data dir (the job store, the file store) reports each write
    here; a failed one sets `fault` (and `/health` answers `degraded`), the next one
    that succeeds clears it. Nothing here retries: the writers' callers do."""

    def __init__(self) -> None:
        self.fault: Optional[StorageFault] = None
        self.failed_writes = 0
        # Called after each failed write (the supervisor starts retrying, and so learns when it is over).
        self.listeners: list[Callable[[], None]] = []

    def failed(self, fault: StorageFault) -> None:
        self.fault = fault
        self.failed_writes += 1
        for listener in self.listeners:
            listener()

    def succeeded(self) -> None:
        self.fault = None

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Around one write: a storage fault inside it is recorded and raised as
        `errors.StorageFailed` (507 for a full disk, 503 otherwise); any other error
        passes through untouched; a write that gets through clears the fault."""
        try:
            yield
        except StudioError:
            raise  # the request's own fault (InvalidTransition, JobNotFound ...): the write was refused, not failed
        except Exception as exc:
            fault = storage_fault(exc)
            if fault is None:
                raise
            self.failed(fault)
            raise StorageFailed(fault.error_code, fault.message) from exc
        self.succeeded()
