"""llama.cpp's background build as the server sees it (finetune_studio/llama_build.py):
the probe over a fake lock, record and log in tmp_path (building, done, failed, killed,
absent), the progress read from the log, what an export and a chat are told, and the
runner itself with a stand-in command (nothing is compiled here)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from finetune_studio import llama_build
from finetune_studio.api.routes import chat
from tests.helpers.llama_build import holding_lock, record
from tests.helpers.polling import wait_for


def test_no_record_and_no_lock_is_absent(tmp_path: Path) -> None:
    assert llama_build.probe(tmp_path / "nothing-here").state == "absent"
    assert llama_build.probe(tmp_path).state == "absent"
    assert llama_build.probe(tmp_path).note() == ""


def test_a_held_lock_is_a_build_under_way_with_its_start_and_progress(tmp_path: Path) -> None:
    started = time.time() - 180
    log = record(tmp_path, state="building", pid=1, started_at=started)
    log.write_text("building llama-cpp-python ...\n  [12/100] Building C object ggml.c.o\n  [45/100] Building CXX object llama.cpp.o\n")
    with holding_lock(tmp_path):
        build = llama_build.probe(tmp_path)
        assert build.state == "building" and build.running
        assert build.log == log and build.started_at == pytest.approx(started)
        assert build.progress() == 45
        message = build.waiting_message()
        assert message.startswith("Waiting for llama.cpp's build to finish (started 3 min ago; 45% compiled;")
        assert f"log: {log}" in message
        assert build.details() == {"waiting_for": "llama_build", "build_log": str(log),
                                   "build_started_at": pytest.approx(started), "build_percent": 45}
    # The lock let go while the record still says building: the build was killed.
    killed = llama_build.probe(tmp_path)
    assert killed.state == "failed" and not killed.running
    assert "stopped before it finished" in killed.note() and str(log) in killed.note()


def test_make_progress_lines_count_too_and_no_build_line_is_no_progress(tmp_path: Path) -> None:
    log = record(tmp_path, state="building", started_at=time.time())
    log.write_text("-- Configuring done\n[ 17%] Building C object a.o\n[ 63%] Linking CXX shared library libllama.so\n")
    with holding_lock(tmp_path):
        assert llama_build.probe(tmp_path).progress() == 63
        log.write_text("Collecting llama-cpp-python==0.3.36\n")
        build = llama_build.probe(tmp_path)
        assert build.progress() is None and "compiled" not in build.waiting_message()
        assert "started 0 s ago" in build.waiting_message()


def test_done_and_failed_are_what_the_record_says_once_the_lock_is_free(tmp_path: Path) -> None:
    log = record(tmp_path, state="done", started_at=1.0, finished_at=2.0, exit_code=0)
    done = llama_build.probe(tmp_path)
    assert (done.state, done.exit_code, done.finished_at, done.log) == ("done", 0, 2.0, log)
    assert done.note() == ""
    record(tmp_path, state="failed", started_at=1.0, finished_at=2.0, exit_code=1)
    failed = llama_build.probe(tmp_path)
    assert failed.state == "failed" and failed.exit_code == 1
    assert failed.note() == f" llama.cpp's build in the background ended with exit code 1; its log: {log}."


def test_a_lock_without_a_build_record_is_install_sh_installing_in_the_foreground(tmp_path: Path) -> None:
    record(tmp_path, state="done", started_at=1.0, finished_at=2.0, exit_code=0)  # an earlier build's
    with holding_lock(tmp_path):
        build = llama_build.probe(tmp_path)
        assert build.running and build.log is None and build.started_at is None
        assert build.waiting_message().startswith("Waiting for llama.cpp's build to finish; the export starts")
    assert llama_build.probe(tmp_path).state == "done"


def test_a_corrupt_record_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / llama_build.RECORD_FILE).write_text("{not json")
    assert llama_build.probe(tmp_path).state == "absent"
    with holding_lock(tmp_path):
        assert llama_build.probe(tmp_path).running


def test_what_a_waiting_export_is_told(tmp_path: Path) -> None:
    def missing() -> str:
        return "llama-cpp-python is not installed"

    assert llama_build.tools_wait(lambda: None, tmp_path).state == "ready"
    absent = llama_build.tools_wait(missing, tmp_path)
    assert absent.state == "missing" and absent.message == "llama.cpp's tools are still missing: llama-cpp-python is not installed"
    log = record(tmp_path, state="building", started_at=time.time())
    with holding_lock(tmp_path):
        waiting = llama_build.tools_wait(missing, tmp_path)
        assert waiting.state == "waiting" and waiting.message == waiting.build.waiting_message()
        assert llama_build.tools_wait(lambda: None, tmp_path).state == "ready"  # installed before the record says done
    record(tmp_path, state="failed", started_at=1.0, exit_code=2)
    failed = llama_build.tools_wait(missing, tmp_path)
    assert failed.state == "missing" and "ended with exit code 2" in failed.message and str(log) in failed.message
    record(tmp_path, state="done", started_at=1.0, exit_code=0)
    assert "ended without installing them" in llama_build.tools_wait(missing, tmp_path).message


def test_a_chat_with_a_gguf_waits_for_the_build_while_llama_cpp_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(llama_build.BUILD_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(chat, "LLAMA_BUILD_POLL_SECONDS", 0.02)
    installed = {"now": False}
    monkeypatch.setattr(llama_build, "llama_cpp_installed", lambda: installed["now"])
    gguf: Any = {"base": {"kind": "gguf", "location": str(tmp_path / "m.gguf")}, "adapter": None, "backend": "llama_cpp"}
    folder: Any = {"base": {"kind": "folder", "location": str(tmp_path / "m")}, "adapter": None}
    record(tmp_path, state="building", started_at=time.time())

    async def scenario() -> None:
        with holding_lock(tmp_path):
            await asyncio.wait_for(chat.wait_for_llama_build(folder), 1)  # transformers: no wait
            waiting = asyncio.create_task(chat.wait_for_llama_build(gguf))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            installed["now"] = True  # the wheel is in; the build still writes its tools
        await asyncio.wait_for(waiting, 2)
        installed["now"] = False  # no build under way: nothing to wait for (the chat child says what is missing)
        await asyncio.wait_for(chat.wait_for_llama_build(gguf), 1)

    asyncio.run(scenario())


def test_the_runner_holds_the_lock_logs_the_command_and_records_its_end(tmp_path: Path) -> None:
    folder = tmp_path / "share"
    probe_inside = (
        "import sys; from pathlib import Path; from finetune_studio.llama_build import probe;"
        f" b = probe(Path({str(folder)!r})); print('[3/4] Building C object x.o'); sys.exit(0 if b.running else 5)"
    )
    assert llama_build.run_build([sys.executable, "-c", probe_inside], folder) == 0  # building, seen from within
    done = llama_build.probe(folder)
    assert done.state == "done" and done.exit_code == 0 and done.started_at is not None
    log = (folder / llama_build.LOG_FILE).read_text()
    assert log.startswith("llama.cpp's build, started") and "[3/4] Building C object x.o" in log
    assert "with exit code 0" in log

    assert llama_build.run_build([sys.executable, "-c", "import sys; print('no compiler'); sys.exit(3)"], folder) == 3
    failed = llama_build.probe(folder)
    assert failed.state == "failed" and failed.exit_code == 3
    assert "[3/4]" not in (folder / llama_build.LOG_FILE).read_text()  # each build has a log of its own
    assert llama_build.run_build([str(tmp_path / "no-such-command")], folder) == 127
    assert "could not run it" in (folder / llama_build.LOG_FILE).read_text()


def test_one_build_runs_at_a_time(tmp_path: Path) -> None:
    folder = tmp_path / "share"
    codes: list[int] = []
    with holding_lock(folder):
        second = threading.Thread(target=lambda: codes.append(llama_build.run_build(["true"], folder)))
        second.start()
        time.sleep(0.3)
        assert second.is_alive() and not (folder / llama_build.RECORD_FILE).exists()  # waiting for the lock
    second.join(10)
    assert codes == [0] and llama_build.probe(folder).state == "done"


def test_start_returns_at_once_and_the_build_goes_on_in_the_background(tmp_path: Path) -> None:
    folder = tmp_path / "share"
    go = tmp_path / "go"
    command = [sys.executable, "-c", f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)"]
    begun = time.monotonic()
    started, build = llama_build.start_build(command, folder)
    assert started and build.running and build.log == folder / llama_build.LOG_FILE
    assert time.monotonic() - begun < 5
    again, same = llama_build.start_build(command, folder)  # one at a time: the running one is named
    assert not again and same.running
    go.touch()
    wait_for(lambda: llama_build.probe(folder).state == "done", timeout=30, what="the background build")


def test_the_module_imports_nothing_heavy_and_says_how_it_stands(tmp_path: Path) -> None:
    code = (
        "import sys; import finetune_studio.llama_build as b; b.probe(); b.llama_cpp_wait();"
        "print([m for m in ('llama_cpp', 'torch', 'transformers', 'numpy', 'finetune_studio.export') if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
    env = {**os.environ, llama_build.BUILD_DIR_ENV: str(tmp_path)}
    status = subprocess.run([sys.executable, "-m", "finetune_studio.llama_build", "status"], capture_output=True,
                            text=True, check=True, env=env)
    assert json.loads(status.stdout)["state"] == "absent"
