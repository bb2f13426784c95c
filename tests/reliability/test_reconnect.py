"""Reconnecting: a client that comes back with Last-Event-ID gets exactly the rest.

Over real HTTP (the app under uvicorn in this process), with the stand-in worker:
what is checked is the server's stream, the same for any worker. The worker holds
before its first step until the test lets it go, so the first connection reads
live events and drops while the job is still running.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from finetune_studio.cli.client import parse_sse
from tests.helpers.jobs import collect, dataset, phases, start_body

SEED_ORDER = ["idle", "loading_model", "loading_dataset", "configuring", "training", "completed"]


def test_last_event_id_resumes_with_exactly_the_rest(
    live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    go = tmp_path / "go"
    monkeypatch.setenv("FAKE_WORKER_GO", str(go))
    server = live_server()
    with server.client() as client:
        job_id = client.start(start_body(dataset(tmp_path), max_steps=5))
        # Read a few events live, drop the connection, and resume from the last id seen.
        first = []
        for event in client.stream(job_id):
            first.append(event)
            if len(first) == 3:
                break
        assert client.status(job_id)["phase"] not in ("completed", "error", "stopped")
        go.touch()
        rest = collect(client, job_id, last_event_id=first[-1].id)
        assert [e.id for e in first + rest] == list(range(1, len(first) + len(rest) + 1))
        assert phases(first + rest) == SEED_ORDER
        assert [e.data["step"] for e in rest if e.kind == "progress"] == [1, 2, 3, 4, 5]
        everything = collect(client, job_id)
        assert [(e.id, e.kind, e.data) for e in everything] == [(e.id, e.kind, e.data) for e in first + rest]

    for cut in (0, 4, len(everything) - 1, len(everything)):
        # The header and the query parameter mean the same.
        by_header = httpx.get(f"{server.url}/train/stream/{job_id}", headers={"Last-Event-ID": str(cut)})
        by_query = httpx.get(f"{server.url}/train/stream/{job_id}?last_event_id={cut}")
        for response in (by_header, by_query):
            assert response.headers["content-type"].startswith("text/event-stream")
            ids = [int(i) for i, _, _ in parse_sse(iter(response.text.splitlines()))]
            assert ids == [e.id for e in everything if e.id > cut]
