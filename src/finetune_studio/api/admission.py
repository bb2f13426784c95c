"""What a start request must pass before it is queued: queue room, finite numbers,
paths inside the allowed folders, a local model that exists, dataset files that
exist and are not too large (however they are named: `local_datasets`,
`local_eval_datasets`, or a local file or folder in `hf_dataset`).

Each refusal names the request field at fault (`StartRefused.field`), so the page
shows it beside that field before anything is queued.

Paths: on loopback any path the user can read may be named. When the server is
exposed (or `allowed_roots` is set), every path in the request is resolved (`~`,
`..` and symlinks included) and must lie under one of the roots; the check comes
before any existence check, so a client cannot probe what lies outside them.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from fastapi.exceptions import RequestValidationError

from finetune_studio.bounds import excerpt
from finetune_studio.config import Settings, roots_named, within
from finetune_studio.errors import PathNotAllowed, QueueFull, StartRefused
from finetune_studio.paths import is_local, name_problem
from finetune_studio.schemas import TrainingStartRequest

# Fields that always name a local path, and fields that name one only when they
# look like a path or exist here (otherwise they are Hugging Face hub ids, or for
# resume_from_checkpoint the id of an earlier job, looked up under the jobs folder).
PATH_FIELDS = ("model_local_path", "tensorboard_dir")
PATH_LIST_FIELDS = ("local_datasets", "local_eval_datasets")
PATH_OR_HUB_FIELDS = ("model_name", "hf_dataset", "resume_from_checkpoint")
# Files a folder named in hf_dataset may hold (see _folder_files).
MAX_FOLDER_FILES = 10_000


def check_start(request: TrainingStartRequest, settings: Settings, queued: int) -> None:
    if queued >= settings.max_queued_jobs:
        raise QueueFull(
            f"the queue is full ({queued} jobs waiting, the limit is {settings.max_queued_jobs}); try again later"
        )
    check_finite(request)
    check_names(request)
    check_scale_out(request, settings)
    roots = settings.path_roots()
    check_paths(request, roots)
    check_model(request)
    check_datasets(request, settings.max_dataset_bytes, roots)


def check_scale_out(request: TrainingStartRequest, settings: Settings) -> None:
    """Data-parallel workers (num_workers > 1) and per-worker resources need a Ray cluster."""
    if settings.ray_address:
        return
    for field, given in (("num_workers", request.num_workers > 1), ("resources_per_worker", request.resources_per_worker)):
        if given:
            raise StartRefused(
                f"{field} asks for Ray workers, but this server trains each job in one local process: start it"
                " with --ray-address (or FINETUNE_STUDIO_RAY_ADDRESS) of a Ray cluster (docs/SCALE-OUT.md),"
                f" or leave {field} out",
                field=field,
            )


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


def check_names(request: TrainingStartRequest) -> None:
    """Every path or hub id must be one a machine can have (paths.name_problem): a
    100,000-character model_name is refused here, not by a job that fails with
    "File name too long" once it leaves the queue."""
    named = [(name, getattr(request, name), False) for name in PATH_FIELDS]
    named += [(name, value, False) for name in PATH_LIST_FIELDS for value in getattr(request, name)]
    named += [(name, getattr(request, name), True) for name in PATH_OR_HUB_FIELDS]
    for field, value, hub_id in named:
        problem = name_problem(value, hub_id=hub_id) if value else None
        if problem:
            raise StartRefused(f"{field}: {excerpt(value, 80)!r} {problem}", field=field)


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
        if value and is_local(value):
            yield name, value


def resolve(field: str, name: str) -> Path:
    """The real path `name` points at: `~` expanded, relative to this process, `..` and symlinks resolved."""
    if not name.strip() or "\x00" in name:
        raise StartRefused(f"{field}: {name!r} is not a valid path", field=field)
    try:
        return Path(os.path.expanduser(name)).resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        raise StartRefused(f"{field}: {name!r} is not a valid path ({exc})", field=field) from None


def check_paths(request: TrainingStartRequest, roots: Optional[list[Path]]) -> None:
    for field, name in named_paths(request):
        path = resolve(field, name)
        if roots is not None and not within(path, roots):
            where = "" if str(path) == name else f" (it resolves to {path})"
            raise PathNotAllowed(
                f"{field}: {name!r} is outside the folders this server accepts paths from{where}. The server is"
                f" reachable from the network, so paths must lie under {roots_named(roots)};"
                " the operator sets them with FINETUNE_STUDIO_ALLOWED_ROOTS",
                field=field,
            )


def check_model(request: TrainingStartRequest) -> None:
    """A local model (a folder or a .gguf file) must exist now, not hours later when
    the job leaves the queue. The child loads `model_local_path` when it is set, else
    `model_name`; a hub id is left to the child (it fails fast when offline)."""
    field, name = ("model_local_path", request.model_local_path) if request.model_local_path else (
        "model_name", request.model_name)
    if not is_local(name):
        return
    path = resolve(field, name)
    try:
        path.stat()
    except FileNotFoundError:
        raise StartRefused(
            f"{field}: the model path {name} does not exist; name a local model folder or .gguf file, or a hub id",
            field=field,
        ) from None
    except OSError as exc:
        raise StartRefused(f"{field}: the model path {name} cannot be read ({exc.strerror})", field=field) from None


def dataset_sources(request: TrainingStartRequest) -> Iterator[tuple[str, str]]:
    """(field, name) for every local file or folder that the job reads data from:
    the dataset lists, and `hf_dataset` when it names a local path (paths.is_local,
    the rule the child follows too)."""
    for field in PATH_LIST_FIELDS:
        for name in getattr(request, field):
            yield field, name
    if request.hf_dataset and is_local(request.hf_dataset):
        yield "hf_dataset", request.hf_dataset


def check_datasets(request: TrainingStartRequest, max_bytes: int, roots: Optional[list[Path]] = None) -> None:
    """Every way data enters meets the same rules: each file it is read from exists,
    can be read and is at most `max_bytes`; in a folder named by `hf_dataset` that is
    each of its data files, and each must also lie under the roots (a link inside
    the folder may lead out of it)."""
    missing: list[tuple[str, str]] = []
    for field, name in dataset_sources(request):
        path = resolve(field, name)
        try:
            info = path.stat()
        except FileNotFoundError:
            missing.append((field, name))
            continue
        except OSError as exc:
            raise StartRefused(f"dataset file {name} cannot be read ({exc.strerror})", field=field) from None
        if field == "hf_dataset" and stat.S_ISDIR(info.st_mode):
            for file, size in _folder_files(name, path, roots):
                _check_size(f"{file} (in hf_dataset {name})", size, max_bytes, field)
        else:
            _check_size(name, info.st_size, max_bytes, field)
    if missing:
        fields = " and ".join(dict.fromkeys(field for field, _ in missing))
        raise StartRefused(
            f"dataset file not found: {', '.join(name for _, name in missing)}; check the paths in {fields}",
            field=missing[0][0],
        )


def _check_size(what: str, size: int, max_bytes: int, field: str) -> None:
    if size > max_bytes:
        raise StartRefused(
            f"dataset file {what} is {_size(size)}, over this server's limit of {_size(max_bytes)} per file"
            " (the operator sets it with FINETUNE_STUDIO_MAX_DATASET_BYTES); split the file or raise the limit",
            field=field,
        )


def _folder_files(name: str, folder: Path, roots: Optional[list[Path]]) -> Iterator[tuple[Path, int]]:
    """(path, size) of each data file `datasets` may read in `folder`: every file in
    it and below, links followed (each folder once), hidden ones (`.`, `__`) skipped
    as `datasets` skips them. Bounded: a folder of more entries is no dataset folder
    (`hf_dataset: "/"`, say), and walking it would hold the request."""
    entries = 0
    seen = {folder}  # real folders already walked: a link back up is not walked again
    for parent, folders, files in os.walk(folder, followlinks=True):
        here = Path(parent)
        kept = []
        for entry in sorted(folders):
            real = _inside(name, here / entry, roots)
            if not entry.startswith((".", "__")) and real not in seen:
                seen.add(real)
                kept.append(entry)
        folders[:] = kept
        for entry in sorted(files):
            if entry.startswith((".", "__")):
                continue
            entries += 1
            if entries > MAX_FOLDER_FILES:
                raise StartRefused(
                    f"hf_dataset {name} holds more than {MAX_FOLDER_FILES} files, more than a dataset folder would:"
                    " name the folder that holds just the dataset",
                    field="hf_dataset",
                )
            real = _inside(name, here / entry, roots)
            try:
                size = real.stat().st_size
            except OSError as exc:
                raise StartRefused(
                    f"dataset file {here / entry} (in hf_dataset {name}) cannot be read ({exc.strerror})", field="hf_dataset"
                ) from None
            yield here / entry, size


def _inside(name: str, path: Path, roots: Optional[list[Path]]) -> Path:
    """The real path of an entry of an hf_dataset folder, which must lie under the roots too."""
    real = resolve("hf_dataset", str(path))
    if roots is not None and not within(real, roots):
        raise PathNotAllowed(
            f"hf_dataset: {path} in {name!r} leads outside the folders this server accepts paths from (it resolves"
            f" to {real}). The server is reachable from the network, so paths must lie under"
            f" {roots_named(roots)}; the operator sets them with FINETUNE_STUDIO_ALLOWED_ROOTS",
            field="hf_dataset",
        )
    return real


def _size(count: int) -> str:
    if count < 1024:
        return f"{count} bytes"
    value = count / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
