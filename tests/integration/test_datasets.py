"""Datasets through a real server and real training children, on the tiny model.

Every file type and shape trains to `completed`. Bad data ends its job in `error`
with `dataset_invalid` and the file, the line or row, and the problem, and the
server keeps serving: two files of the bad corpus (tests/data/bad, described in
tests/data/corpus.py) go through here, one located by line and one by row with a
custom_format_mapping; every file of it is checked in-process, with the same
error text, by tests/unit/test_data.py::test_the_bad_corpus. Jobs are queued
together and run one after another on one server, since each costs a child's
start-up.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from finetune_studio.child.datasets import HUB_UNREACHABLE
from tests.data.corpus import BAD_FILES, GOOD
from tests.helpers.jobs import collect, job_request, phases

# The bad files that go through a real server (all of them are read in-process).
END_TO_END = ("bad_json.jsonl", "mapped_column_missing.parquet")

pytestmark = pytest.mark.train

FAILED_ON_DATA = ["idle", "loading_model", "loading_dataset", "error"]


def closed_port_url() -> str:
    """An endpoint nothing listens on: connecting fails at once, as with no network."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_bad_data_ends_in_error_naming_file_and_line_and_the_server_keeps_serving(
    start_server: Any, tiny_model: Path
) -> None:
    server = start_server(env={"HF_ENDPOINT": closed_port_url(), "HF_HUB_OFFLINE": "", "HF_DATASETS_OFFLINE": ""})
    with server.client() as client:
        jobs = [
            (bad, client.start(job_request(tiny_model, local_datasets=[str(bad.path)], **bad.fields)))
            for bad in BAD_FILES
            if bad.name in END_TO_END
        ]
        assert len(jobs) == len(END_TO_END)
        hub_job = client.start(job_request(tiny_model, local_datasets=[], hf_dataset="someone/some-dataset"))

        for bad, job_id in jobs:
            events = collect(client, job_id)
            final = events[-1].data
            assert phases(events) == FAILED_ON_DATA, (bad.name, final)
            assert final["details"]["error_code"] == "dataset_invalid", (bad.name, final)
            location = f"{bad.path}, {bad.where}" if bad.where else str(bad.path)
            assert f"{location}: " in final["error"], (bad.name, final["error"])
            assert bad.problem in final["error"], (bad.name, final["error"])

        events = collect(client, hub_job)
        final = events[-1].data
        assert phases(events) == FAILED_ON_DATA, final
        assert final["details"]["error_code"] == "dataset_not_found"
        assert final["error"].startswith(f"{HUB_UNREACHABLE} (hf_dataset 'someone/some-dataset': ")

        # A dataset path that does not exist is refused before it is queued.
        missing = str(GOOD / "no-such-file.jsonl")
        refused = httpx.post(f"{server.url}/train/start", json=job_request(tiny_model, local_datasets=[missing]))
        assert refused.status_code == 400
        assert refused.json()["status"] == "error" and missing in refused.json()["error"]

        assert client.health() == {"status": "ok"}
        good = client.start(job_request(tiny_model, max_steps=2))
        assert phases(collect(client, good))[-1] == "completed"


@pytest.fixture
def saved_dataset(tmp_path: Path) -> Path:
    """A DatasetDict saved with save_to_disk: train (8 ShareGPT rows) and test (2)."""
    from datasets import Dataset, DatasetDict

    def row(i: int) -> dict[str, Any]:
        return {
            "conversations": [
                {"from": "human", "value": f"What is {i} plus {i}?"},
                {"from": "gpt", "value": f"{2 * i}."},
            ]
        }

    folder = tmp_path / "saved"
    DatasetDict(
        train=Dataset.from_list([row(i) for i in range(8)]), test=Dataset.from_list([row(10), row(11)])
    ).save_to_disk(str(folder))
    return folder


def test_each_file_type_and_shape_trains_to_completed(server: Any, tiny_model: Path, saved_dataset: Path) -> None:
    # Three jobs cover every file type and shape: sources of different conversational
    # shapes can share a job; custom_format_mapping and raw text need their own.
    cases: list[tuple[str, dict[str, Any], str, int]] = [
        # (what, request fields, the shape the job reports, training rows)
        (
            "hf_dataset (a saved folder, eval_split) + jsonl + json + csv; every shape detected; sliced",
            {
                "hf_dataset": str(saved_dataset),
                "eval_split": "test",
                "local_datasets": [str(GOOD / "chatml.jsonl"), str(GOOD / "sharegpt.json"), str(GOOD / "alpaca.csv")],
                "format_type": "auto",
                "dataset_slice_start": 2,
                "dataset_slice_end": 12,
            },
            "sharegpt+chatml+alpaca",
            10,  # rows 2..11 of 8 + 4 + 3 + 4
        ),
        (
            "parquet, custom_format_mapping",
            {
                "local_datasets": [str(GOOD / "qa.parquet")],
                "format_type": "auto",
                "custom_format_mapping": {"system": "system", "question": "user", "answer": "assistant"},
            },
            "custom",
            4,
        ),
        ("txt, raw", {"local_datasets": [str(GOOD / "notes.txt")], "format_type": "raw"}, "raw", 3),
    ]
    with server.client() as client:
        jobs = [
            (what, client.start(job_request(tiny_model, max_steps=2, **fields)), shape, rows)
            for what, fields, shape, rows in cases
        ]
        for what, job_id, shape, rows in jobs:
            events = collect(client, job_id)
            final = events[-1].data
            assert final["phase"] == "completed", (what, final)
            assert [e.data["step"] for e in events if e.kind == "progress"] == [1, 2], what
            dataset = final["details"]["dataset"]
            assert (dataset["format"], dataset["rows"]) == (shape, rows), (what, dataset)
