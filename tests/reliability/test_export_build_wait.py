"""A GGUF export asked for while llama.cpp builds in the background (scripts/demo.sh starts
that build; finetune_studio/llama_build.py): it is taken, waits queued with the build's
progress in its `idle` messages, and runs once the tools are there; without a build it
is refused (400 `export_tools_missing`) as before. The build is a fake lock, record
and log in tmp_path; the export child is the stand-in (tests/helpers/stand_in_export_worker.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest

from finetune_studio import llama_build
from finetune_studio.api.routes import export as export_routes
from finetune_studio.supervisor import supervisor as supervisor_module
from tests.helpers.exports import events_of, trained_job
from tests.helpers.jobs import phases
from tests.helpers.llama_build import holding_lock, record
from tests.helpers.polling import wait_for


class Tools:
    """gguf_tools_problem as the route and the supervisor see it: missing until `install()`."""

    def __init__(self) -> None:
        self.installed = False

    def problem(self) -> Optional[str]:
        return None if self.installed else "llama-cpp-python is not installed. Run `bash scripts/install.sh`"

    def install(self) -> None:
        self.installed = True


@pytest.fixture
def tools(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Tools:
    found = Tools()
    monkeypatch.setattr(export_routes, "gguf_tools_problem", found.problem)
    monkeypatch.setenv(llama_build.BUILD_DIR_ENV, str(tmp_path / "build"))
    monkeypatch.setattr(supervisor_module, "TOOLS_POLL_SECONDS", 0.05)
    return found


def statuses(client: Any, export_id: str) -> list[dict[str, Any]]:
    return [event.data for event in events_of(client, export_id) if event.kind == "status"]


def test_a_gguf_export_waits_for_the_build_then_runs(live_server: Any, tmp_path: Path, tools: Tools) -> None:
    folder = tmp_path / "build"
    log = record(folder, state="building", pid=1, started_at=time.time() - 120)
    log.write_text("[10/40] Building C object ggml.c.o\n")
    server = live_server()
    job_id = trained_job(server, tmp_path)
    with server.client() as client, holding_lock(folder):
        answer = httpx.post(f"{server.url}/export/start", json={"job_id": job_id, "format": "gguf", "quantization": "q8_0"})
        assert answer.status_code == 200, answer.text
        assert f"waits for llama.cpp's build in the background to finish (log: {log})" in answer.json()["message"]
        export_id = answer.json()["export_id"]
        first = client.export_status(export_id)
        assert first["phase"] == "idle" and first["details"]["waiting_for"] == "llama_build"
        assert first["message"].startswith("Waiting for llama.cpp's build to finish (started 2 min ago; 25% compiled;")
        assert first["details"]["queue_position"] == 1 and first["details"]["build_log"] == str(log)

        # The build goes on: the waiting export says so, and holds no slot (a merged export passes it).
        with open(log, "a") as out:
            out.write("[30/40] Building CXX object llama.cpp.o\n")
        wait_for(lambda: "75% compiled" in client.export_status(export_id)["message"], timeout=10, what="the new progress")
        merged = client.start_export({"job_id": job_id, "format": "merged_16bit"})
        assert phases(events_of(client, merged))[-1] == "completed"
        assert client.export_status(export_id)["phase"] == "idle"

        # The wheel and the scripts are installed; the runner records the end and lets go.
        tools.install()
        record(folder, state="done", pid=1, started_at=time.time() - 600, finished_at=time.time(), exit_code=0)
    with server.client() as client:
        seen = statuses(client, export_id)
    said = [status["phase"] for status in seen]
    assert said[:2] == ["idle", "idle"] and said[-1] == "completed", said
    assert said[said.index("loading_model"):] == ["loading_model", "merging", "converting", "quantizing", "completed"]
    waiting = [status["message"] for status in seen if status["phase"] == "idle"]
    assert any("25% compiled" in m for m in waiting) and any("75% compiled" in m for m in waiting)
    assert len(waiting) == len(set(waiting))  # a new idle status only when there is something new to say
    assert [entry["name"] for entry in seen[-1]["details"]["files"]] == ["model-q8_0.gguf", "Modelfile"]


def test_a_build_that_ends_without_the_tools_ends_the_waiting_export(
    live_server: Any, tmp_path: Path, tools: Tools
) -> None:
    folder = tmp_path / "build"
    log = record(folder, state="building", started_at=time.time())
    server = live_server()
    job_id = trained_job(server, tmp_path)
    with server.client() as client:
        with holding_lock(folder):
            waiting = client.start_export({"job_id": job_id, "format": "lora_gguf"})
            stopped = client.start_export({"job_id": job_id, "format": "gguf"})
            assert client.export_status(waiting)["phase"] == "idle"
            # A waiting export stops like any queued one.
            assert client.stop_export(stopped)["phase"] == "stopped"
            record(folder, state="failed", started_at=time.time(), finished_at=time.time(), exit_code=1)
        final = statuses(client, waiting)[-1]
        assert final["phase"] == "error" and final["details"]["error_code"] == "export_tools_missing"
        assert "llama-cpp-python is not installed" in final["error"]
        assert f"ended with exit code 1; its log: {log}" in final["error"]
        assert phases(events_of(client, stopped)) == ["idle", "stopped"]

        # No build under way now: refused at once, as before, saying how the last build ended.
        refused = httpx.post(f"{server.url}/export/start", json={"job_id": job_id, "format": "gguf"})
        assert refused.status_code == 400 and refused.json()["error_code"] == "export_tools_missing"
        assert f"its log: {log}" in refused.json()["error"]


def test_without_a_build_a_gguf_export_is_refused_as_before(live_server: Any, tmp_path: Path, tools: Tools) -> None:
    server = live_server()
    job_id = trained_job(server, tmp_path)
    for fmt in ("gguf", "lora_gguf"):
        refused = httpx.post(f"{server.url}/export/start", json={"job_id": job_id, "format": fmt})
        assert refused.status_code == 400 and refused.json()["error_code"] == "export_tools_missing"
        assert refused.json()["error"] == tools.problem()
    with server.client() as client:
        assert client.exports() == []
