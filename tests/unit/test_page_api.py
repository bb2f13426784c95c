"""The API the page's issue (19) added: GET /system, GET/PATCH/DELETE
/train/jobs/{id}, and the 400 that names `model_name` when a local model path
does not exist."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest
from fastapi.testclient import TestClient

from finetune_studio.api.app import create_app
from finetune_studio.api.deps import Studio
from finetune_studio.api.routes import system
from finetune_studio.config import Settings
from tests.helpers.jobs import InstantLauncher, dataset, finished_job, start_body

TOKEN = "page-api-token-31c9"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(data_dir=tmp_path / "data"), launcher=InstantLauncher()), base_url="http://127.0.0.1") as client:
        yield client


def studio_of(client: TestClient) -> Studio:
    return client.app.state.studio  # type: ignore[attr-defined,no-any-return]


def test_system_describes_the_machine_without_importing_torch(client: TestClient) -> None:
    answer = client.get("/system")
    assert answer.status_code == 200
    info = answer.json()
    assert info["cpu_count"] >= 1 and info["memory_bytes"] > 0
    assert set(info["versions"]) == {"torch", "transformers", "peft", "trl", "bitsandbytes"}
    # The CUDA build of torch comes from its version label or requirements, never from importing it.
    torch = info["versions"]["torch"]
    if torch and "+cpu" in torch:
        assert info["torch_cuda"] is None and info["cuda"] is False
    # What the form asks for here: 4-bit loading and the 8-bit optimizer only with CUDA and bitsandbytes.
    usable = info["cuda"] and info["bitsandbytes"]
    assert info["recommended"] == {"load_in_4bit": usable, "optim": "adamw_8bit" if usable else "adamw_torch"}
    assert client.get("/system").json() == info  # found once, then kept


def test_system_reads_the_driver_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    driver = tmp_path / "nvidia"
    (driver / "gpus" / "0000:01:00.0").mkdir(parents=True)
    (driver / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 2024\n")
    (driver / "gpus" / "0000:01:00.0" / "information").write_text("Model: \t\t NVIDIA H200\nIRQ: 42\n")
    monkeypatch.setattr(system, "NVIDIA_DRIVER", driver)
    monkeypatch.setattr(system, "_torch_cuda", lambda: "cu128")
    info = system.detect()
    assert info.nvidia_driver == "550.54.15"
    assert [gpu.name for gpu in info.gpus] == ["NVIDIA H200"]
    assert info.cuda is True
    assert info.recommended.load_in_4bit is info.bitsandbytes


def test_system_says_whether_jobs_run_on_a_ray_cluster(client: TestClient, tmp_path: Path) -> None:
    assert client.get("/system").json()["ray"] is None  # jobs train here: the page offers no cluster fields
    # The default storage is a folder under the data directory: nothing travels through a URI.
    settings = Settings(data_dir=tmp_path / "ray-data", ray_address="ray://head:10001", ray_max_failures=3)
    with TestClient(create_app(settings, launcher=InstantLauncher()), base_url="http://127.0.0.1") as ray_client:
        assert ray_client.get("/system").json()["ray"] == {"address": "ray://head:10001", "max_failures": 3, "storage": None}


@pytest.mark.parametrize(
    ("path", "shown"),
    [
        ("s3://AKIAKEY:s3cr3t@bucket/runs?endpoint_override=http%3A%2F%2F127.0.0.1%3A9000&secret_key=x", "s3://bucket/runs"),
        ("gs://bucket/studio/", "gs://bucket/studio/"),
        ("file:///mnt/shared/ray", None),
        ("/mnt/shared/ray", None),
    ],
)
def test_systems_storage_is_shown_without_keys_or_query(tmp_path: Path, path: str, shown: Optional[str]) -> None:
    settings = Settings(data_dir=tmp_path / "data", ray_address="auto", ray_storage_path=path)
    with TestClient(create_app(settings, launcher=InstantLauncher()), base_url="http://127.0.0.1") as client:
        answer = client.get("/system")
    assert answer.status_code == 200
    assert answer.json()["ray"]["storage"] == shown
    assert "s3cr3t" not in answer.text and "AKIAKEY" not in answer.text and "endpoint_override" not in answer.text


def test_system_wants_the_token(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", token=TOKEN)
    with TestClient(create_app(settings, launcher=InstantLauncher()), base_url="http://127.0.0.1") as client:
        assert client.get("/system").status_code == 401
        assert client.get("/system", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert client.delete("/train/jobs/abc").status_code == 401
        assert client.patch("/train/jobs/abc", json={"project_name": "x"}).status_code == 401


def test_a_missing_local_model_is_refused_naming_the_field(client: TestClient, tmp_path: Path) -> None:
    data = dataset(tmp_path)
    missing = tmp_path / "models" / "not-there"
    answer = client.post("/train/start", json=start_body(data, model_name=str(missing)))
    assert answer.status_code == 400
    body = answer.json()
    assert body["status"] == "error" and body["field"] == "model_name"
    assert body["error"].startswith("model_name: ") and str(missing) in body["error"] and "does not exist" in body["error"]
    local = client.post("/train/start", json=start_body(data, model_name="org/m", model_local_path=str(missing)))
    assert local.status_code == 400 and local.json()["field"] == "model_local_path"
    gone = client.post("/train/start", json=start_body(data, local_datasets=[str(tmp_path / "nope.jsonl")]))
    assert gone.status_code == 400 and gone.json()["field"] == "local_datasets"
    assert client.get("/train/jobs").json()["count"] == 0
    # A hub id is the child's to load (it fails fast offline); a model that exists passes.
    missing.mkdir(parents=True)
    assert client.post("/train/start", json=start_body(data, model_name=str(missing))).status_code == 200
    assert client.post("/train/start", json=start_body(data, model_name="some-org/some-model")).status_code == 200


def test_a_job_shows_its_request_and_can_be_renamed(client: TestClient, tmp_path: Path) -> None:
    job_id = finished_job(client, start_body(dataset(tmp_path), project_name="first", hf_token="hf-secret-1"))
    detail = client.get(f"/train/jobs/{job_id}").json()
    assert detail["request"]["project_name"] == "first" and detail["request"]["max_steps"] == 2
    assert "hf_token" not in detail["request"] and detail["withheld_secrets"] == ["hf_token"]
    assert "withheld_secrets" not in detail["request"] and "queued_warnings" not in detail["request"]

    renamed = client.patch(f"/train/jobs/{job_id}", json={"project_name": "  second  "})
    assert renamed.status_code == 200 and renamed.json()["request"]["project_name"] == "second"
    listed = client.get("/train/jobs").json()["data"][0]
    assert listed["details"]["project_name"] == "second"
    assert client.get(f"/train/status/{job_id}").json()["phase"] == "completed"  # a rename is no phase change
    cleared = client.patch(f"/train/jobs/{job_id}", json={"project_name": ""})
    assert cleared.json()["request"]["project_name"] is None
    assert client.patch(f"/train/jobs/{job_id}", json={"phase": "idle"}).status_code == 422
    assert client.patch("/train/jobs/000000000000", json={"project_name": "x"}).status_code == 404
    assert client.get("/train/jobs/000000000000").status_code == 404


def test_delete_removes_a_finished_job_its_events_files_and_exports(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    studio = studio_of(client)
    unloads: list[bool] = []

    async def unload() -> None:
        unloads.append(True)

    monkeypatch.setattr(studio.inference, "unload", unload)
    data = dataset(tmp_path)
    job_id = finished_job(client, start_body(data))
    kept = finished_job(client, start_body(data))
    folder = studio.settings.jobs_dir / job_id
    (folder / "adapter").mkdir(parents=True, exist_ok=True)
    (folder / "adapter" / "adapter_model.safetensors").write_bytes(b"\0" * 8)
    export = studio.service.create_job({"job_id": job_id}, "Queued", {}, kind="export")
    Path(export.output_dir).mkdir(parents=True)
    (Path(export.output_dir) / "model.gguf").write_bytes(b"GGUF")

    # An export of it still queued: nothing is deleted.
    refused = client.delete(f"/train/jobs/{job_id}")
    assert refused.status_code == 409 and export.id in refused.json()["detail"]
    assert folder.is_dir() and client.get(f"/train/jobs/{job_id}").status_code == 200

    studio.service.transition(export.id, "error", "failed", error="test")
    before = len(unloads)  # each training job's start unloads chat too
    answer = client.delete(f"/train/jobs/{job_id}")
    assert answer.status_code == 204, answer.text
    assert not folder.exists() and not Path(export.output_dir).exists()
    assert client.get(f"/train/status/{job_id}").status_code == 404
    assert client.get(f"/train/stream/{job_id}").status_code == 404
    assert studio.service.store.events_after(job_id, 0) == []
    assert studio.service.store.list_jobs(kind="export", exported_job=job_id) == []
    assert [status["job_id"] for status in client.get("/train/jobs").json()["data"]] == [kept]
    assert len(unloads) == before + 1, "chat was not told to let go of the deleted model"
    assert client.delete(f"/train/jobs/{job_id}").status_code == 404


def test_delete_refuses_a_queued_job(client: TestClient, tmp_path: Path) -> None:
    studio = studio_of(client)
    queued = studio.service.create_job(start_body(dataset(tmp_path)), "Queued", {})  # never submitted: stays queued
    answer = client.delete(f"/train/jobs/{queued.id}")
    assert answer.status_code == 409
    assert "stop it first" in answer.json()["detail"]
    assert client.get(f"/train/jobs/{queued.id}").status_code == 200
