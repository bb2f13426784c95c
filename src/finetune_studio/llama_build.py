"""llama.cpp's build in the background, and how the server sees it.

The demo (scripts/demo.sh) installs what it needs without llama-cpp-python, whose
source build takes minutes, and starts that build once it has shown its answer
(`scripts/install.sh --llama-background`, which runs):

    python -m finetune_studio.llama_build start -- bash scripts/install.sh --llama-only

`start` returns at once. The runner it leaves behind (`run`, in a session of its
own, so that closing the terminal does not end it) takes the build's lock, records
the build and runs the command, whose output goes to the build's log. Three files,
in `build_dir()`: `<venv>/share/finetune-studio/`, beside the tools folder (or
$FINETUNE_STUDIO_LLAMA_BUILD_DIR):

- `llama-build.lock`: held with flock, exclusively, by the runner and by the
  command it runs for as long as the build runs; the kernel lets go however it
  ends (SIGKILL included). A second runner waits for it: one build at a time.
  scripts/install.sh takes it too while it installs llama.cpp itself.
- `llama-build.json`: `{"state": "building" | "done" | "failed", "pid",
  "started_at", "finished_at", "exit_code", "log"}`, written whole (atomically).
- `llama-build.log`: the command's output (pip's, cmake's, the compiler's).

`probe()` reads them without waiting and without importing anything but the
standard library: `building` (the lock is held, whatever the record says), `done`,
`failed` (the record says so, or says building while nobody holds the lock: the
build was killed), `absent` (no record: no build was started in this environment).

What the server does with it: a GGUF export asked for while the tools are missing
is admitted when a build is under way, and waits queued (`idle`, its message
saying how far the build is: `tools_wait()`) until the tools are there; without a
build, it is refused as before (400 `export_tools_missing`). A chat with an
export's GGUF waits likewise for `llama_cpp` (`llama_cpp_wait()`).

A shared module, the standard library only (as atomic.py): the server, its chat
route and scripts/install.sh use it; it imports nothing of export/ (whether the
tools are there is asked of `export.tools.tools_problem`, which callers pass in).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

from finetune_studio.atomic import write_file

BUILD_DIR_ENV = "FINETUNE_STUDIO_LLAMA_BUILD_DIR"
LOCK_FILE = "llama-build.lock"
RECORD_FILE = "llama-build.json"
LOG_FILE = "llama-build.log"
# The key of an export's stored request that says it was admitted during a build,
# to wait for the tools before it runs (the supervisor looks for it).
WAITS_FOR_BUILD = "waits_for_llama_build"
# How much of the log's end is read for the build's progress.
_TAIL_BYTES = 16 * 1024
# ninja's "[12/345] Building C object ..." and make's "[ 45%] Building ...", wherever
# on a line (pip may indent its build's output).
_NINJA = re.compile(rb"\[(\d+)/(\d+)\] ")
_MAKE = re.compile(rb"\[\s*(\d+)%\] ")

BuildState = Literal["absent", "building", "done", "failed"]


def build_dir() -> Path:
    """Where the lock, the record and the log are: $FINETUNE_STUDIO_LLAMA_BUILD_DIR, else
    `<this environment>/share/finetune-studio/` (what scripts/install.sh uses for .venv)."""
    named = os.environ.get(BUILD_DIR_ENV, "").strip()
    if named:
        return Path(named).expanduser()
    return Path(sys.prefix) / "share" / "finetune-studio"


@dataclass(frozen=True)
class LlamaBuild:
    """What `probe()` found. `log`, `started_at` are those of the build the record
    describes (None when the lock is held by something that keeps no record:
    scripts/install.sh installing llama.cpp in the foreground)."""

    state: BuildState
    log: Optional[Path] = None
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    exit_code: Optional[int] = None

    @property
    def running(self) -> bool:
        return self.state == "building"

    def progress(self) -> Optional[int]:
        """How far the compilation is, in percent, from the log's last build line (ninja's
        `[n/m]` or make's `[ p%]`); None before compilation starts or without a log."""
        if self.log is None:
            return None
        try:
            with open(self.log, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - _TAIL_BYTES))
                tail = handle.read()
        except OSError:
            return None
        last: Optional[int] = None
        at = -1
        for match in _NINJA.finditer(tail):
            done, total = int(match.group(1)), int(match.group(2))
            if total > 0 and match.start() > at:
                at, last = match.start(), min(100, done * 100 // total)
        for match in _MAKE.finditer(tail):
            if match.start() > at:
                at, last = match.start(), min(100, int(match.group(1)))
        return last

    def waiting_message(self, now: Optional[float] = None) -> str:
        """What a GGUF export says while it waits for this build."""
        facts = []
        if self.started_at is not None:
            facts.append(f"started {_ago((time.time() if now is None else now) - self.started_at)}")
        percent = self.progress()
        if percent is not None:
            facts.append(f"{percent}% compiled")
        if self.log is not None:
            facts.append(f"log: {self.log}")
        what = f" ({'; '.join(facts)})" if facts else ""
        return f"Waiting for llama.cpp's build to finish{what}; the export starts once llama.cpp's tools are installed"

    def details(self) -> dict[str, Any]:
        """What a waiting export's status carries in `details` (besides its message)."""
        found: dict[str, Any] = {"waiting_for": "llama_build"}
        if self.log is not None:
            found["build_log"] = str(self.log)
        if self.started_at is not None:
            found["build_started_at"] = self.started_at
        percent = self.progress()
        if percent is not None:
            found["build_percent"] = percent
        return found

    def note(self) -> str:
        """A sentence on this build for a refusal (empty when there is nothing to say)."""
        if self.state == "failed":
            how = (
                f"ended with exit code {self.exit_code}"
                if self.exit_code is not None
                else "stopped before it finished"
            )
            log = f"; its log: {self.log}" if self.log is not None else ""
            return f" llama.cpp's build in the background {how}{log}."
        return ""


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{int(seconds)} s ago"
    return f"{int(round(seconds / 60))} min ago"


def lock_held(path: Path) -> bool:
    """Whether someone holds an exclusive flock on `path` (False when it does not exist).
    Asked without waiting: a shared lock, taken and let go at once."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return True
        raise
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _read_record(folder: Path) -> Optional[dict[str, Any]]:
    try:
        record = json.loads((folder / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def probe(folder: Optional[Path] = None) -> LlamaBuild:
    """The build's state in `folder` (default `build_dir()`); see the module's docstring."""
    folder = build_dir() if folder is None else folder
    held = lock_held(folder / LOCK_FILE)
    record = _read_record(folder)
    if record is None:
        return LlamaBuild("building" if held else "absent")
    state = record.get("state")
    log = Path(str(record["log"])) if isinstance(record.get("log"), str) else folder / LOG_FILE
    started = _number(record.get("started_at"))
    if held:
        if state == "building":
            return LlamaBuild("building", log, started)
        return LlamaBuild("building")  # another holder (install.sh itself): not the recorded build
    if state == "done":
        return LlamaBuild("done", log, started, _number(record.get("finished_at")), _int(record.get("exit_code")))
    if state == "failed":
        return LlamaBuild("failed", log, started, _number(record.get("finished_at")), _int(record.get("exit_code")))
    # Recorded as building, yet nobody holds the lock: the build was killed.
    return LlamaBuild("failed", log, started)


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- what the server asks ------------------------------------------------------


@dataclass(frozen=True)
class ToolsWait:
    """Whether a waiting GGUF export can run: `ready`; `waiting` (for `build`: `message`
    is its idle status); `missing` (the build ended without the tools: `message` says
    why, as an `export_tools_missing` error)."""

    state: Literal["ready", "waiting", "missing"]
    message: str
    build: LlamaBuild


def tools_wait(tools_problem: Callable[[], Optional[str]], folder: Optional[Path] = None) -> ToolsWait:
    """See ToolsWait; `tools_problem` says what is missing (None: nothing;
    `export.tools.tools_problem`). Cheap: files, package metadata and a flock probe."""
    build = probe(folder)
    importlib.invalidate_caches()  # the wheel may have been installed since the last look
    problem = tools_problem()
    if problem is None:
        return ToolsWait("ready", "", build)
    if build.running:
        return ToolsWait("waiting", build.waiting_message(), build)
    ended = build.note() or (
        " llama.cpp's build in the background ended without installing them." if build.state == "done" else ""
    )
    return ToolsWait("missing", f"llama.cpp's tools are still missing: {problem}{ended}", build)


def llama_cpp_installed() -> bool:
    """Whether `llama_cpp` can be imported here (looked up, not imported)."""
    importlib.invalidate_caches()  # the wheel may have been installed since the last look
    return importlib.util.find_spec("llama_cpp") is not None


def llama_cpp_wait(folder: Optional[Path] = None) -> Optional[LlamaBuild]:
    """The build a GGUF chat should wait for: the one under way while `llama_cpp` is not
    installed; None when there is nothing to wait for (installed, or no build running)."""
    if llama_cpp_installed():
        return None
    build = probe(folder)
    return build if build.running else None


# -- running a build -------------------------------------------------------------


def _record(folder: Path, **fields: Any) -> None:
    write_file(folder / RECORD_FILE, json.dumps(fields, indent=1) + "\n")


def run_build(command: list[str], folder: Optional[Path] = None) -> int:
    """Run `command` as the build: wait for the lock (a build already running finishes
    first), record it, send its output to the log, record how it ended. Returns its
    exit status (negative: the signal that ended it)."""
    folder = build_dir() if folder is None else folder
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / LOG_FILE
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        started = time.time()
        base = {"pid": os.getpid(), "started_at": started, "log": str(log), "command": command}
        _record(folder, state="building", **base)
        log.write_text(f"llama.cpp's build, started {time.ctime(started)} (pid {os.getpid()}): {shlex.join(command)}\n")
        with open(log, "a") as out:
            try:
                # The command holds the lock too (pass_fds): a runner that is killed
                # leaves it held for as long as the build itself still runs.
                code = subprocess.call(  # noqa: S603 - the command this module was asked to run
                    command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, pass_fds=(fd,)
                )
            except OSError as exc:
                out.write(f"could not run it: {exc}\n")
                code = 127
            out.write(f"llama.cpp's build ended {time.ctime()} with exit code {code}\n")
        _record(folder, state="done" if code == 0 else "failed", finished_at=time.time(), exit_code=code, **base)
        return code
    finally:
        os.close(fd)


def start_build(command: list[str], folder: Optional[Path] = None) -> tuple[bool, LlamaBuild]:
    """Start `run_build(command)` detached and return at once: (True, the build as
    recorded so far), or (False, the build already running)."""
    folder = build_dir() if folder is None else folder
    current = probe(folder)
    if current.running:
        return False, current
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / LOG_FILE
    env = dict(os.environ, **({BUILD_DIR_ENV: str(folder)} if folder != build_dir() else {}))
    # The runner's own output (a traceback, should it fail) goes to the end of its log.
    with open(log, "a") as out:
        subprocess.run(  # noqa: S603 - this module's own runner, with the command it was given
            [sys.executable, "-m", "finetune_studio.llama_build", "detach", "--", *command],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, check=True,
        )
    # The runner records the build once it has the lock: a moment, unless another build holds it.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        found = probe(folder)
        if found.running and found.started_at is not None:
            return True, found
        time.sleep(0.05)
    return True, LlamaBuild("building", log)


def _detach(command: list[str]) -> None:
    """Start the runner in a session of its own (no terminal: closing it does not end the
    build) and leave at once, so that it is nobody's child but init's (no zombie, no wait)."""
    subprocess.Popen(  # noqa: S603 - this module's own runner, with the command it was given
        [sys.executable, "-m", "finetune_studio.llama_build", "run", "--", *command],
        stdin=subprocess.DEVNULL, start_new_session=True,
    )
    os._exit(0)  # not a Popen left to reap: the runner outlives this process


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m finetune_studio.llama_build",
        description="llama.cpp's build in the background: start it, run it under its lock, or say how it stands.",
    )
    parser.add_argument("action", choices=("start", "run", "status", "detach"),
                        help="start: in the background; run: here; status: as JSON (detach: start's own step)")
    parser.add_argument("command", nargs="*", help="the build's command (after --), for start and run")
    args = parser.parse_args(argv)
    if args.action == "status":
        build = probe()
        print(json.dumps({"state": build.state, "log": None if build.log is None else str(build.log),
                          "started_at": build.started_at, "finished_at": build.finished_at,
                          "exit_code": build.exit_code, "percent": build.progress()}))
        return 0
    if not args.command:
        parser.error(f"{args.action} needs the build's command after --")
    if args.action == "run":
        return 1 if run_build(args.command) != 0 else 0
    if args.action == "detach":
        _detach(args.command)
    started, build = start_build(args.command)
    where = f"; its log: {build.log}" if build.log is not None else ""
    print(("started" if started else "already running") + where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
