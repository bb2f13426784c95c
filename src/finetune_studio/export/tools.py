"""Where llama.cpp's own export tools live, whether they are there, and how to install them.

Two parts make a GGUF export, both from one release of `llama-cpp-python` (which
vendors llama.cpp):

- its wheel (`pip install 'finetune-studio[gguf]'`): `libllama` with
  `llama_model_quantize`, imported as `llama_cpp`;
- its sdist's converter scripts, which the wheel does not carry:
  `convert_hf_to_gguf.py`, `convert_lora_to_gguf.py`, the `conversion` package beside
  them and `gguf-py` (the converter's own `gguf`, which the PyPI package of that name
  may not match). `python -m finetune_studio.export.tools --install` extracts them
  into the tools folder (`tools_dir()`); scripts/install.sh runs it.

Cheap to import (no llama_cpp, no torch): the server calls `tools_problem()` when it
admits an export.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Optional

from finetune_studio.atomic import save_atomically
from finetune_studio.wire import GGUF_INSTALL, TOOLS_ENV  # TOOLS_ENV: another tools folder

# The llama-cpp-python release whose llama.cpp both the library and the scripts come from.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
# Where `--install` keeps the downloaded sdist, so a second install does not fetch it again.
SDIST_CACHE_ENV = "FINETUNE_STUDIO_SDIST_CACHE"

INSTALL_HINT = (
    f"Install llama.cpp's export tools: run `bash scripts/install.sh`, or `{GGUF_INSTALL}`"
    " and then `python -m finetune_studio.export.tools --install`."
)

# What the export needs from the sdist's vendor/llama.cpp/, as paths under it.
_SCRIPTS = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py")
_FOLDERS = ("conversion", "gguf-py")
_EXTRA = ("LICENSE",)
_VERSION_FILE = "LLAMA_CPP_PYTHON_VERSION"


def tools_dir() -> Path:
    """The tools folder: $FINETUNE_STUDIO_LLAMA_CPP_TOOLS, else one inside this Python
    environment (so each virtual environment has the tools of its own llama_cpp)."""
    named = os.environ.get(TOOLS_ENV, "").strip()
    if named:
        return Path(named).expanduser()
    return Path(sys.prefix) / "share" / "finetune-studio" / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"


@dataclass(frozen=True)
class LlamaCppTools:
    """A complete tools folder."""

    root: Path

    @property
    def convert_hf(self) -> Path:
        return self.root / "convert_hf_to_gguf.py"

    @property
    def convert_lora(self) -> Path:
        return self.root / "convert_lora_to_gguf.py"

    @property
    def gguf_py(self) -> Path:
        return self.root / "gguf-py"

    def script_env(self) -> dict[str, str]:
        """The environment to run a converter script in: the sdist's gguf-py first on the
        path, so the converter reads and writes with the gguf code it was released with."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.gguf_py), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"  # its log lines are our progress: unbuffered, they arrive as written
        return env


def _installed_version() -> Optional[str]:
    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return None


def tools_problem() -> Optional[str]:
    """None when a GGUF export can run here; otherwise what is missing and how to install it.
    Cheap: looks at files and package metadata, imports nothing."""
    version = _installed_version()
    if version is None or importlib.util.find_spec("llama_cpp") is None:
        return f"llama-cpp-python is not installed (GGUF quantization uses its llama_model_quantize). {INSTALL_HINT}"
    root = tools_dir()
    missing = [name for name in (*_SCRIPTS, *_FOLDERS) if not (root / name).exists()]
    if missing:
        return f"llama.cpp's converter scripts are not in {root} (missing: {', '.join(missing)}). {INSTALL_HINT}"
    stamp = root / _VERSION_FILE
    scripts_version = stamp.read_text().strip() if stamp.is_file() else None
    if scripts_version is not None and scripts_version != version:
        return (
            f"llama.cpp's converter scripts in {root} come from llama-cpp-python {scripts_version}, but"
            f" {version} is installed; the two must match. {INSTALL_HINT}"
        )
    return None


