"""What one event may carry: a child's oversized statuses are cut to size by the server,
a step whose loss is not finite is still an event, and a dataset whose faults are
huge or deep ends `dataset_invalid` at its line, with a small status."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from finetune_studio.bounds import MAX_DETAILS_BYTES, MAX_WARNINGS
from finetune_studio.supervisor.launcher import LocalProcessHandle, LocalProcessLauncher
from finetune_studio.wire import MAX_MESSAGE_BYTES
from tests.helpers.children import NAN_WORKER
from tests.helpers.jobs import collect, dataset, phases, start_body
from tests.helpers.loud_worker import LoudLauncher, MiB
from tests.helpers.polling import wait_for


def test_a_childs_oversized_statuses_are_cut_to_size_and_none_is_lost(live_server: Any, tmp_path: Path) -> None:
    server = live_server(LoudLauncher(steps=5, status_bytes=4 * MiB))
    with server.client() as client:
        job_id = client.start(start_body(dataset(tmp_path)))
        wait_for(lambda: (client.progress(job_id) or {}).get("step") == 5, what="the job's steps")
        client.stop(job_id)
        events = collect(client, job_id)
        polled = httpx.get(f"{server.url}/train/status/{job_id}").content

    # Every phase arrived, though each status the child sent was about 16 MB.
    assert phases(events) == ["idle", "loading_model", "loading_dataset", "configuring", "training", "stopped"]
    for event in events[1:5]:
        stored = json.dumps(event.data)
        assert len(stored) < 2 * MAX_DETAILS_BYTES + 20_000  # details, then message and error excerpts
        details = event.data["details"]
        assert len(details["warnings"]) <= MAX_WARNINGS + 1
        assert details["not_a_number"] is None  # NaN: JSON has none
        assert event.data["message"].endswith(f"({4 * MiB:,} characters)")
    assert len(polled) < 2 * MAX_DETAILS_BYTES + 20_000


def test_a_non_finite_loss_is_stored_and_streamed_as_null(live_server: Any, tmp_path: Path) -> None:
    server = live_server(LocalProcessLauncher(module=NAN_WORKER))
    with server.client() as client:
        job_id = client.start(start_body(dataset(tmp_path)))
        wait_for(lambda: client.status(job_id)["phase"] == "completed", what="the job to complete")
        events = collect(client, job_id)
        latest = client.progress(job_id)

    steps = [event.data for event in events if event.kind == "progress"]
    assert [p["step"] for p in steps] == [1, 2, 3, 4]  # no step dropped
    for progress in (steps[0], steps[1], steps[3]):
        assert progress["loss"] is None and progress["loss_finite"] is False and "grad_norm" not in progress
    assert steps[2]["loss"] == 0.5 and "loss_finite" not in steps[2]
    assert latest is not None and (latest["step"], latest["loss"], latest["loss_finite"]) == (4, None, False)
    assert events[-1].data["phase"] == "completed" and events[-1].data["details"]["train_loss"] is None


@pytest.mark.train
def test_huge_and_deep_dataset_rows_end_dataset_invalid_at_their_line(start_server: Any, tmp_path: Path) -> None:
    model = tmp_path / "model"  # the data is read and checked before any weights are
    model.mkdir()
    (model / "config.json").write_text("{}")
    good = json.dumps({"instruction": "Say hi", "output": "Hi"})
    wide = tmp_path / "wide.jsonl"
    wide.write_text(good + "\n" + json.dumps({"instruction": "x", "k" * 20_000_000: "v"}) + "\n")
    deep = tmp_path / "deep.jsonl"
    deep.write_text(good + "\n" + good + "\n" + '{"instruction": ' + "[" * 100_000 + "]" * 100_000 + "}\n")

    server = start_server()
    with server.client() as client:
        jobs = {
            path: client.start({"model_name": str(model), "training_type": "LoRA/QLoRA", "format_type": "alpaca",
                                "local_datasets": [str(path)], "max_steps": 1})
            for path in (wide, deep)
        }
        for path, job_id in jobs.items():
            wait_for(lambda job=job_id: client.status(job)["phase"] == "error", timeout=120, what=f"{path.name} to fail")
        answers = {path: httpx.get(f"{server.url}/train/status/{job_id}") for path, job_id in jobs.items()}

    for path, where, problem in ((wide, "line 2", "missing the column 'output' (found: instruction, kkkk"),
                                 (deep, "line 3", "nested too deeply")):
        status = answers[path].json()
        assert len(answers[path].content) < 5000  # was 20 MB: the key, in every answer
        assert status["details"]["error_code"] == "dataset_invalid"
        assert status["error"].startswith(f"{path}, {where}: {problem}")


def test_a_child_line_nested_past_the_parser_is_skipped_and_the_next_one_read(tmp_path: Path) -> None:
    code = "import json; print('[' * 100_000 + ']' * 100_000); print(json.dumps({'type': 'status', 'phase': 'loading_model'}))"

    async def messages() -> list[dict[str, Any]]:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=MAX_MESSAGE_BYTES
        )
        handle = LocalProcessHandle(process, tmp_path / "worker.log")
        read = [message async for message in handle.messages()]
        await process.wait()
        return read

    assert asyncio.run(messages()) == [{"type": "status", "phase": "loading_model"}]
