"""Exports as jobs (docs/API.md, Export), server side, with a stand-in export child
(tests/helpers/stand_in_export_worker.py) that speaks the export wire and writes
small files: phases, events and replay, its own slot, stop, failures, the download
with HTTP Range, and every refusal. llama.cpp itself is tested with the real child
(EXPORT-CHILD's tests); these tests are about the machinery around it.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from finetune_studio.api.app import create_app
from finetune_studio.api.routes import export as export_routes
from finetune_studio.atomic import partial_path
from finetune_studio.cli.client import StudioError
from finetune_studio.config import Settings
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobStore
from finetune_studio.supervisor.launcher import WorkerExit
from finetune_studio.wire import WorkerSpec
from tests.helpers.exports import events_of, trained_job
from tests.helpers.jobs import InstantHandle, InstantLauncher, dataset, phases, start_body
from tests.helpers.polling import wait_for
from tests.helpers.processes import alive

TOKEN = "export-test-token-0123456789"


def files_in(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())


def test_a_gguf_export_runs_as_a_job_streams_replays_and_lists_its_files(
    live_server: Any, tmp_path: Path, tools_present: None
) -> None:
    server = live_server()
    job_id = trained_job(server, tmp_path)
    with server.client() as client:
        export_id = client.start_export({"job_id": job_id, "format": "gguf", "quantization": ["q4_k_m", "q8_0"]})
        events = events_of(client, export_id)
        assert phases(events) == ["idle", "loading_model", "merging", "converting", "quantizing", "completed"]
        assert [event.id for event in events] == list(range(1, len(events) + 1))
        progress = [event.data for event in events if event.kind == "progress"]
        assert {p["stage"] for p in progress} == {"merging", "converting", "quantizing"}
        assert [p["progress_percent"] for p in progress] == sorted(p["progress_percent"] for p in progress)

        # The same events again, and exactly those after a given id.
        assert [(e.id, e.kind, e.data) for e in events_of(client, export_id)] == [(e.id, e.kind, e.data) for e in events]
        assert [e.id for e in events_of(client, export_id, after=4)] == [e.id for e in events[4:]]

        final = client.export_status(export_id)
        assert final["export_id"] == export_id and final["job_id"] == job_id
        assert final["phase"] == "completed" and final["is_running"] is False
        listed = {entry["name"]: entry for entry in final["details"]["files"]}
        assert set(listed) == {"model-q4_k_m.gguf", "model-q8_0.gguf", "Modelfile"}
        folder = server.settings.exports_dir / export_id
        # Only the listed files (and the child's log) are left: no merge, no f16 step, no partial.
        assert files_in(folder) == sorted([*listed, "worker.log"])
        for name, entry in listed.items():
            data = (folder / name).read_bytes()
            assert entry["bytes"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()

        # Exports and training jobs are listed apart.
        assert [e["export_id"] for e in client.exports()] == [export_id]
        assert [e["export_id"] for e in client.exports(job_id=job_id)] == [export_id]
        assert client.exports(job_id="somebody-else") == []
        assert [j["job_id"] for j in client.jobs()] == [job_id]


def test_every_format_takes_only_its_stages(live_server: Any, tmp_path: Path, tools_present: None) -> None:
    server = live_server(max_concurrent_exports=3)
    job_id = trained_job(server, tmp_path)
    expected = {
        "merged_16bit": ["idle", "loading_model", "merging", "completed"],
        "lora_gguf": ["idle", "loading_model", "converting", "completed"],
    }
    with server.client() as client:
        started = {fmt: client.start_export({"job_id": job_id, "format": fmt}) for fmt in expected}
        for fmt, export_id in started.items():
            assert phases(events_of(client, export_id)) == expected[fmt]
        merged = client.export_status(started["merged_16bit"])["details"]["files"]
        assert sorted(entry["name"] for entry in merged) == ["merged/config.json", "merged/model.safetensors"]
        lora = client.export_status(started["lora_gguf"])["details"]["files"]
        assert [(entry["name"], entry["quantization"]) for entry in lora] == [("adapter-f16.gguf", "f16")]
        assert [e["export_id"] for e in client.exports()] == list(reversed(started.values()))  # newest first


def test_a_download_resumes_byte_exact_with_range(live_server: Any, tmp_path: Path, tools_present: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_EXPORT_CHUNKS", "8")
    server = live_server()
    job_id = trained_job(server, tmp_path)
    with server.client() as client:
        export_id = client.start_export({"job_id": job_id, "format": "gguf", "quantization": "q8_0"})
        assert phases(events_of(client, export_id))[-1] == "completed"
    name = "model-q8_0.gguf"
    whole = (server.settings.exports_dir / export_id / name).read_bytes()
    url = f"{server.url}/export/download/{export_id}/{name}"
    with httpx.Client() as http:
        full = http.get(url)
        assert full.status_code == 200 and full.content == whole
        assert full.headers["accept-ranges"] == "bytes"
        assert f'filename="{name}"' in full.headers["content-disposition"]
        first = http.get(url, headers={"Range": "bytes=0-9999"})
        assert first.status_code == 206 and first.headers["content-range"] == f"bytes 0-9999/{len(whole)}"
        rest = http.get(url, headers={"Range": "bytes=10000-"})
        assert rest.status_code == 206 and first.content + rest.content == whole
        beyond = http.get(url, headers={"Range": f"bytes={len(whole)}-"})
        assert beyond.status_code == 416 and beyond.headers["content-range"] == f"bytes */{len(whole)}"

    # The client resumes a download that broke off: it asks only for the rest.
    target = tmp_path / "out" / name
    target.parent.mkdir()
    partial_path(target).write_bytes(whole[:5000])  # as a broken download leaves it
    fetched: list[int] = []
    with server.client() as client:
        client.download(export_id, name, target, on_bytes=fetched.append)
        listed = {entry["name"]: entry["sha256"] for entry in client.export_status(export_id)["details"]["files"]}
    assert target.read_bytes() == whole and sum(fetched) == len(whole) - 5000
    assert hashlib.sha256(target.read_bytes()).hexdigest() == listed[name]
    assert not partial_path(target).exists()


def test_only_listed_files_of_a_completed_export_are_served(
    live_server: Any, tmp_path: Path, tools_present: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    go = tmp_path / "go"
    monkeypatch.setenv("FAKE_EXPORT_GO", str(go))
    server = live_server()
    job_id = trained_job(server, tmp_path)
    with server.client() as client, httpx.Client(base_url=server.url) as http:
        export_id = client.start_export({"job_id": job_id, "format": "gguf", "quantization": "q8_0"})
        wait_for(lambda: client.export_status(export_id)["phase"] == "loading_model", timeout=30, what="the export to start")
        running = http.get(f"/export/download/{export_id}/model-q8_0.gguf")
        assert running.status_code == 409 and "once it has completed" in running.json()["detail"]
        go.touch()
        assert phases(events_of(client, export_id))[-1] == "completed"
        folder = server.settings.exports_dir / export_id
        (folder / ".model-q8_0.gguf.partial").write_bytes(b"half")  # as a child killed mid-write leaves it
        (folder / "secret.txt").write_text("not an export file")
        for name in (".model-q8_0.gguf.partial", "secret.txt", "worker.log", "../../studio.db", "%2e%2e/studio.db"):
            answer = http.get(f"/export/download/{export_id}/{name}")
            assert answer.status_code == 404, name
        missing = http.get(f"/export/download/{export_id}/nope.gguf")
        assert "its files: model-q8_0.gguf, Modelfile" in missing.json()["detail"]
        assert http.get(f"/export/download/{job_id}/model-q8_0.gguf").status_code == 404  # a training id is no export
        assert http.get(f"/export/download/{export_id}/Modelfile").text.startswith("FROM ./model-q8_0.gguf")


def test_refusals_say_what_is_wrong(live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = live_server()
    job_id = trained_job(server, tmp_path)
    full_job = trained_job(server, tmp_path, full=True)
    go = tmp_path / "go"
    monkeypatch.setenv("FAKE_WORKER_GO", str(go))
    with server.client() as client, httpx.Client(base_url=server.url) as http:
        waiting = client.start(start_body(dataset(tmp_path), max_steps=1))
        wait_for(lambda: client.status(waiting)["phase"] == "configuring", timeout=30, what="the training job to wait")

        unknown = http.post("/export/start", json={"job_id": "nope", "format": "merged_16bit"})
        assert unknown.status_code == 404 and unknown.json()["status"] == "error"
        assert "no training job with id 'nope'" in unknown.json()["error"]

        running = http.post("/export/start", json={"job_id": waiting, "format": "merged_16bit"})
        assert running.status_code == 409
        assert "is configuring: only a completed job can be exported" in running.json()["error"]
        assert "stopped after it saved its adapter" in running.json()["error"]

        bad = http.post("/export/start", json={"job_id": job_id, "format": "gguf", "quantization": ["q4_k_m", "q3_k"]})
        assert bad.status_code == 422
        message = bad.json()["detail"][0]["msg"]
        assert "'q3_k'" in message and "f16, bf16, q8_0, q4_k_m, q5_k_m, q6_k" in message

        monkeypatch.setattr(export_routes, "gguf_tools_problem", lambda: "llama.cpp missing: pip install 'finetune-studio[gguf]'")
        for fmt in ("gguf", "lora_gguf"):
            missing = http.post("/export/start", json={"job_id": job_id, "format": fmt})
            assert missing.status_code == 400 and missing.json()["error_code"] == "export_tools_missing"
            assert "pip install 'finetune-studio[gguf]'" in missing.json()["error"]
        # merged_16bit needs no llama.cpp.
        assert http.post("/export/start", json={"job_id": job_id, "format": "merged_16bit"}).status_code == 200

        monkeypatch.setattr(export_routes, "gguf_tools_problem", lambda: None)
        lora = http.post("/export/start", json={"job_id": full_job, "format": "lora_gguf"})
        assert lora.status_code == 400 and "full fine-tuning: it has no adapter" in lora.json()["error"]

        # Kinds do not mix: an export id is no training job and the other way round.
        assert http.get(f"/export/status/{job_id}").status_code == 404
        assert http.post(f"/export/stop/{job_id}").status_code == 404
        assert http.get(f"/export/stream/{job_id}").status_code == 404
        export_id = client.exports()[0]["export_id"]
        assert http.get(f"/train/status/{export_id}").status_code == 404
        assert http.post(f"/train/stop/{export_id}").status_code == 404
        go.touch()


def test_the_real_tools_check_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from finetune_studio.export import tools

    monkeypatch.setenv(tools.TOOLS_ENV, str(tmp_path / "no-tools-here"))  # as if the converter scripts were missing
    problem = export_routes.gguf_tools_problem()
    assert problem is not None and "pip install 'finetune-studio[gguf]'" in problem
    assert str(tmp_path / "no-tools-here") in problem


def test_an_export_does_not_wait_behind_training(live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = live_server()
    job_id = trained_job(server, tmp_path)
    go = tmp_path / "go"
    monkeypatch.setenv("FAKE_WORKER_GO", str(go))
    with server.client() as client:
        training = client.start(start_body(dataset(tmp_path), max_steps=1))  # holds the one training slot
        wait_for(lambda: client.status(training)["phase"] == "configuring", timeout=30, what="the training job to hold")
        export_id = client.start_export({"job_id": job_id, "format": "merged_16bit"})
        assert phases(events_of(client, export_id))[-1] == "completed"
        assert client.status(training)["phase"] == "configuring"
        go.touch()
        wait_for(lambda: client.status(training)["phase"] == "completed", timeout=30, what="the training job")


def test_stop_ends_stopped_and_leaves_no_partial_file(
    live_server: Any, tmp_path: Path, tools_present: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_EXPORT_STEP_S", "0.2")
    monkeypatch.setenv("FAKE_EXPORT_CHUNKS", "50")
    server = live_server()
    job_id = trained_job(server, tmp_path)
    with server.client() as client:
        running = client.start_export({"job_id": job_id, "format": "gguf", "quantization": "q8_0"})
        queued = client.start_export({"job_id": job_id, "format": "merged_16bit"})
        assert client.export_status(queued)["details"]["queue_position"] == 1
        folder = server.settings.exports_dir / running
        wait_for(lambda: any(p.name.endswith(".partial") for p in folder.rglob("*")), timeout=30, what="a partial file")

        answer = client.stop_export(running)
        assert answer["details"]["stop_requested"] is True and "removes its unfinished files" in answer["message"]
        assert phases(events_of(client, running))[-1] == "stopped"
        assert files_in(folder) == ["worker.log"]

        # Stopped while queued, an export never starts; a finished one cannot be stopped.
        stopped = client.stop_export(queued)
        assert stopped["phase"] == "stopped" and stopped["message"] == "Stopped before it started"
        assert phases(events_of(client, queued)) == ["idle", "stopped"]
        assert not (server.settings.exports_dir / queued).exists()
        with pytest.raises(StudioError, match="409.*already ended in stopped"):
            client.stop_export(queued)


def test_a_failed_or_dead_export_leaves_nothing_behind(
    live_server: Any, tmp_path: Path, tools_present: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = live_server()
    job_id = trained_job(server, tmp_path)
    with server.client() as client:
        monkeypatch.setenv("FAKE_EXPORT_FAIL", "disk_full")
        failed = client.start_export({"job_id": job_id, "format": "gguf", "quantization": "q8_0"})
        final = events_of(client, failed)[-1].data
        assert final["phase"] == "error" and final["details"]["error_code"] == "disk_full"
        monkeypatch.delenv("FAKE_EXPORT_FAIL")

        monkeypatch.setenv("FAKE_EXPORT_DIE", "1")
        died = client.start_export({"job_id": job_id, "format": "gguf", "quantization": "q8_0"})
        final = events_of(client, died)[-1].data
        assert final["phase"] == "error" and final["details"]["error_code"] == "worker_died"
        assert final["message"] == "Export failed" and "The export process exited with code 3" in final["error"]
        wait_for(lambda: files_in(server.settings.exports_dir / died) == ["worker.log"], timeout=10, what="the cleanup")
        assert files_in(server.settings.exports_dir / failed) == ["worker.log"]


def test_every_export_route_wants_the_token(live_server: Any, tmp_path: Path) -> None:
    server = live_server(token=TOKEN)
    with httpx.Client(base_url=server.url) as http:
        for method, path in [
            ("POST", "/export/start"),
            ("GET", "/export/status/x"),
            ("GET", "/export/stream/x"),
            ("POST", "/export/stop/x"),
            ("GET", "/export/jobs"),
            ("GET", "/export/download/x/model.gguf"),
        ]:
            answer = http.request(method, path)
            assert answer.status_code == 401, path
        authorized = http.get("/export/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert authorized.status_code == 200 and authorized.json() == {"data": [], "count": 0}


class InstantExportHandle(InstantHandle):
    """An export child that is no process: it merges and completes at once."""

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        for phase in ("loading_model", "merging"):
            yield {"type": "status", "phase": phase, "message": phase, "details": {}}
        yield {"type": "status", "phase": "completed", "message": "done", "details": {"files": []}}

    async def wait(self) -> WorkerExit:
        return WorkerExit(0)


class InstantExportLauncher:
    async def launch(self, spec: WorkerSpec) -> InstantExportHandle:
        return InstantExportHandle(spec)


def _export_left_running(service: JobService, source: Path, phase_path: list[str], **request: Any) -> str:
    body = {"job_id": "trained", "format": "gguf", "quantization": ["q8_0"], "source_dir": str(source),
            "quantizations": ["q8_0"], **request}
    export = service.create_job(body, "Queued", {}, kind="export")
    for phase in phase_path:
        service.transition(export.id, phase, phase)
    return export.id


def test_a_restart_ends_a_running_export_and_removes_its_partial_files(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    settings.jobs_dir.mkdir(parents=True)
    store = JobStore(settings.db_path)
    service = JobService(store, settings.jobs_dir, exports_dir=settings.exports_dir)
    crashed = _export_left_running(service, tmp_path, ["loading_model", "merging", "converting"])
    stopping = _export_left_running(service, tmp_path, ["loading_model"])
    queued = _export_left_running(service, tmp_path, [], format="merged_16bit", quantization=None, quantizations=[])
    store.set_stop_requested(stopping)
    for export_id in (crashed, stopping):
        folder = settings.exports_dir / export_id
        (folder / "merged").mkdir(parents=True)
        (folder / "merged" / "model.safetensors").write_bytes(b"merged")
        (folder / ".model-q8_0.gguf.partial").write_bytes(b"half")
        (folder / "worker.log").write_text("the child's log\n")
    # The crashed export's child, as the kernel shows it: the export module and its id on the command line.
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "finetune_studio.export.child", "--job-id", crashed]
    )
    try:
        store.set_worker_pid(crashed, orphan.pid)
        store.close()
        with TestClient(create_app(settings, launcher=InstantLauncher(), export_launcher=InstantExportLauncher()), base_url="http://127.0.0.1") as client:
            assert orphan.wait(timeout=10) == -9
            final = client.get(f"/export/status/{crashed}").json()
            assert final["phase"] == "error" and final["details"]["error_code"] == "server_restarted"
            assert "was in converting; its unfinished files were removed" in final["error"]
            assert client.get(f"/export/status/{stopping}").json()["phase"] == "stopped"
            for export_id in (crashed, stopping):
                assert files_in(settings.exports_dir / export_id) == ["worker.log"]
            # A queued export stays queued and runs (here, a launcher whose worker completes at once).
            wait_for(lambda: client.get(f"/export/status/{queued}").json()["phase"] == "completed", timeout=10, what="the queue")
    finally:
        if alive(orphan.pid):
            orphan.kill()
        orphan.wait()


def run_cli(*argv: str) -> tuple[int, str, str]:
    from finetune_studio.cli.export_job import run_export_job
    from finetune_studio.cli.main import build_parser

    out, err = io.StringIO(), io.StringIO()
    code = run_export_job(build_parser().parse_args(["export", *argv]), out, err)
    return code, out.getvalue(), err.getvalue()


def test_the_cli_exports_follows_each_stage_and_downloads_the_files(
    live_server: Any, tmp_path: Path, tools_present: None
) -> None:
    server = live_server()
    job_id = trained_job(server, tmp_path)
    out = tmp_path / "gguf"
    code, stdout, stderr = run_cli(job_id, "--gguf", "q4_k_m,q8_0", "--lora-gguf", "--out", str(out),
                                   "--server", server.url, "--no-start-server")
    assert code == 0, stderr
    assert sorted(p.name for p in out.iterdir()) == ["Modelfile", "adapter-f16.gguf", "model-q4_k_m.gguf", "model-q8_0.gguf"]
    with server.client() as client:
        exports = client.exports()
    for export in exports:
        for entry in export["details"]["files"]:
            assert hashlib.sha256((out / entry["name"]).read_bytes()).hexdigest() == entry["sha256"]
    # Plain lines (not a terminal): each stage, its file's progress, then what was written and the Ollama line.
    for line in ["[merging] merging", "[converting] converting", "[quantizing] quantizing",
                 "quantizing model-q8_0.gguf 4/4 tensors", f"wrote {out / 'model-q4_k_m.gguf'}",
                 f"ollama create finetune-{job_id} -f {out / 'Modelfile'}"]:
        assert line in stdout, line


def test_the_cli_says_why_an_export_was_refused_or_failed(
    live_server: Any, tmp_path: Path, tools_present: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = live_server()
    job_id = trained_job(server, tmp_path)
    code, _, stderr = run_cli("nope", "--gguf", "q8_0", "--server", server.url, "--no-start-server")
    assert code == 2 and "404: no training job with id 'nope'" in stderr
    monkeypatch.setenv("FAKE_EXPORT_FAIL", "disk_full")
    code, stdout, stderr = run_cli(job_id, "--gguf", "q8_0", "--out", str(tmp_path / "o"), "--server", server.url,
                                   "--output-json", "--no-start-server")
    assert code == 1 and "ended error (disk_full): fake failure: disk_full" in stderr
    lines = [json.loads(line) for line in stdout.splitlines()]
    assert lines[-1] == {"event": "summary", "exit_code": 1, "files": []}
    assert [line["data"]["phase"] for line in lines if line["event"] == "status"][-1] == "error"
    assert not (tmp_path / "o").exists()
