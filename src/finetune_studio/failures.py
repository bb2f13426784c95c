"""What went wrong, from an exception: the one table of failure causes and their advice.

Every process asks this module: the server (a write to its database or its files
that failed: `storage_fault`), and the children (`cause_of`, under their own error
codes and advice). Plain Python, importable anywhere.

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
        ("out of memory", "can't allocate memory", "cannot allocate memory", "bad_alloc"),
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

# What to do about each cause, said to the server's operator (the data dir is theirs).
STORAGE_ADVICE: dict[Cause, str] = {
    "disk_full": (
        "Free space on the disk that holds the data directory (old jobs' checkpoints and exports are the"
        " largest files there: delete finished jobs you no longer need); the server retries on its own"
    ),
    "storage_unavailable": (
        "Check that the data directory is on a writable, mounted file system and that no other program holds"
        " its database; the server retries on its own"
    ),
    "out_of_memory": "Free memory on the server's machine; the server retries on its own",
}


def chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and those it was raised from (libraries often wrap an OSError)."""
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


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
    what = "The disk is full" if cause == "disk_full" else "The data directory cannot be written"
    detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    return StorageFault(cause, f"{what} ({detail}). {STORAGE_ADVICE[cause]}.")


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
