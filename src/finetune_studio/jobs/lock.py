"""DataDirLock: one server owns a data directory at a time.

Two servers on one data dir would each run restart recovery (killing the other's
training child and ending its job `server_restarted`) and then both run the same
queued jobs. So a server holds an exclusive `flock` on `<data dir>/server.lock` for
its whole life, with its pid, address and start time written in the file; a second
server cannot take it and refuses to start, naming the holder.

`flock` belongs to the open file, and the kernel drops it when the holder exits,
however it exits (SIGKILL and power loss included), so a crashed server never
leaves a stale lock: the next server takes it and recovery runs as usual. The file
is opened close-on-exec, so a training child never inherits (and never outlives
its server holding) the lock. The file itself is never deleted: removing it while
another process waits on it would let two servers lock two different files.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Optional

from finetune_studio.errors import DataDirInUse

LOCK_NAME = "server.lock"


class DataDirLock:
    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: Optional[int] = fd

    @classmethod
    def acquire(cls, data_dir: Path, address: str) -> DataDirLock:
        """Take the data dir's lock, or raise DataDirInUse naming the server that has it."""
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_read(fd))
            os.close(fd)
            raise DataDirInUse(
                f"the data dir {data_dir} is in use by another finetune-studio server ({holder}). Two servers on one"
                " data dir would stop and repeat each other's jobs: stop that server first, or give this one another"
                " --data-dir (FINETUNE_STUDIO_DATA_DIR)"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise DataDirInUse(
                f"cannot lock {path} ({exc.strerror}); the data dir must be on a file system that supports flock"
                " (a local disk), so that only one server uses it"
            ) from None
        me = {"pid": os.getpid(), "address": address, "since": time.strftime("%Y-%m-%d %H:%M:%S %z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Let the lock go (closing the file is what releases it). Safe to call twice."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # no stale holder to read about
        os.close(fd)

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, kind: Optional[type[BaseException]], error: Optional[BaseException], trace: Optional[TracebackType]) -> None:
        self.release()


def _read(fd: int) -> dict[str, object]:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict[str, object]) -> str:
    if not holder:
        return "it is starting, or did not say who it is"
    parts = [f"pid {holder.get('pid', '?')}"]
    if holder.get("address"):
        parts.append(f"serving {holder['address']}")
    if holder.get("since"):
        parts.append(f"since {holder['since']}")
    return ", ".join(parts)
