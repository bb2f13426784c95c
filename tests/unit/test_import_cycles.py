"""scripts/import_cycles.py, the check (run by scripts/check.sh) that no module of
src/finetune_studio imports another that imports it back: it passes on the tree, and
on a package written here it names each cycle, module by module, with the lines."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "import_cycles.py"


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd)


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_the_source_tree_has_no_import_cycle() -> None:
    result = run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("no import cycles among the ")


def test_a_cycle_is_found_and_named_with_its_lines(tmp_path: Path) -> None:
    package = write(tmp_path, {
        "pkg/__init__.py": "",
        # a -> b at the top, b -> c inside a function, c -> a under TYPE_CHECKING: all count.
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "def later():\n    from .c import thing\n    return thing\n",
        "pkg/c.py": "from typing import TYPE_CHECKING\nthing = 1\nif TYPE_CHECKING:\n    import pkg.a\n",
        # Imports a module on the cycle, but nothing imports it back: not on a cycle.
        "pkg/d.py": "from pkg.a import b\n",
        # A second cycle, inside a subpackage, through its __init__ and a relative import.
        "pkg/sub/__init__.py": "from pkg.sub.x import X\n",
        "pkg/sub/x.py": "from . import y\nX = 1\n",
        "pkg/sub/y.py": "from .. import sub\n",
    })
    result = run(str(package), cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "2 import cycles among the modules of pkg:"
    assert "pkg.a -> pkg.b -> pkg.c -> pkg.a" in lines
    assert "pkg.sub -> pkg.sub.x -> pkg.sub.y -> pkg.sub" in lines
    assert "    pkg.a imports pkg.b (pkg/a.py:1)" in lines
    assert "    pkg.b imports pkg.c (pkg/b.py:2)" in lines
    assert "    pkg.c imports pkg.a (pkg/c.py:4)" in lines
    assert "    pkg.sub.y imports pkg.sub (pkg/sub/y.py:1)" in lines
    assert "pkg.d" not in result.stdout


def test_a_package_without_a_cycle_passes(tmp_path: Path) -> None:
    package = write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "import pkg.b\n", "pkg/b.py": "import json\n"})
    result = run(str(package))
    assert result.returncode == 0, result.stdout
    assert result.stdout == "no import cycles among the 3 modules of pkg\n"


def test_imports_resolve_to_the_modules_they_load(tmp_path: Path) -> None:
    package = write(tmp_path, {
        "pkg/__init__.py": "from .top import T\n",
        "pkg/top.py": "T = 1\n",
        "pkg/sub/__init__.py": "NAME = 1\n",
        "pkg/sub/leaf.py": (
            "from pkg.sub import NAME\n"  # a name of the package: its __init__
            "from pkg import sub, top\n"  # submodules: the modules themselves
            "from ..top import T\n"  # relative, two levels up
            "from . import NAME as N\n"  # relative, a name of this package
            "import pkg.sub.leaf\n"  # itself: not an edge
            "import os, json\n"  # outside the package: not an edge
            "from .... import nothing\n"  # above the top of the package: not an edge
        ),
    })
    edges = script().import_graph(package)
    assert set(edges["pkg.sub.leaf"]) == {"pkg.sub", "pkg.top"}
    assert set(edges["pkg"]) == {"pkg.top"}
    assert edges["pkg.sub"] == {} and edges["pkg.top"] == {}


def test_what_is_not_a_package_is_refused(tmp_path: Path) -> None:
    result = run(str(tmp_path))
    assert result.returncode == 2
    assert "is not a package" in result.stderr
