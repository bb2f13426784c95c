"""Fixtures for the reliability tests: the app under a real uvicorn in this process
(tests.helpers.servers.LiveServer), with the stand-in worker (tests/helpers/stand_in_worker.py,
for load and fuzzing), or real children with test hooks (tests/helpers/hooked_child.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from finetune_studio.api.routes import export as export_routes
from finetune_studio.config import Settings
from finetune_studio.supervisor.launcher import LocalProcessLauncher, WorkerLauncher
from tests.helpers.children import STAND_IN_EXPORT_WORKER, STAND_IN_WORKER
from tests.helpers.paths import REPO
from tests.helpers.servers import LiveServer, stopped_at_teardown


@pytest.fixture
def live_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """live_server(launcher=None, **settings) -> a started LiveServer whose jobs run
    tests/helpers/stand_in_worker.py, or what `launcher` starts (hooked_child.HookedLauncher:
    real children with test hooks); its exports run tests/helpers/stand_in_export_worker.py."""
    monkeypatch.chdir(REPO)  # the stand-in worker is imported from the repository
    def make(launcher: Optional[WorkerLauncher] = None, **overrides: Any) -> LiveServer:
        values: dict[str, Any] = {"data_dir": tmp_path / "data", "stop_grace_seconds": 5, "kill_grace_seconds": 1}
        values.update(overrides)
        return LiveServer(
            Settings(**values),
            launcher or LocalProcessLauncher(module=STAND_IN_WORKER),
            export_launcher=LocalProcessLauncher(module=STAND_IN_EXPORT_WORKER),
        )

    yield from stopped_at_teardown(make, LiveServer.__enter__, LiveServer.__exit__)


@pytest.fixture
def tools_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if llama-cpp-python were installed (the stand-in export child needs none of it)."""
    monkeypatch.setattr(export_routes, "gguf_tools_problem", lambda: None)
