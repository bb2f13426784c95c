"""A full disk under the server's writers (issue 24, item 6): uploads, starting a job,
the event log; and a training child whose disk fills mid-checkpoint (item 7).

The disk is a 16 MiB tmpfs filled to its last byte (`small_disk`, tests/conftest.py;
skipped where it cannot be mounted), with the server's data dir on it; the database
alone is filled anywhere with SQLite's `PRAGMA max_page_count`, set on the server's
own connection. Every write that fails so answers 507 with what to free and
`x-should-retry: false` (the openai SDK retries any 5xx otherwise, and would send a
512 MiB upload three times), leaves nothing half-written, and the server goes on
answering; once there is room again, the same request goes through.
(The supervision path, children started while writes fail, is test_store_faults.py's.)
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from finetune_studio.api.app import create_app
from finetune_studio.api.deps import Studio
from finetune_studio.config import Settings
from finetune_studio.jobs.service import make_status
from finetune_studio.jobs.store import JobStore
from tests.helpers.disks import SmallDisk
from tests.helpers.hooked_child import HookedLauncher, Hooks
from tests.helpers.jobs import InstantLauncher, collect, dataset, job_request, phases, start_body
from tests.helpers.polling import wait_for

ROW = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
ADVICE = "Free space on the disk that holds the data directory"


def upload(client: TestClient, size: int = 2 * 1024 * 1024) -> Any:
    """A fine-tune file of about `size` bytes."""
    line = (json.dumps(ROW) + "\n").encode()
    return client.post(
        "/v1/files", files={"file": ("train.jsonl", line * (size // len(line) + 1))}, data={"purpose": "fine-tune"}
    )


def studio_of(client: TestClient) -> Studio:
    return client.app.state.studio  # type: ignore[attr-defined,no-any-return]


def assert_disk_full(answer: Any, openai: bool, advice: str = ADVICE) -> str:
    assert answer.status_code == 507, answer.text
    assert answer.headers["x-should-retry"] == "false"
    body = answer.json()
    if openai:
        assert set(body) == {"error"} and body["error"]["code"] == "disk_full", body
        assert body["error"]["type"] == "server_error"
        message = str(body["error"]["message"])
    else:
        assert body["error_code"] == "disk_full", body
        message = str(body["detail"])
    assert message.startswith("The disk is full (") and advice in message, message
    return message


def stored_files(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir()) if folder.exists() else []


@pytest.fixture
def full_disk_client(small_disk: SmallDisk) -> Iterator[tuple[TestClient, SmallDisk]]:
    settings = Settings(data_dir=small_disk.path / "data")
    with TestClient(create_app(settings, launcher=InstantLauncher()), base_url="http://127.0.0.1") as client:
        yield client, small_disk
    small_disk.free()


def test_an_upload_to_a_full_disk_is_507_saying_what_to_free_and_leaves_nothing(
    full_disk_client: tuple[TestClient, SmallDisk],
) -> None:
    client, disk = full_disk_client
    files_dir = studio_of(client).settings.files_dir
    kept = upload(client, 4096)
    assert kept.status_code == 200, kept.text
    disk.fill()

    assert_disk_full(upload(client), openai=True)
    # Nothing of the refused file is kept: no partial, no file without its row.
    assert stored_files(files_dir) == [f"{kept.json()['id']}.jsonl"]
    assert [item["id"] for item in client.get("/v1/files").json()["data"]] == [kept.json()["id"]]
    health = client.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "degraded", health.text
    assert health.json()["store"]["error_code"] == "disk_full"

    disk.free()
    again = upload(client)
    assert again.status_code == 200, again.text
    assert client.get("/health").json() == {"status": "ok"}
    assert len(stored_files(files_dir)) == 2


def test_an_upload_whose_temporary_folder_is_on_a_full_disk_is_507_naming_it(
    small_disk: SmallDisk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The multipart parser spools a form past 1 MiB to the temporary folder before any
    route runs: a full disk there was a 400 "the body is not JSON text"."""
    monkeypatch.setattr(tempfile, "tempdir", str(small_disk.path))
    with TestClient(create_app(Settings(data_dir=tmp_path / "data"), launcher=InstantLauncher()),
                    base_url="http://127.0.0.1") as client:
        small_disk.fill()
        message = assert_disk_full(upload(client), openai=True, advice="Free space on the disk that holds it")
        assert f"could not be spooled to the server's temporary folder ({small_disk.path})" in message
        assert client.get("/v1/files").json()["data"] == []
        small_disk.free()
        assert upload(client).status_code == 200


def test_starting_a_job_on_a_full_disk_is_507_and_the_server_still_answers(
    full_disk_client: tuple[TestClient, SmallDisk], tmp_path: Path
) -> None:
    client, disk = full_disk_client
    body = start_body(dataset(tmp_path), project_name="p" * 256 * 1024)  # more than the database's free pages
    disk.fill()
    assert_disk_full(client.post("/train/start", json=body), openai=False)
    assert client.get("/health").status_code == 200
    assert client.get("/train/jobs").json()["count"] == 0
    disk.free()
    assert client.post("/train/start", json=body).status_code == 200


