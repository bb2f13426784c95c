"""Finding a job's newest complete trainer checkpoint. Plain Python: the server and
the training child both use it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional


def last_checkpoint(folder: Path) -> Optional[Path]:
    """The `checkpoint-N` with the highest N under folder (or folder/checkpoints)
    whose trainer_state.json, which the trainer writes last, reads; or None."""
    found: list[tuple[int, Path]] = []
    for base in (folder, folder / "checkpoints"):
        for path in base.glob("checkpoint-*"):
            step = path.name.removeprefix("checkpoint-")
            if not step.isdigit():
                continue
            try:
                json.loads((path / "trainer_state.json").read_text())
            except (OSError, ValueError):
                continue  # written only in part when the worker died
            found.append((int(step), path))
    return max(found)[1] if found else None
