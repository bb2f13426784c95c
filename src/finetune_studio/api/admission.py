"""What a start request must pass before it is queued: queue room, finite numbers,
paths inside the allowed folders, dataset files that exist and are not too large.

Paths: on loopback any path the user can read may be named. When the server is
exposed (or `allowed_roots` is set), every path in the request is resolved (`~`,
`..` and symlinks included) and must lie under one of the roots; the check comes
before any existence check, so a client cannot probe what lies outside them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from fastapi.exceptions import RequestValidationError

from finetune_studio.config import Settings
from finetune_studio.errors import PathNotAllowed, QueueFull, StartRefused
from finetune_studio.schemas import TrainingStartRequest

# Fields that always name a local path, and fields that name one only when they
# look like a path or exist here (otherwise they are Hugging Face hub ids, or for
# resume_from_checkpoint the id of an earlier job, looked up under the jobs folder).
PATH_FIELDS = ("model_local_path", "tensorboard_dir")
PATH_LIST_FIELDS = ("local_datasets", "local_eval_datasets")
PATH_OR_HUB_FIELDS = ("model_name", "hf_dataset", "resume_from_checkpoint")


def check_start(request: TrainingStartRequest, settings: Settings, queued: int) -> None:
    if queued >= settings.max_queued_jobs:
        raise QueueFull(
            f"the queue is full ({queued} jobs waiting, the limit is {settings.max_queued_jobs}); try again later"
        )
    check_finite(request)
    check_paths(request, settings.path_roots())
    check_datasets(request, settings.max_dataset_bytes)


def check_finite(request: TrainingStartRequest) -> None:
    """Python's JSON parser takes NaN and Infinity; no setting means anything with them."""
    bad = [
        {"type": "finite_number", "loc": ("body", *where), "msg": "Input should be a finite number", "input": str(value)}
        for where, value in _floats(request.model_dump())
        if not math.isfinite(value)
    ]
    if bad:
        raise RequestValidationError(bad)


def _floats(value: Any, where: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], float]]:
    if isinstance(value, float):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _floats(item, (*where, key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _floats(item, (*where, index))


def named_paths(request: TrainingStartRequest) -> Iterator[tuple[str, str]]:
    """(field, value) for every local path the request names."""
    for name in PATH_FIELDS:
        value = getattr(request, name)
        if value:
            yield name, value
    for name in PATH_LIST_FIELDS:
        for value in getattr(request, name):
            yield name, value
    for name in PATH_OR_HUB_FIELDS:
        value = getattr(request, name)
        if value and _is_local(value):
            yield name, value


def _is_local(name: str) -> bool:
    if name.startswith(("/", "./", "../", "~", "\\")) or name in (".", "..") or name.endswith(".gguf"):
        return True
    if name.count("/") > 1 or "\x00" in name:
        return True
    try:
        return os.path.lexists(os.path.expanduser(name))
    except (OSError, ValueError):
        return True


def resolve(field: str, name: str) -> Path:
    """The real path `name` points at: `~` expanded, relative to this process, `..` and symlinks resolved."""
    if not name.strip() or "\x00" in name:
        raise StartRefused(f"{field}: {name!r} is not a valid path")
    try:
        return Path(os.path.expanduser(name)).resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        raise StartRefused(f"{field}: {name!r} is not a valid path ({exc})") from None


def check_paths(request: TrainingStartRequest, roots: Optional[list[Path]]) -> None:
    for field, name in named_paths(request):
        path = resolve(field, name)
        if roots is not None and not any(path.is_relative_to(root) for root in roots):
            where = "" if str(path) == name else f" (it resolves to {path})"
            raise PathNotAllowed(
                f"{field}: {name!r} is outside the folders this server accepts paths from{where}. The server is"
                f" reachable from the network, so paths must lie under {', '.join(str(r) for r in roots)};"
                " the operator sets them with FINETUNE_STUDIO_ALLOWED_ROOTS"
            )


def check_datasets(request: TrainingStartRequest, max_bytes: int) -> None:
    missing: list[str] = []
    for field in PATH_LIST_FIELDS:
        for name in getattr(request, field):
            try:
                size = resolve(field, name).stat().st_size
            except FileNotFoundError:
                missing.append(name)
                continue
            except OSError as exc:
                raise StartRefused(f"dataset file {name} cannot be read ({exc.strerror})") from None
            if size > max_bytes:
                raise StartRefused(
                    f"dataset file {name} is {_size(size)}, over this server's limit of {_size(max_bytes)} per file"
                    " (the operator sets it with FINETUNE_STUDIO_MAX_DATASET_BYTES); split the file or raise the limit"
                )
    if missing:
        raise StartRefused(f"dataset file not found: {', '.join(missing)}; check the paths in local_datasets")


def _size(count: int) -> str:
    if count < 1024:
        return f"{count} bytes"
    value = count / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
