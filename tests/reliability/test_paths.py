"""Paths: an exposed server takes model, dataset and output paths only under its
allowed roots (`..`, symlinks, `~` and absolute paths resolved first); a job's
output folder is always <data dir>/jobs/<id>."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from finetune_studio.api.app import create_app
from finetune_studio.cli.client import parse_sse
from finetune_studio.config import Settings, get_settings
from finetune_studio.errors import StudioError
from finetune_studio.jobs import service as service_module
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobStore
from tests.helpers.jobs import InstantLauncher, dataset, start_body

TOKEN = "t0ken-for-path-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    paths = {"root": root, "outside": outside, "inside_data": dataset(root), "outside_data": dataset(outside)}
    (root / "models" / "tiny").mkdir(parents=True)
    os.symlink(paths["outside_data"], root / "link.jsonl")  # a file link that leads out
    os.symlink(outside, root / "dirlink")  # a folder link that leads out
    os.symlink(paths["inside_data"], root / "inner-link.jsonl")  # a link that stays in
    return paths


@pytest.fixture
def exposed(tmp_path: Path, layout: dict[str, Path]) -> Iterator[TestClient]:
    settings = Settings(host="0.0.0.0", token=TOKEN, data_dir=tmp_path / "data", allowed_roots=[layout["root"]])
    with TestClient(create_app(settings, launcher=InstantLauncher()), headers=AUTH, base_url="http://127.0.0.1") as client:
        yield client


def _refused(client: TestClient, body: dict[str, Any]) -> str:
    response = client.post("/train/start", json=body)
    assert response.status_code == 403, response.text
    answer = response.json()
    assert answer["status"] == "error" and answer["job_id"] == ""
    assert "outside the folders this server accepts paths from" in answer["error"]
    assert "FINETUNE_STUDIO_ALLOWED_ROOTS" in answer["error"]
    return str(answer["error"])


def test_an_exposed_server_refuses_paths_outside_its_roots(exposed: TestClient, layout: dict[str, Path]) -> None:
    root, outside = layout["root"], layout["outside"]
    inside = start_body(layout["inside_data"])

    assert str(layout["outside_data"]) in _refused(exposed, start_body(layout["outside_data"]))
    assert f"resolves to {layout['outside_data']}" in _refused(exposed, start_body(root / ".." / "outside" / "data.jsonl"))
    assert f"resolves to {layout['outside_data']}" in _refused(exposed, start_body(root / "link.jsonl"))
    assert "resolves to" in _refused(exposed, start_body(root / "dirlink" / "data.jsonl"))
    _refused(exposed, start_body(Path("~/data.jsonl")))
    _refused(exposed, start_body(Path("/etc/passwd")))
    # Whether an outside path exists is not given away: a missing one gets the same answer.
    _refused(exposed, start_body(outside / "no-such-file.jsonl"))
    # Every field that names a path is checked, not only the datasets.
    _refused(exposed, {**inside, "local_eval_datasets": [str(layout["outside_data"])]})
    _refused(exposed, {**inside, "model_name": str(outside)})
    _refused(exposed, {**inside, "model_name": "../../outside/model"})
    _refused(exposed, {**inside, "model_name": str(outside / "model.gguf")})
    _refused(exposed, {**inside, "model_local_path": str(outside)})
    _refused(exposed, {**inside, "hf_dataset": str(outside)})
    _refused(exposed, {**inside, "tensorboard_dir": str(outside / "tb")})
    _refused(exposed, {**inside, "resume_from_checkpoint": str(root / "dirlink" / "checkpoint-2")})
    _refused(exposed, {**inside, "resume_from_checkpoint": "../outside"})
    assert exposed.get("/train/jobs").json()["count"] == 0

    # Inside the roots, links that stay inside and hub ids are fine.
    for body in (
        inside,
        start_body(root / "inner-link.jsonl"),
        start_body(root / "models" / ".." / "data.jsonl"),
        {**inside, "model_name": str(root / "models" / "tiny"), "tensorboard_dir": str(root / "tb")},
        {**inside, "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct", "hf_dataset": "tatsu-lab/alpaca"},
        {**inside, "resume_from_checkpoint": "0123456789ab"},  # an earlier job's id, under the jobs folder
    ):
        response = exposed.post("/train/start", json=body)
        assert response.status_code == 200, response.text


def test_an_exposed_server_without_roots_takes_paths_in_its_data_dir_only(tmp_path: Path, layout: dict[str, Path]) -> None:
    settings = Settings(host="0.0.0.0", token=TOKEN, data_dir=tmp_path / "data")
    with TestClient(create_app(settings, launcher=InstantLauncher()), headers=AUTH, base_url="http://127.0.0.1") as client:
        assert str(settings.data_dir) in _refused(client, start_body(layout["inside_data"]))
        assert client.post("/train/start", json=start_body(dataset(settings.data_dir))).status_code == 200


def test_on_loopback_any_path_may_be_named_unless_roots_are_set(tmp_path: Path, layout: dict[str, Path]) -> None:
    with TestClient(create_app(Settings(data_dir=tmp_path / "a"), launcher=InstantLauncher()), base_url="http://127.0.0.1") as client:
        assert client.post("/train/start", json=start_body(layout["outside_data"])).status_code == 200
    settings = Settings(data_dir=tmp_path / "b", allowed_roots=[layout["root"]])
    with TestClient(create_app(settings, launcher=InstantLauncher()), base_url="http://127.0.0.1") as client:
        _refused(client, start_body(layout["outside_data"]))


def test_paths_that_cannot_be_paths_are_refused_not_crashed_on(exposed: TestClient, layout: dict[str, Path]) -> None:
    for name in ("bad\x00name.jsonl", "x" * 5000 + ".jsonl", str(layout["root"] / ("y" * 300) / "d.jsonl")):
        response = exposed.post("/train/start", json=start_body(Path(layout["root"]) / name))
        assert response.status_code in (400, 403), response.text
        assert response.json()["status"] == "error"


def test_allowed_roots_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}")
    assert get_settings().allowed_roots == [tmp_path / "a", tmp_path / "b"]
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f'["{tmp_path / "c"}"]')
    assert get_settings().allowed_roots == [tmp_path / "c"]


def test_the_output_folder_is_always_data_dir_jobs_id(tmp_path: Path, layout: dict[str, Path]) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    with TestClient(create_app(settings, launcher=InstantLauncher()), base_url="http://127.0.0.1") as client:
        body = start_body(layout["inside_data"], project_name="../../../outside", output_dir="/tmp/evil",
                          tensorboard_dir=str(layout["outside"]))
        job_id = client.post("/train/start", json=body).json()["job_id"]
        assert re.fullmatch(r"[0-9a-f]{12}", job_id)
        first = next(parse_sse(iter(client.get(f"/train/stream/{job_id}").text.splitlines())))
        output_dir = Path(json.loads(first[2])["details"]["output_dir"])
        assert output_dir == settings.data_dir / "jobs" / job_id
        assert output_dir.resolve().is_relative_to(settings.data_dir.resolve())
    assert not (tmp_path / "outside" / "jobs").exists() and not Path("/tmp/evil").exists()


def test_the_service_will_not_create_a_job_folder_outside_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = JobStore(tmp_path / "studio.db")
    service = JobService(store, tmp_path / "jobs")
    monkeypatch.setattr(service_module, "new_job_id", lambda: "../escaped")
    with pytest.raises(StudioError, match="outside"):
        service.create_job({}, "Queued", {})
    store.close()
