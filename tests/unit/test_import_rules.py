"""What import-linter cannot see: that importing a server-side or CLI module, in a
fresh interpreter, loads none of the heavy libraries (imports inside functions are
allowed; module-level ones are not), and that a child's module loads no web framework."""

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


def test_server_side_modules_import_nothing_heavy() -> None:
    assert loaded_by(SERVER_SIDE, HEAVY) == []


def test_the_lists_are_not_empty() -> None:
    assert "finetune_studio.api.app" in SERVER_SIDE and "finetune_studio.cli.main" in SERVER_SIDE
    assert "finetune_studio.training.child" in modules("training")
    assert "finetune_studio.inference.child" in modules("inference")
    assert {"finetune_studio.api.routes.chat", "finetune_studio.supervisor.inference", "finetune_studio.cli.chat"} <= set(SERVER_SIDE)


def test_the_child_entry_imports_no_web_framework_and_nothing_heavy_before_it_runs() -> None:
    # The child announces `loading_model` before it imports torch (a fraction of a second).
    assert loaded_by(["finetune_studio.training.child", "finetune_studio.training.recipe"], WEB + HEAVY) == []


def test_the_chat_child_imports_no_web_framework_and_nothing_heavy_before_it_is_ready() -> None:
    # It says `ready` before it imports torch, so the server knows at once that it started.
    assert loaded_by(["finetune_studio.inference.child"], WEB + HEAVY) == []


def test_the_check_sees_what_a_module_loads() -> None:
    assert {"fastapi", "starlette"} <= set(loaded_by(["finetune_studio.api.app"], WEB))
