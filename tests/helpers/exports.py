"""Exports against a LiveServer whose jobs run the stand-in worker (tests/reliability/
test_export.py, test_input_bounds.py, test_export_build_wait.py, tests/browser/test_export_ui.py)."""

from __future__ import annotations

import json
from pathlib import Path

from finetune_studio.cli.client import StreamEvent, StudioClient
from tests.helpers.jobs import dataset, start_body
from tests.helpers.polling import wait_for
from tests.helpers.servers import LiveServer


def trained_job(server: LiveServer, tmp_path: Path, full: bool = False) -> str:
    """A completed training job with a saved adapter (or model, `full`) and its job.json."""
    with server.client() as client:
        job_id = client.start(start_body(dataset(tmp_path), max_steps=1))
        wait_for(lambda: client.status(job_id)["phase"] == "completed", timeout=60, what="the training job")
    folder = server.settings.jobs_dir / job_id
    result = folder / ("model" if full else "adapter")
    result.mkdir()
    (result / ("config.json" if full else "adapter_config.json")).write_text("{}")
    (folder / "job.json").write_text(json.dumps({"method": "full" if full else "lora"}))
    return job_id


def events_of(client: StudioClient, export_id: str, after: int = 0) -> list[StreamEvent]:
    """Every event of an export, from the export stream."""
    return list(client.stream(export_id, last_event_id=after, prefix="/export"))
