"""A disk that a test can fill: the tmpfs of the `small_disk` fixture (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path


class SmallDisk:
    """A tmpfs of a few MiB mounted at `path`: a disk that a test can fill (`fill`) and
    free again (`free`), so that every write under it fails with ENOSPC in between."""

    FILLER = ".filler"

    def __init__(self, path: Path) -> None:
        self.path = path

    def free_bytes(self) -> int:
        info = os.statvfs(self.path)
        return info.f_bavail * info.f_frsize

    def fill(self) -> None:
        """Take every free byte (the filler grows until the kernel says ENOSPC)."""
        chunk = b"\0" * (64 * 1024)
        with open(self.path / self.FILLER, "ab", buffering=0) as filler:
            for size in (len(chunk), 4096, 1):
                try:
                    while True:
                        filler.write(chunk[:size])
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
        assert self.free_bytes() == 0

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.path / self.FILLER).unlink()
