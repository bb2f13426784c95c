"""Load: many start requests at once, and many clients on one stream.

The 50-job and 200-client cases run the app under a real uvicorn with the stand-in
worker (tests/helpers/stand_in_worker.py), so they measure the server, not torch;
a smaller case runs real training children."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

from finetune_studio.cli.client import parse_sse
from tests.helpers.jobs import collect, dataset, job_request, phases, start_body
from tests.helpers.polling import wait_for
from tests.helpers.servers import ServerProcess

SEED_ORDER = ["idle", "loading_model", "loading_dataset", "configuring", "training", "completed"]
TERMINAL = {"completed", "error", "stopped"}


async def _start_all(url: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        return list(await asyncio.gather(*(client.post("/train/start", json=body) for body in bodies)))


def run_windows(db_path: Path) -> dict[str, tuple[float, float]]:
    """Each job's (first running event, terminal event) times, read from the event log."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT job_id, data, created_at FROM events WHERE kind = 'status' ORDER BY job_id, id").fetchall()
    finally:
        db.close()
    windows: dict[str, list[float]] = {}
    for job_id, data, created_at in rows:
        phase = json.loads(data)["phase"]
        if phase == "loading_model":
            windows[job_id] = [created_at]
        elif phase in TERMINAL and job_id in windows:
            windows[job_id].append(created_at)
    return {job_id: (times[0], times[-1]) for job_id, times in windows.items()}


def assert_one_at_a_time(windows: dict[str, tuple[float, float]]) -> None:
    ordered = sorted(windows.values())
    for (_, end), (start, _) in itertools.pairwise(ordered):
        assert start >= end, f"two jobs ran at once: one ended at {end}, the next started at {start}"


def test_fifty_simultaneous_starts_give_fifty_jobs_that_run_one_at_a_time(
    live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    worker_log = tmp_path / "workers.log"
    monkeypatch.setenv("FAKE_WORKER_LOG", str(worker_log))
    server = live_server()
    data = dataset(tmp_path)
    bodies = [start_body(data, max_steps=2, random_seed=i) for i in range(50)]

    with caplog.at_level(logging.WARNING):
        responses = asyncio.run(_start_all(server.url, bodies))
        assert [r.status_code for r in responses] == [200] * 50, [r.text for r in responses if r.status_code != 200]
        job_ids = [r.json()["job_id"] for r in responses]
        assert len(set(job_ids)) == 50

        with httpx.Client(base_url=server.url, timeout=30) as client:

            def all_ended() -> bool:
                statuses = client.get("/train/jobs").json()["data"]
                return sum(s["phase"] in TERMINAL for s in statuses) == 50

            wait_for(all_ended, timeout=300, interval=0.2, what="50 jobs to end")
            statuses = client.get("/train/jobs").json()
            assert statuses["count"] == 50
            assert {s["phase"] for s in statuses["data"]} == {"completed"}
            created_order = [s["job_id"] for s in reversed(statuses["data"])]  # the list is newest first
            for job_id in job_ids:
                events = list(parse_sse(iter(client.get(f"/train/stream/{job_id}").text.splitlines())))
                assert [int(i) for i, _, _ in events] == list(range(1, len(events) + 1))
                assert [json.loads(d)["phase"] for _, kind, d in events if kind == "status"] == SEED_ORDER

    # One at a time, first in first out: each worker ended before the next began.
    lines = worker_log.read_text().split()
    pairs = list(zip(lines[0::2], lines[1::2], strict=True))
    assert [(verb, job) for verb, job in pairs[0::2]] == [("start", j) for j in created_order]
    assert [(verb, job) for verb, job in pairs[1::2]] == [("end", j) for j in created_order]
    assert_one_at_a_time(run_windows(server.settings.db_path))
    problems = [r.getMessage() for r in caplog.records if "locked" in r.getMessage() or r.levelno >= logging.ERROR]
    assert problems == []


async def _follow(url: str, job_id: str, connected: asyncio.Event | None, client: httpx.AsyncClient) -> list[int]:
    ids: list[int] = []
    async with client.stream("GET", f"{url}/train/stream/{job_id}") as response:
        assert response.status_code == 200
        lines: list[str] = []
        async for line in response.aiter_lines():
            if connected is not None and not connected.is_set():
                connected.set()
            lines.append(line)
        for event_id, _, _ in parse_sse(iter(lines)):
            ids.append(int(event_id or 0))
    return ids


async def _two_hundred_watchers(url: str, job_id: str, go: Path) -> list[list[int]]:
    limits = httpx.Limits(max_connections=250, max_keepalive_connections=0)
    timeout = httpx.Timeout(60, read=120)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        # Half connect before the first step, and wait there; half join while it trains.
        connected = [asyncio.Event() for _ in range(100)]
        early = [asyncio.create_task(_follow(url, job_id, flag, client)) for flag in connected]
        await asyncio.wait_for(asyncio.gather(*(flag.wait() for flag in connected)), timeout=120)
        go.touch()
        late = []
        for _ in range(100):
            late.append(asyncio.create_task(_follow(url, job_id, None, client)))
            await asyncio.sleep(0.005)
        return list(await asyncio.wait_for(asyncio.gather(*early, *late), timeout=240))


def test_two_hundred_clients_on_one_stream_all_receive_every_event(
    live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    go = tmp_path / "go"
    monkeypatch.setenv("FAKE_WORKER_GO", str(go))
    monkeypatch.setenv("FAKE_WORKER_STEP_S", "0.02")
    server = live_server()
    job_id = httpx.post(f"{server.url}/train/start", json=start_body(dataset(tmp_path), max_steps=40)).json()["job_id"]

    received = asyncio.run(_two_hundred_watchers(server.url, job_id, go))

    everything = [int(i) for i, _, _ in parse_sse(iter(httpx.get(f"{server.url}/train/stream/{job_id}").text.splitlines()))]
    assert len(everything) == 1 + 4 + 40 + 1  # idle, four phases, 40 steps, completed
    assert everything == list(range(1, len(everything) + 1))
    assert len(received) == 200
    assert all(ids == everything for ids in received)


@pytest.mark.train
def test_simultaneous_real_jobs_are_distinct_and_train_one_at_a_time(server: ServerProcess, tiny_model: Path) -> None:
    bodies = [job_request(tiny_model, max_steps=1, random_seed=i) for i in range(2)]
    responses = asyncio.run(_start_all(server.url, bodies))
    assert [r.status_code for r in responses] == [200] * 2
    job_ids = [r.json()["job_id"] for r in responses]
    assert len(set(job_ids)) == 2
    with server.client() as client:
        wait_for(
            lambda: all(client.status(j)["phase"] in TERMINAL for j in job_ids), timeout=300, interval=0.2, what="both jobs"
        )
        pids = set()
        for job_id in job_ids:
            events = collect(client, job_id)
            assert phases(events) == SEED_ORDER
            pids.add(events[-1].data["details"]["worker_pid"])
        assert len(pids) == 2  # each job trained in its own child
    assert_one_at_a_time(run_windows(server.data_dir / "studio.db"))
