"""The server's side of dataset inspections (supervisor/inspector.py), with real child processes:
a child that hangs is killed at the timeout, one that crashes is reported with its log,
the slots are bounded (one more is refused at once), and a cancelled request kills its child."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from finetune_studio.config import Settings
from finetune_studio.errors import InspectionBusy, InspectionFailed
from finetune_studio.supervisor.inspector import Inspector
from tests.helpers.children import STAND_IN_INSPECT_CHILD
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for
from tests.helpers.processes import pid_exists


def inspector(tmp_path: Path, module: str = STAND_IN_INSPECT_CHILD, **settings: Any) -> Inspector:
    return Inspector(Settings(data_dir=tmp_path, **settings), module=module)


def pid_in(path: Path) -> int:
    return int(wait_for(lambda: path.is_file() and path.read_text(), timeout=60, what=f"the child's pid in {path}"))


@pytest.fixture(autouse=True)
def _at_the_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # `python -m tests.helpers...` finds the stand-in from here


def test_an_answer_is_read_past_whatever_else_the_child_printed(tmp_path: Path) -> None:
    body = {"act": "answer", "pid_file": str(tmp_path / "pid"), "inspection": {"ok": True, "rows": 3}}
    assert asyncio.run(inspector(tmp_path).inspect(body)) == {"ok": True, "rows": 3}
    assert inspector(tmp_path).running == 0


def test_a_hanging_child_is_killed_at_the_timeout(tmp_path: Path) -> None:
    body = {"act": "hang", "pid_file": str(tmp_path / "pid")}
    with pytest.raises(InspectionFailed, match=r"took longer than 1 s and was stopped") as caught:
        asyncio.run(inspector(tmp_path, inspect_timeout_seconds=1).inspect(body))
    assert caught.value.status_code == 503
    assert not pid_exists(pid_in(tmp_path / "pid"))


def test_a_crashing_child_is_reported_with_its_exit_and_log(tmp_path: Path) -> None:
    body = {"act": "crash", "pid_file": str(tmp_path / "pid")}
    with pytest.raises(InspectionFailed) as caught:
        asyncio.run(inspector(tmp_path).inspect(body))
    text = str(caught.value)
    assert "the dataset inspection's process exited with code 3 before it answered" in text
    assert "stand-in: the tokenizer exploded" in text and str(tmp_path / "inspect.log") in text


def test_the_real_child_says_what_broke(tmp_path: Path) -> None:
    with pytest.raises(InspectionFailed, match="the dataset inspection failed: ValidationError"):
        asyncio.run(inspector(tmp_path, module="finetune_studio.inspection.child").inspect({}))


def test_one_inspection_past_the_slots_is_refused_and_a_cancelled_one_kills_its_child(tmp_path: Path) -> None:
    async def scenario() -> int:
        runner = inspector(tmp_path, max_concurrent_inspections=1)
        first = asyncio.create_task(runner.inspect({"act": "hang", "pid_file": str(tmp_path / "pid")}))
        pid = await asyncio.to_thread(pid_in, tmp_path / "pid")
        with pytest.raises(InspectionBusy, match="1 dataset inspections are running") as caught:
            await runner.inspect({"act": "answer", "pid_file": str(tmp_path / "other"), "inspection": {}})
        assert caught.value.status_code == 429
        first.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await first
        assert runner.running == 0
        return pid

    assert not pid_exists(asyncio.run(scenario()))


def test_stopping_the_server_kills_a_running_inspection(tmp_path: Path) -> None:
    """A request still waiting on its child when the server stops is not cancelled first:
    `shutdown` kills the child, and the waiting request answers InspectionFailed."""
    body = {"act": "hang", "pid_file": str(tmp_path / "pid")}

    async def scenario() -> None:
        runner = inspector(tmp_path, inspect_timeout_seconds=600)
        request = asyncio.ensure_future(runner.inspect(body))
        pid = await asyncio.to_thread(pid_in, tmp_path / "pid")
        await runner.shutdown()
        assert not pid_exists(pid)
        with pytest.raises(InspectionFailed):
            await request
        assert runner.running == 0 and not runner.processes

    asyncio.run(scenario())
