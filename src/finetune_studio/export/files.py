"""An export's files: each written under a partial name and renamed when whole, then listed.

A file being written is `.NAME.partial` beside its final name (the same rule as
`wire.save_atomically` for folders), so nothing half-written ever carries a final
name, and whatever is left with `.partial` after a stop or a failure is removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from finetune_studio.schemas import ExportFile, ExportFormat

PARTIAL_SUFFIX = ".partial"


def partial_path(final: Path) -> Path:
    return final.with_name(f".{final.name}{PARTIAL_SUFFIX}")


@contextlib.contextmanager
def write_atomically(final: Path) -> Iterator[Path]:
    """Yield the partial path to write final's content to; when the block succeeds it
    is renamed to final in one step; when it fails, it is removed."""
    partial = partial_path(final)
    partial.unlink(missing_ok=True)
    try:
        yield partial
        if not partial.is_file():
            raise FileNotFoundError(f"{partial} was not written")
        os.replace(partial, final)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def remove(path: Path) -> None:
    """A file or a folder, gone (absent already is fine)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_partials(folder: Path) -> None:
    """Everything under folder still named as partial (a stop or a failure left it)."""
    if not folder.is_dir():
        return
    for path in sorted(folder.rglob(f"*{PARTIAL_SUFFIX}"), key=lambda p: len(p.parts), reverse=True):
        remove(path)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe(root: Path, path: Path, export_format: ExportFormat, quantization: Optional[str]) -> dict[str, Any]:
    """One `ExportFile` (as details.files lists it): its name relative to root, size and checksum."""
    return ExportFile(
        name=path.relative_to(root).as_posix(),
        format=export_format,
        quantization=quantization,
        bytes=path.stat().st_size,
        sha256=sha256_of(path),
    ).model_dump()
