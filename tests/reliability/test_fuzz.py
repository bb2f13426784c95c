"""Fuzzing: schemathesis against the server's own OpenAPI schema.

The app runs under a real uvicorn with workers that are no processes (every job it
accepts completes at once), as an exposed server would: token required, paths
limited to its roots. For every operation, schemathesis sends generated requests,
valid and invalid, and checks each answer: no 5xx, a documented status code, a
body that matches the documented schema. Bounded: a fixed number of examples per
operation, no deadline per example, a timeout per request.

One check is left out: `positive_data_acceptance` expects every schema-valid body
to be taken, but a request can be valid field by field and still contradict itself
(dataset_slice_end <= dataset_slice_start, num_epochs and max_steps both 0), which
is a 422 that the JSON schema cannot express.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from finetune_studio.api.app import create_app
from finetune_studio.config import Settings
from tests.reliability.conftest import InstantLauncher, LiveServer, dataset, start_body

TOKEN = "fuzz-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def fuzzed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data_dir = tmp_path_factory.mktemp("fuzz") / "data"
    config = Settings(host="0.0.0.0", token=TOKEN, data_dir=data_dir, stop_grace_seconds=1, kill_grace_seconds=1)
    with LiveServer(config, InstantLauncher()) as server:
        # Some finished jobs, so that not every job id is unknown.
        body = start_body(dataset(data_dir))
        for _ in range(2):
            assert httpx.post(f"{server.url}/train/start", json=body, headers=AUTH).status_code == 200
        yield server


# The schema as the app publishes it at /openapi.json (building the app starts nothing).
schema = schemathesis.openapi.from_dict(create_app(Settings(data_dir=Path("/nonexistent"))).openapi())


@schema.parametrize()
@settings(max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_the_api_answers_every_generated_request_as_documented(case: Any, fuzzed_server: LiveServer) -> None:
    case.call_and_validate(
        base_url=fuzzed_server.url, headers=AUTH, timeout=30, excluded_checks=[schemathesis.checks.positive_data_acceptance]
    )


def test_the_fuzzed_server_is_still_healthy_and_consistent(fuzzed_server: LiveServer) -> None:
    assert httpx.get(f"{fuzzed_server.url}/health").json() == {"status": "ok"}
    jobs = httpx.get(f"{fuzzed_server.url}/train/jobs", headers=AUTH).json()
    assert jobs["count"] == len(jobs["data"]) >= 2
    assert all(job["phase"] in ("completed", "stopped") for job in jobs["data"])
    assert Path(fuzzed_server.settings.db_path).is_file()