def test_the_event_log_on_a_full_disk_fails_as_storage_failed_and_writes_again_once_freed(small_disk: SmallDisk) -> None:
    from finetune_studio.errors import StorageFailed

    store = JobStore(small_disk.path / "studio.db")
    try:
        status = make_status("abc123", "idle", "Queued", details={})
        store.create_job("abc123", {"model_name": "m"}, str(small_disk.path / "jobs" / "abc123"), status)
        for phase in ("loading_model", "loading_dataset", "configuring", "training"):
            store.transition("abc123", make_status("abc123", phase, phase, details={}))
        small_disk.fill()
        with pytest.raises(StorageFailed) as failed:
            for step in range(1, 20_000):  # the WAL's room already on disk is used up first
                store.append_progress("abc123", {"step": step, "loss": 1.0, "note": "x" * 2000})
        assert failed.value.error_code == "disk_full" and failed.value.status_code == 507
        assert store.health.fault is not None and store.health.fault.error_code == "disk_full"
        small_disk.free()
        assert store.append_progress("abc123", {"step": 99_999, "loss": 1.0}) is not None
        assert store.health.fault is None
    finally:
        store.close()


def fill_database(client: TestClient) -> sqlite3.Connection:
    """The server's database, full: SQLite may grow it by no page (max_page_count set on
    the job store's own connection), and a filler table has taken its free pages."""
    db: sqlite3.Connection = studio_of(client).service.store._db  # noqa: SLF001 - the test reaches in on purpose
    db.execute("CREATE TABLE test_filler (x BLOB)")
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(sqlite3.OperationalError, match="full"):
        for _ in range(10_000):
            db.execute("INSERT INTO test_filler VALUES (zeroblob(512))")
    return db


def test_starting_a_job_on_a_full_database_is_507_and_health_still_answers(tmp_path: Path) -> None:
    body = start_body(dataset(tmp_path), project_name="p" * 64 * 1024)  # a row of more than one page
    with TestClient(create_app(Settings(data_dir=tmp_path / "data"), launcher=InstantLauncher()),
                    base_url="http://127.0.0.1") as client:
        db = fill_database(client)
        message = assert_disk_full(client.post("/train/start", json=body), openai=False)
        assert "database or disk is full" in message
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "degraded"
        assert client.get("/train/jobs").json()["count"] == 0

        db.execute("PRAGMA max_page_count = 1073741823")
        db.execute("DROP TABLE test_filler")
        assert client.post("/train/start", json=body).status_code == 200
        assert client.get("/health").json() == {"status": "ok"}


def test_a_failed_jobs_details_name_its_last_complete_checkpoint_and_its_partial_one_is_removed(tmp_path: Path) -> None:
    """The training child's end on any error (unit: the details it reports)."""
    from finetune_studio.training.child import failed_details

    folder = tmp_path / "job"
    for step, whole in ((2, True), (4, False), (3, True)):
        checkpoint = folder / "checkpoints" / f"checkpoint-{step}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "adapter_model.safetensors").write_bytes(b"\0" * 64)
        if whole:
            (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step}))

    class Recipe:
        output_dir = folder

        def details(self) -> dict[str, Any]:
            return {"output_dir": str(folder), "steps": 4}

    details, kept = failed_details(Recipe(), "disk_full")  # type: ignore[arg-type]
    assert details["error_code"] == "disk_full" and details["steps"] == 4
    assert details["last_checkpoint"] == str(folder / "checkpoints" / "checkpoint-3") and kept is not None
    assert sorted(path.name for path in (folder / "checkpoints").iterdir()) == ["checkpoint-2", "checkpoint-3"]
    empty, none = failed_details(type("Bare", (), {"output_dir": tmp_path / "none", "details": lambda self: {}})(), "training_failed")
    assert "last_checkpoint" not in empty and none is None


@pytest.mark.train
def test_a_job_whose_disk_fills_mid_checkpoint_names_the_last_complete_one_and_removes_the_half_written_one(
    live_server: Any, tiny_model: Path
) -> None:
    hooks = Hooks(fault="disk_full", fault_at_step=4, fault_mid_checkpoint=True)
    server = live_server(HookedLauncher(hooks))
    with server.client() as client:
        job_id = client.start(job_request(tiny_model, max_steps=6, save_steps=2))
        wait_for(lambda: client.status(job_id)["phase"] == "error", timeout=300, what="the job to fail")
        events = collect(client, job_id)
    end = events[-1].data
    assert phases(events)[-2:] == ["training", "error"]
    assert end["details"]["error_code"] == "disk_full"
    checkpoints = server.settings.jobs_dir / job_id / "checkpoints"
    assert end["details"]["last_checkpoint"] == str(checkpoints / "checkpoint-2")
    assert "The last complete checkpoint is kept (checkpoint-2)" in end["error"], end["error"]
    assert sorted(path.name for path in checkpoints.glob("checkpoint-*")) == ["checkpoint-2"]  # checkpoint-4 is gone