class ToolsMissing(Exception):
    """The export tools are absent; the message says how to install them."""


def find_tools() -> LlamaCppTools:
    problem = tools_problem()
    if problem is not None:
        raise ToolsMissing(problem)
    return LlamaCppTools(tools_dir())


# -- installing ---------------------------------------------------------------


def _sdist_cache() -> Path:
    named = os.environ.get(SDIST_CACHE_ENV, "").strip()
    return Path(named).expanduser() if named else Path.home() / ".cache" / "finetune-studio" / "sdists"


def download_sdist(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """The sdist of llama-cpp-python `version`, from the cache or fetched once with pip."""
    cache = _sdist_cache()
    found = sorted(cache.glob(f"llama_cpp_python-{version}.tar.gz"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    print(f"downloading the llama-cpp-python {version} sdist (its converter scripts) into {cache} ...", file=sys.stderr)
    subprocess.run(  # noqa: S603 - pip, with fixed arguments
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
         f"llama-cpp-python=={version}", "-d", str(cache)],
        check=True,
    )
    found = sorted(cache.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not found:
        raise ToolsMissing(f"pip downloaded no llama_cpp_python-{version}.tar.gz into {cache}")
    return found[0]


def _wanted(relative: PurePosixPath) -> bool:
    parts = relative.parts
    if not parts or ".." in parts:
        return False
    if len(parts) == 1:
        return parts[0] in (*_SCRIPTS, *_EXTRA)
    return parts[0] in _FOLDERS


def extract_tools(sdist: Path, target: Path, version: str = LLAMA_CPP_PYTHON_VERSION) -> LlamaCppTools:
    """Copy the converter scripts, `conversion/` and `gguf-py/` out of the sdist into
    target. The folder is written beside target and renamed, so it is whole or absent."""
    target = target.expanduser().resolve()
    with save_atomically(target, unique=True) as partial:
        with tarfile.open(sdist, "r:gz") as archive:
            for member in archive:
                parts = PurePosixPath(member.name).parts
                # <name>-<version>/vendor/llama.cpp/<what we want>
                if len(parts) < 4 or parts[1:3] != ("vendor", "llama.cpp") or not member.isfile():
                    continue
                relative = PurePosixPath(*parts[3:])
                if not _wanted(relative):
                    continue
                destination = partial.joinpath(*relative.parts)
                destination.parent.mkdir(parents=True, exist_ok=True)
                source = archive.extractfile(member)
                if source is None:
                    continue
                with source, destination.open("wb") as out:
                    shutil.copyfileobj(source, out)
        missing = [name for name in (*_SCRIPTS, *_FOLDERS) if not (partial / name).exists()]
        if missing:
            raise ToolsMissing(f"{sdist} holds no vendor/llama.cpp/{', '.join(missing)}: is it llama-cpp-python's sdist?")
        (partial / _VERSION_FILE).write_text(version + "\n")
    return LlamaCppTools(target)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m finetune_studio.export.tools",
        description="Install or locate llama.cpp's GGUF converter scripts (from the llama-cpp-python sdist).",
    )
    parser.add_argument("--install", action="store_true", help="extract the scripts into the tools folder")
    parser.add_argument("--sdist", type=Path, help="a llama-cpp-python sdist to take them from (default: download it)")
    parser.add_argument("--force", action="store_true", help="install again even if the folder is complete")
    args = parser.parse_args(argv)
    if args.install:
        if args.force or args.sdist or tools_problem() is not None:
            try:
                sdist = args.sdist or download_sdist()
                tools = extract_tools(sdist, tools_dir())
            except (ToolsMissing, OSError, tarfile.TarError, subprocess.CalledProcessError) as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            print(f"llama.cpp's export tools are in {tools.root}")
    problem = tools_problem()
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    print(tools_dir())
    return 0


if __name__ == "__main__":
    sys.exit(main())
