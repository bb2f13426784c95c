"""Job kinds in the core: migration 2, the export phase table, events and lists per kind,
and the export command's flags."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path
from typing import Any, get_args

import pytest

from finetune_studio.cli.main import GGUF_QUANTIZATIONS, LORA_GGUF_TYPES, build_parser
from finetune_studio.errors import InvalidTransition, JobNotFound
from finetune_studio.jobs.phases import EXPORT_ALLOWED_FROM, EXPORT_PHASES, TERMINAL, can_enter
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import MIGRATIONS, JobStore
from finetune_studio.schemas import ExportPhase, GgufQuantization, LoraGgufType

EXPORT = {"job_id": "trained", "format": "gguf", "quantization": ["q8_0"], "source_dir": "/x", "quantizations": ["q8_0"]}


@pytest.fixture
def service(tmp_path: Path) -> JobService:
    return JobService(JobStore(tmp_path / "studio.db"), tmp_path / "jobs")


def test_migration_2_makes_every_existing_job_a_training_job(tmp_path: Path) -> None:
    path = tmp_path / "studio.db"
    old = sqlite3.connect(path)
    old.executescript(f"BEGIN; {MIGRATIONS[0]}; PRAGMA user_version = 1; COMMIT;")
    status = json.dumps({"job_id": "old", "phase": "completed", "is_training_running": False, "message": "done"})
    old.execute(
        "INSERT INTO jobs (id, seq, created_at, updated_at, phase, status_json, request_json, output_dir, last_event_id)"
        " VALUES ('old', 1, 0, 0, 'completed', ?, '{}', '/out', 1)",
        (status,),
    )
    old.commit()
    old.close()
    store = JobStore(path)
    assert store.get_job("old").kind == "train"
    assert [job.id for job in store.list_jobs()] == ["old"]
    assert store.list_jobs(kind="export") == []
    version = sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0]
    assert version == len(MIGRATIONS) >= 2


def test_the_export_table_matches_its_diagram() -> None:
    assert set(EXPORT_PHASES) == set(get_args(ExportPhase))
    walks = [
        ["idle", "loading_model", "merging", "completed"],  # merged_16bit
        ["idle", "loading_model", "merging", "converting", "quantizing", "completed"],  # gguf of a LoRA job
        ["idle", "loading_model", "converting", "quantizing", "completed"],  # gguf of a full fine-tuning
        ["idle", "loading_model", "converting", "completed"],  # lora_gguf, or gguf f16 only
    ]
    for walk in walks:
        assert all(can_enter(b, a, "export") for a, b in zip(walk, walk[1:], strict=False)), walk
    for current in ("idle", "loading_model", "merging", "converting", "quantizing"):
        assert can_enter("error", current, "export") and can_enter("stopped", current, "export")
    assert not can_enter("quantizing", "merging", "export")  # a GGUF is converted before it is quantized
    assert not can_enter("converting", "quantizing", "export")
    assert not can_enter("completed", "loading_model", "export")
    assert all(not can_enter(target, end, "export") for end in TERMINAL for target in EXPORT_ALLOWED_FROM)
    # The kinds' phases do not mix.
    assert not can_enter("merging", "loading_model", "train")
    assert not can_enter("loading_dataset", "loading_model", "export")


def test_an_export_is_a_job_of_its_own_kind_with_its_own_status_and_folder(service: JobService, tmp_path: Path) -> None:
    train = service.create_job({"model_name": "m"}, "Queued", {})
    export = service.create_job(EXPORT, "Queued", {"format": "gguf"}, kind="export")
    assert export.kind == "export" and export.output_dir == str(tmp_path / "exports" / export.id)
    assert export.status["export_id"] == export.id and export.status["job_id"] == "trained"
    assert export.status["is_running"] is False and "is_training_running" not in export.status
    assert [job.id for job in service.store.list_jobs()] == [train.id]  # the default: training jobs, as before
    assert [job.id for job in service.store.list_jobs(kind="export")] == [export.id]
    assert [job.id for job in service.store.list_jobs(kind=None)] == [export.id, train.id]
    assert [job.id for job in service.store.list_jobs(kind="export", exported_job="trained")] == [export.id]
    assert service.store.list_jobs(kind="export", exported_job=train.id) == []
    assert service.store.queued_job_ids() == [train.id]
    assert service.store.queued_job_ids("export") == [export.id]
    with pytest.raises(JobNotFound):
        service.store.get_job(export.id, kind="train")
    with pytest.raises(JobNotFound):
        service.store.status_json(train.id, kind="export")

    service.transition(export.id, "loading_model", "Loading")
    assert service.store.get_job(export.id).status["details"]["quantizations"] == ["q8_0"]  # every status says what
    with pytest.raises(InvalidTransition, match="loading_dataset"):
        service.transition(export.id, "loading_dataset", "x")  # a training phase: not an export's
    service.transition(export.id, "merging", "Merging")
    assert service.store.get_job(export.id).status["is_running"] is True
    progress = {"stage": "merging", "done": 1, "total": 2, "progress_percent": 10.0}
    assert service.record_progress(export.id, progress, kind="export") is not None
    with pytest.raises(ValueError):
        service.record_progress(export.id, {"step": 1}, kind="export")  # not an ExportProgress
    service.transition(export.id, "completed", "Exported", details={"files": []})
    final = service.store.get_job(export.id)
    assert final.phase == "completed" and "summary" not in final.status["details"]
    events = service.store.events_after(export.id, 0)
    assert [(e.id, e.kind) for e in events] == [(1, "status"), (2, "status"), (3, "status"), (4, "progress"), (5, "status")]
    assert events[-1].is_terminal_status
    assert service.record_progress(export.id, progress, kind="export") is None  # not after the end


def test_the_export_flags_agree_with_the_schema_and_check_names() -> None:
    assert GGUF_QUANTIZATIONS == get_args(GgufQuantization)
    assert LORA_GGUF_TYPES == get_args(LoraGgufType)
    parser = build_parser()
    args = parser.parse_args(["export", "j1", "--gguf", "Q4_K_M, q8_0,q4_k_m", "--lora-gguf"])
    assert args.gguf == ["q4_k_m", "q8_0"] and args.lora_gguf == "f16" and args.out == "."
    from finetune_studio.cli.export_job import export_requests

    assert export_requests(args) == [
        {"job_id": "j1", "format": "gguf", "quantization": ["q4_k_m", "q8_0"]},
        {"job_id": "j1", "format": "lora_gguf", "quantization": ["f16"]},
    ]
    with pytest.raises(SystemExit):
        parser.parse_args(["export", "j1", "--gguf", "q3_k"])
    assert parser.parse_args(["export", "j1", "--merged", "out"]).gguf is None  # --merged as before


def test_the_cli_refuses_a_file_name_that_would_leave_the_folder(tmp_path: Path) -> None:
    from finetune_studio.cli.client import StudioError
    from finetune_studio.cli.export_job import safe_target

    assert safe_target(tmp_path, "merged/model.safetensors") == tmp_path / "merged" / "model.safetensors"
    for name in ("../evil", "/etc/passwd", "a/../../b", ""):
        with pytest.raises(StudioError):
            safe_target(tmp_path, name)


def _export_events() -> list[Any]:
    from finetune_studio.cli.client import StreamEvent

    def status(n: int, phase: str, message: str, **details: Any) -> StreamEvent:
        return StreamEvent(n, "status", {"export_id": "e1", "job_id": "j1", "phase": phase, "message": message,
                                         "is_running": phase not in TERMINAL, "details": details})

    def progress(n: int, stage: str, file: str, done: int, total: int, percent: float) -> StreamEvent:
        return StreamEvent(n, "progress", {"stage": stage, "file": file, "done": done, "total": total,
                                           "progress_percent": percent, "eta_seconds": 12})

    return [
        status(1, "idle", "Queued"),
        status(2, "loading_model", "Loading"),
        status(3, "converting", "Converting to GGUF"),
        progress(4, "converting", "model-f16.gguf", 10, 20, 25.0),
        progress(5, "converting", "model-f16.gguf", 20, 20, 50.0),
        status(6, "quantizing", "Quantizing"),
        progress(7, "quantizing", "model-q8_0.gguf", 20, 20, 100.0),
        status(8, "completed", "Exported", files=[]),
    ]


def test_the_export_views_show_each_stage_and_its_file() -> None:
    from rich.console import Console

    from finetune_studio.cli.export_job import ExportLinesView, ExportLiveView

    plain = io.StringIO()
    view = ExportLinesView(Console(file=plain, width=120), clock=lambda: 0.0, every_seconds=5)
    for event in _export_events():
        view.show(event)
    assert plain.getvalue().splitlines() == [
        "[idle] Queued",
        "[loading_model] Loading",
        "[converting] Converting to GGUF",
        "converting model-f16.gguf 10/20 tensors   25.0%  eta 00:12",  # the first line, then each file's last
        "converting model-f16.gguf 20/20 tensors   50.0%  eta 00:12",
        "[quantizing] Quantizing",
        "quantizing model-q8_0.gguf 20/20 tensors  100.0%  eta 00:12",
        "[completed] Exported",
    ]

    live = io.StringIO()
    bars = ExportLiveView(Console(file=live, width=120, force_terminal=True, color_system=None), clock=lambda: 0.0)
    for event in _export_events():
        bars.show(event)
    text = live.getvalue()
    assert "converting model-f16.gguf" in text and "quantizing model-q8_0.gguf" in text
    assert "20/20" in text and "100.0% of the export" in text and "[completed] Exported" in text
    assert not bars._running  # taken down at the terminal status
