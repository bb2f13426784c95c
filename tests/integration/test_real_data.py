"""A public-dump-like ShareGPT file through a real server: by default the job names its
bad rows and the option; with `bad_rows: "skip"` it trains on the rest and says how many."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.dumps import DUMP_ROWS, Dump
from tests.helpers.jobs import collect, job_request

pytestmark = pytest.mark.train


def test_a_dump_fails_naming_its_bad_rows_then_trains_with_skip(start_server: Any, tiny_model: Path, tmp_path: Path) -> None:
    dump = Dump().write(tmp_path)
    server = start_server()
    body = job_request(tiny_model, local_datasets=[str(dump)], format_type="sharegpt", max_steps=2, max_seq_length=64)
    with server.client() as client:
        refused = client.start(body)
        skipped = client.start({**body, "bad_rows": "skip"})
        failed = collect(client, refused)[-1].data
        trained = collect(client, skipped)[-1].data

    assert failed["phase"] == "error" and failed["details"]["error_code"] == "dataset_invalid"
    assert f"80 of {DUMP_ROWS:,} rows are bad" in failed["error"] and 'bad_rows: "skip"' in failed["error"]
    assert failed["details"]["dataset_problems"]["unknown_role"]["count"] == 20

    assert trained["phase"] == "completed", trained
    dataset = trained["details"]["dataset"]
    assert (dataset["rows"], dataset["skipped_rows"], dataset["dropped_rows"]) == (9_720, 80, 200)
    assert any("skipped 80 bad rows" in warning for warning in trained["details"]["warnings"])
