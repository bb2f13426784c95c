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
import re
from pathlib import Path
from typing import Optional

_PATH_PREFIXES = ("/", "./", "../", "~", "\\")
# What a name can be at all, said at the request rather than by a job that fails later
# ("File name too long"): a path of at most PATH_MAX characters whose every part is a
# file name of at most NAME_MAX bytes (Linux's limits), or a hub id whose parts are at
# most 96 characters (the Hub's own rule; its cache folder, models--<org>--<name>,
# is then a file name that fits).
MAX_PATH_CHARS = 4096
MAX_NAME_BYTES = 255
MAX_HUB_PART_CHARS = 96
_SEPARATORS = re.compile(r"[\\/]")


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


def name_problem(name: str, hub_id: bool = True) -> Optional[str]:
    """Why `name` (a path, or when `hub_id` a path or a hub id) can name nothing on any
    machine, in words that follow the field's name ("model: is 100,000 characters
    long ..."), or None."""
    if len(name) > MAX_PATH_CHARS:
        return f"is {len(name):,} characters long, over the {MAX_PATH_CHARS:,} a path may have"
    parts = [part for part in _SEPARATORS.split(name) if part]
    longest = max(parts, key=_name_bytes, default="")
    if _name_bytes(longest) > MAX_NAME_BYTES:
        return (
            f"holds a name of {_name_bytes(longest):,} bytes ({longest[:40]!r}...), over the {MAX_NAME_BYTES} a file or"
            " folder name may have"
        )
    if hub_id and not is_local(name) and max(map(len, parts), default=0) > MAX_HUB_PART_CHARS:
        return (
            f"is no local path, and a hub id's parts are at most {MAX_HUB_PART_CHARS} characters (this one has"
            f" {max(map(len, parts)):,}): name a local model folder or .gguf file, or a hub id such as org/name"
        )
    return None


def _name_bytes(part: str) -> int:
    return len(part.encode("utf-8", "surrogatepass"))
