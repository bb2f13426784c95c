"""What a fresh interpreter loads when it imports some modules (tests/unit/test_import_rules.py,
test_gguf_backend.py, test_ray_parts.py): the check import-linter cannot make."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import finetune_studio

HEAVY = ("torch", "transformers", "peft", "trl", "ray", "datasets")
WEB = ("fastapi", "starlette", "uvicorn")


def modules(*packages: str) -> list[str]:
    found = []
    for info in pkgutil.walk_packages(finetune_studio.__path__, "finetune_studio."):
        if info.name.split(".")[1] in packages:
            found.append(info.name)
    return sorted(found)


def loaded_by(names: list[str], watched: tuple[str, ...]) -> list[str]:
    """The watched libraries in sys.modules after importing `names` in a fresh interpreter."""
    code = (
        f"import sys, {', '.join(names)}\n"
        f"print(' '.join(sorted(name for name in {watched!r} if name in sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return result.stdout.split()


SERVER_SIDE = modules("jobs", "api", "supervisor", "cli") + ["finetune_studio.wire", "finetune_studio.atomic", "finetune_studio.paths",
                                                          "finetune_studio.schemas", "finetune_studio.config",
                                                          "finetune_studio.openai_wire", "finetune_studio.conversations",
                                                          "finetune_studio.cuda_features"]
