"""An export's files: each written under a partial name and renamed when whole, then listed.

A file being written is `.NAME.partial` beside its final name (`atomic.write_atomically`,
the rule every writer follows), so nothing half-written ever carries a final name, and
whatever is left named as partial after a stop or a failure is removed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Optional

from finetune_studio.atomic import is_partial, remove
from finetune_studio.schemas import ExportFile, ExportFormat

__all__ = ["describe", "remove", "remove_partials", "sha256_of"]


def remove_partials(folder: Path) -> None:
    """Everything under folder still named as partial (a stop or a failure left it)."""
    if not folder.is_dir():
        return
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if is_partial(path):
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
