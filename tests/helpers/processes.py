"""Whether a process is there."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """True while pid is a live process (a zombie has freed its memory)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def pid_exists(pid: int) -> bool:
    """True while pid can be signalled: a live process, or a zombie not yet reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
