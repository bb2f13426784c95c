"""The one rule for "is this name a local path or a Hugging Face hub id".

`model_name`, `hf_dataset` and `resume_from_checkpoint` may each name a local path
or something else (a hub id; for `resume_from_checkpoint`, an earlier job's id).
The server's admission checks (allowed roots, sizes) and the training child must
read such a name the same way, or a name could pass the server's path rules as a
hub id and then be opened by the child as a file. So both ask `is_local` here.

Plain Python: the server and the children import it.
"""

from __future__ import annotations

import os
from pathlib import Path

_PATH_PREFIXES = ("/", "./", "../", "~", "\\")


def looks_like_path(name: str) -> bool:
    """Whether `name` can only be a path by its form: absolute, relative with `./`,
    `~`, more than one `/` (a hub id has at most one), or a `.gguf` file name."""
    return (
        name.startswith(_PATH_PREFIXES)
        or name in (".", "..")
        or name.count("/") > 1
        or name.lower().endswith(".gguf")
        or "\x00" in name
    )


def is_local(name: str) -> bool:
    """A local path (by its form, or because it exists here), not a hub id."""
    if looks_like_path(name):
        return True
    try:
        return os.path.lexists(os.path.expanduser(name))
    except (OSError, ValueError):
        return True


def local_path(name: str) -> Path:
    """`name` as a path: `~` expanded (relative names stay relative to this process)."""
    return Path(os.path.expanduser(name))
