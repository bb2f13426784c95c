"""llama.cpp's background build as a test fakes it in a folder (tests/unit/test_llama_build.py,
tests/reliability/test_export_build_wait.py): the lock a running build holds, and its record."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from finetune_studio import llama_build


@contextmanager
def holding_lock(folder: Path) -> Iterator[None]:
    """Hold the build's lock as a running build does (an open file of its own, flock'd)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / llama_build.LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def record(folder: Path, **fields: Any) -> Path:
    """Write the build's record (its log's path and `fields`); the log's path."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / llama_build.LOG_FILE
    (folder / llama_build.RECORD_FILE).write_text(json.dumps({"log": str(log), **fields}))
    return log
