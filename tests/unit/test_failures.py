"""The one table of failure causes (finetune_studio/failures.py): every cause it knows, each way it is seen."""

from __future__ import annotations

import errno
import sqlite3
from typing import Optional

import pytest

from finetune_studio import failures
from finetune_studio.errors import JobNotFound, StorageFailed


class OutOfMemoryError(RuntimeError):
    """torch's, by name (the table must not import torch)."""


def wrapped(inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise RuntimeError("saving the checkpoint failed") from exc
    except RuntimeError as outer:
        return outer


CASES: list[tuple[str, BaseException, Optional[str]]] = [
    ("MemoryError", MemoryError(), "out_of_memory"),
    ("torch's OutOfMemoryError", OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "out_of_memory"),
    ("ENOMEM", OSError(errno.ENOMEM, "Cannot allocate memory"), "out_of_memory"),
    ("the CPU allocator", RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"), "out_of_memory"),
    ("C++'s bad_alloc", RuntimeError("std::bad_alloc"), "out_of_memory"),
    ("ENOSPC", OSError(errno.ENOSPC, "No space left on device"), "disk_full"),
    ("EDQUOT", OSError(errno.EDQUOT, "Disk quota exceeded"), "disk_full"),
    ("ENOSPC under another exception", wrapped(OSError(errno.ENOSPC, "No space left on device")), "disk_full"),
    ("safetensors' words", RuntimeError("Error while serializing: IoError(No space left on device)"), "disk_full"),
    ("SQLite full", sqlite3.OperationalError("database or disk is full"), "disk_full"),
    ("EROFS", OSError(errno.EROFS, "Read-only file system"), "storage_unavailable"),
    ("EIO", OSError(errno.EIO, "Input/output error"), "storage_unavailable"),
    ("EACCES", PermissionError(errno.EACCES, "Permission denied"), "storage_unavailable"),
    ("SQLite read-only", sqlite3.OperationalError("attempt to write a readonly database"), "storage_unavailable"),
    ("SQLite locked", sqlite3.OperationalError("database is locked"), "storage_unavailable"),
    ("SQLite I/O", sqlite3.OperationalError("disk I/O error"), "storage_unavailable"),
    ("a bug", ValueError("bad value"), None),
    ("a missing key", KeyError("loss"), None),
]


@pytest.mark.parametrize(("what", "exc", "cause"), CASES, ids=[case[0] for case in CASES])
def test_every_cause_is_named_wherever_it_is_seen(what: str, exc: BaseException, cause: Optional[str]) -> None:
    assert failures.cause_of(exc) == cause


@pytest.mark.parametrize(("what", "exc", "cause"), CASES, ids=[case[0] for case in CASES])
def test_each_process_gets_its_own_advice_for_what_it_can_act_on(what: str, exc: BaseException, cause: Optional[str]) -> None:
    for process in ("train", "export", "chat"):
        known = failures.classify(exc, process)
        if cause in ("out_of_memory", "disk_full"):
            assert known is not None and known[0] == cause
            assert failures.advice(cause, process) in known[1]  # type: ignore[arg-type]
        else:
            assert known is None  # a child's own error code and words
    fault = failures.storage_fault(exc)
    if cause in ("disk_full", "storage_unavailable"):
        assert fault is not None and fault.error_code == cause
        assert fault.message.endswith(failures.advice(cause, "server"))  # type: ignore[arg-type]
    elif cause == "out_of_memory" or not isinstance(exc, (OSError, sqlite3.Error)):
        assert fault is None


def test_every_cause_has_advice_for_every_process_that_meets_it() -> None:
    for rule in failures.RULES:
        assert failures.advice(rule.cause, "server")
    for cause in ("out_of_memory", "disk_full"):
        for process in ("train", "export", "chat"):
            assert failures.advice(cause, process)  # type: ignore[arg-type]


def test_a_tools_output_is_read_with_the_same_words() -> None:
    assert failures.cause_in_text("OSError: [Errno 28] No space left on device") == "disk_full"
    assert failures.cause_in_text("Traceback ...\nMemoryError") == "out_of_memory"
    assert failures.cause_in_text("terminate called after throwing an instance of 'std::bad_alloc'") == "out_of_memory"
    assert failures.cause_in_text("unknown model architecture") is None


def test_the_health_records_a_failed_write_and_clears_on_the_next() -> None:
    health = failures.StorageHealth()
    told = []
    health.listeners.append(lambda: told.append(True))
    with pytest.raises(StorageFailed) as raised, health.writing():
        raise sqlite3.OperationalError("database or disk is full")
    assert raised.value.status_code == 507 and raised.value.error_code == "disk_full"
    assert health.fault is not None and health.fault.error_code == "disk_full" and told == [True]
    with pytest.raises(JobNotFound), health.writing():  # the request's fault: no storage fault, none cleared
        raise JobNotFound("x")
    assert health.fault is not None
    with pytest.raises(StorageFailed) as locked, health.writing():
        raise sqlite3.OperationalError("database is locked")
    assert locked.value.status_code == 503
    with health.writing():
        pass
    assert health.fault is None
