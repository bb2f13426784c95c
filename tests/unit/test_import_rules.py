"""What import-linter cannot see: that importing a server-side or CLI module, in a
fresh interpreter, loads none of the heavy libraries (imports inside functions are
allowed; module-level ones are not), and that a child's module loads no web framework."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.imports import HEAVY, SERVER_SIDE, WEB, loaded_by, modules


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


def imported_test_modules(source: str) -> list[tuple[int, str]]:
    """(line, name) of each test module (tests.*.test_*) that `source` imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found += [(node.lineno, name) for name in names
                  if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_")]
    return found


def test_no_test_module_imports_another_test_module() -> None:
    # What tests share lives in tests/helpers/ (fixtures in conftest.py): a test module that
    # imports another runs the other's module-level skips and fixtures, and ties the two together.
    tests = Path(__file__).resolve().parents[1]
    found = [(str(path.relative_to(tests)), line, name) for path in sorted(tests.rglob("*.py"))
             for line, name in imported_test_modules(path.read_text())]
    assert found == []


def test_the_check_sees_each_way_of_importing_a_test_module() -> None:
    source = "from tests.integration import test_ray\nimport tests.unit.test_x\nfrom tests.unit.test_y import f\n" \
             "from tests.helpers import jobs\n"
    assert [line for line, _ in imported_test_modules(source)] == [1, 2, 3]
