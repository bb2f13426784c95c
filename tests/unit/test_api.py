"""The API in-process with scripted workers (tests/helpers/stand_in_worker.py's scripts:
polite, gated, stubborn, crash): routes, errors, auth and the supervisor's stop
escalation, without the cost of real training."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from finetune_studio.api.app import create_app
from finetune_studio.config import Settings
from finetune_studio.supervisor.launcher import LocalProcessLauncher
from tests.helpers.children import STAND_IN_WORKER
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for


def make_client(tmp_path: Path, **settings: Any) -> TestClient:
    config = Settings(data_dir=tmp_path, stop_grace_seconds=0.5, kill_grace_seconds=0.5, **settings)
    app = create_app(config, launcher=LocalProcessLauncher(module=STAND_IN_WORKER))
    return TestClient(app, base_url="http://127.0.0.1")


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.chdir(REPO)  # the stand-in worker is imported from the repository
    with make_client(tmp_path) as test_client:
        yield test_client


def request(tmp_path: Path, mode: str = "polite") -> dict[str, Any]:
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "x"}\n')
    return {"model_name": "m", "training_type": "LoRA/QLoRA", "format_type": "raw", "local_datasets": [str(data)], "project_name": mode}


def events(client: TestClient, job_id: str) -> list[tuple[str, dict]]:
    import json

    from finetune_studio.cli.client import parse_sse

    response = client.get(f"/train/stream/{job_id}")
    return [(kind, json.loads(data)) for _, kind, data in parse_sse(iter(response.text.splitlines()))]


def wait_phase(client: TestClient, job_id: str, phase: str) -> None:
    wait_for(lambda: client.get(f"/train/status/{job_id}").json()["phase"] == phase, timeout=10, interval=0.025,
             what=f"{job_id} to reach {phase}")


def test_health_and_openapi(client: TestClient) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/train/start", "/train/status/{job_id}", "/train/progress/{job_id}", "/train/stream/{job_id}",
            "/train/stop/{job_id}", "/train/jobs", "/health"} <= set(paths)


def test_unknown_job_is_404_everywhere(client: TestClient) -> None:
    for method, path in [("get", "/train/status/x"), ("get", "/train/progress/x"), ("get", "/train/stream/x"), ("post", "/train/stop/x")]:
        response = getattr(client, method)(path)
        assert response.status_code == 404 and "no job with id 'x'" in response.json()["detail"]


def test_schema_errors_are_422(client: TestClient, tmp_path: Path) -> None:
    response = client.post("/train/start", json={**request(tmp_path), "learning_rate": "fast"})
    assert response.status_code == 422
    assert "learning_rate must be a number" in response.text


def test_progress_is_204_until_a_step_then_the_latest(client: TestClient, tmp_path: Path) -> None:
    running = client.post("/train/start", json=request(tmp_path, "gated")).json()["job_id"]
    queued = client.post("/train/start", json=request(tmp_path)).json()["job_id"]
    wait_phase(client, running, "training")  # the gated worker holds before its first step
    for job_id in (queued, running):  # queued, and training with no step done yet
        response = client.get(f"/train/progress/{job_id}")
        assert (response.status_code, response.content) == (204, b""), (job_id, response.text)
    (tmp_path / "jobs" / running / "go").touch()

    def first_step() -> Any:
        answer = client.get(f"/train/progress/{running}")
        return answer if answer.status_code != 204 else None

    response = wait_for(first_step, timeout=10, interval=0.025, what="the first step's progress")
    assert response.status_code == 200 and response.json()["step"] == 1, response.text
    client.post(f"/train/stop/{queued}")
    client.post(f"/train/stop/{running}")
    wait_phase(client, running, "stopped")


def test_queued_jobs_report_their_place_and_the_list_is_newest_first(client: TestClient, tmp_path: Path) -> None:
    running = client.post("/train/start", json=request(tmp_path, "gated")).json()["job_id"]
    wait_phase(client, running, "training")  # held before its first step: the others wait
    queued = [client.post("/train/start", json=request(tmp_path)).json()["job_id"] for _ in range(2)]
    listed = client.get("/train/jobs").json()["data"]
    assert [s["job_id"] for s in listed] == [*queued[::-1], running]
    for position, job_id in enumerate(queued, start=1):
        for status in (client.get(f"/train/status/{job_id}").json(), listed[2 - position]):
            assert status["phase"] == "idle" and status["details"]["queue_position"] == position
            assert status["message"] == f"Queued (position {position})"
    for job_id in (*queued, running):
        client.post(f"/train/stop/{job_id}")
    wait_phase(client, running, "stopped")


def test_a_polite_worker_stops_when_asked(client: TestClient, tmp_path: Path) -> None:
    job_id = client.post("/train/start", json=request(tmp_path)).json()["job_id"]
    wait_phase(client, job_id, "training")
    assert client.post(f"/train/stop/{job_id}").json()["details"]["stop_requested"] is True
    final = events(client, job_id)[-1][1]
    assert final["phase"] == "stopped" and final["details"]["adapter_dir"] == "none"
    assert client.post(f"/train/stop/{job_id}").status_code == 409


def test_a_stubborn_worker_is_killed_after_the_grace_and_ends_stopped(client: TestClient, tmp_path: Path) -> None:
    job_id = client.post("/train/start", json=request(tmp_path, "stubborn")).json()["job_id"]
    wait_phase(client, job_id, "training")
    client.post(f"/train/stop/{job_id}")
    final = events(client, job_id)[-1][1]
    assert final["phase"] == "stopped"
    assert "killed by SIGKILL" in final["message"] and "grace period" in final["message"]


def test_a_crashing_worker_ends_in_worker_died_and_the_queue_moves_on(client: TestClient, tmp_path: Path) -> None:
    crash = client.post("/train/start", json=request(tmp_path, "crash")).json()["job_id"]
    after = client.post("/train/start", json=request(tmp_path)).json()["job_id"]
    final = events(client, crash)[-1][1]
    assert final["phase"] == "error" and final["details"]["error_code"] == "worker_died"
    assert final["details"]["exit_code"] == 3 and "exited with code 3" in final["error"]
    wait_phase(client, after, "training")
    client.post(f"/train/stop/{after}")
    wait_phase(client, after, "stopped")


def test_the_queue_limit_refuses_with_429(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    with make_client(tmp_path, max_queued_jobs=1) as client:
        first = client.post("/train/start", json=request(tmp_path, "stubborn")).json()["job_id"]
        wait_phase(client, first, "training")  # running jobs do not count as queued
        assert client.post("/train/start", json=request(tmp_path)).status_code == 200
        refused = client.post("/train/start", json=request(tmp_path))
        assert refused.status_code == 429
        assert refused.json()["status"] == "error" and "queue is full" in refused.json()["error"]


def test_a_token_guards_every_route_but_health(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    with make_client(tmp_path, token="s3cret-api-token-1") as client:
        assert client.get("/health").status_code == 200
        for method, path in [("get", "/train/jobs"), ("get", "/train/status/x"), ("get", "/train/stream/x"),
                             ("post", "/train/stop/x"), ("post", "/train/start")]:
            assert getattr(client, method)(path).status_code == 401
            assert getattr(client, method)(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/train/jobs", headers={"Authorization": "Bearer s3cret-api-token-1"}).json() == {"data": [], "count": 0}


def test_the_server_never_imports_torch_or_transformers(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from fastapi.testclient import TestClient\n"
        "from finetune_studio.api.app import create_app\n"
        "from finetune_studio.cli.main import main\n"
        "from finetune_studio.config import Settings\n"
        f"with TestClient(create_app(Settings(data_dir={str(tmp_path)!r})), base_url='http://127.0.0.1') as c:\n"
        "    c.get('/train/jobs')\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'peft', 'trl', 'datasets') if m in sys.modules)\n"
        "print(heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_wrong_method_on_an_api_path_is_405_naming_the_right_one(client: TestClient) -> None:
    # The web UI is mounted at /, but it never answers for the API's paths.
    for method, path, allowed in [("OPTIONS", "/train/start", "POST"), ("GET", "/train/start", "POST"),
                                  ("DELETE", "/train/jobs", "GET"), ("PUT", "/health", "GET, HEAD")]:
        response = client.request(method, path)
        assert response.status_code == 405 and response.headers["allow"] == allowed
    assert client.get("/train/no-such-route").status_code == 404
    assert client.get("/").headers["content-type"].startswith("text/html")


def test_bodies_that_are_not_json_text_are_422(client: TestClient) -> None:
    for raw in (b"\xff\xfe\x00", b"{\"model_name\": ", b"[]"):
        response = client.post("/train/start", content=raw, headers={"content-type": "application/json"})
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["loc"][0] == "body"


def test_an_event_id_past_sqlite_integers_is_422(client: TestClient, tmp_path: Path) -> None:
    job_id = client.post("/train/start", json=request(tmp_path)).json()["job_id"]
    for headers, query in (({"Last-Event-ID": str(2**63)}, ""), ({}, f"?last_event_id={2**64}")):
        assert client.get(f"/train/stream/{job_id}{query}", headers=headers).status_code == 422
    client.post(f"/train/stop/{job_id}")


def test_a_wrong_method_names_every_method_its_path_takes(client: TestClient) -> None:
    """A 405's Allow lists every documented method of the path, also where each method is a
    route of its own (GET, PATCH and DELETE /train/jobs/{id}), as HTTP asks."""
    import re

    paths = client.app.openapi()["paths"]  # type: ignore[attr-defined]
    for template, operations in paths.items():
        documented = {method.upper() for method in operations}
        path = re.sub(r"\{[^}]+\}", "0", template)
        wrong = next(m for m in ("PUT", "PATCH", "DELETE", "OPTIONS", "POST") if m not in documented)
        response = client.request(wrong, path)
        assert response.status_code == 405, (wrong, path, response.status_code)
        allowed = {m.strip() for m in response.headers["allow"].split(",")}
        assert allowed == documented, (path, allowed, documented)
