"""The server's memory stays bounded under attack: streams that never read, as many
streams as a client cares to open, a queue full of large requests.

The server runs in this process (LiveServer, the same uvicorn and uvloop as
`serve`), so its resident memory is this process's, measured with psutil against a
baseline taken in the same test. The bounds are stated per stream and per request,
with room for the noise of a shared machine; what they replaced is in the comments.
"""

from __future__ import annotations

import gc
import json
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from finetune_studio.config import Settings
from finetune_studio.schemas import QUEUED_WARNINGS, WITHHELD_SECRETS, TrainingStartRequest
from tests.helpers.jobs import dataset, start_body
from tests.helpers.loud_worker import LoudLauncher
from tests.helpers.polling import wait_for
from tests.helpers.servers import LiveServer

MB = 1_000_000
STEPS = 20_000  # about 6 MB of progress events, after 4 statuses that each tried to be 4 MiB


def rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


class Peak:
    """The highest resident memory, and the most open streams of a job, while it runs."""

    def __init__(self, server: LiveServer, job_id: str) -> None:
        self.service = server.app.state.studio.service
        self.job_id = job_id
        self.rss = rss()
        self.readers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        process = psutil.Process()
        while not self._stop.wait(0.01):
            self.rss = max(self.rss, process.memory_info().rss)
            self.readers = max(self.readers, self.service.readers(self.job_id))

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def silent_stream(server: LiveServer, job_id: str) -> socket.socket:
    """A client that asks for the job's stream and never reads a byte of it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(f"GET /train/stream/{job_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return sock


def connections(server: LiveServer) -> int:
    """The connections uvicorn holds open."""
    return len(server.server.server_state.connections)


@pytest.fixture
def loud_job(live_server: Any, tmp_path: Path) -> Iterator[tuple[LiveServer, str]]:
    """A job in `training` with STEPS progress events after four oversized statuses."""
    server = live_server(LoudLauncher(steps=STEPS), stream_stall_seconds=5.0, max_streams_per_job=2500)
    with server.client() as client:
        job_id = client.start(start_body(dataset(tmp_path)))
        wait_for(lambda: (client.progress(job_id) or {}).get("step") == STEPS, timeout=300, what="the job's events")
    yield server, job_id


class Errors(logging.Handler):
    """The error records of uvicorn's logger (which does not propagate to the root, so caplog misses them)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_streams_that_never_read_are_dropped_and_hold_little_meanwhile(loud_job: tuple[LiveServer, str]) -> None:
    server, job_id = loud_job
    streams = 200
    service = server.app.state.studio.service
    errors = Errors()
    logging.getLogger("uvicorn.error").addHandler(errors)
    before = rss()
    sockets: list[socket.socket] = []
    try:
        with Peak(server, job_id) as peak:
            sockets = [silent_stream(server, job_id) for _ in range(streams)]
            wait_for(lambda: peak.readers == streams, timeout=120, what="every stream to open")
            # Nobody reads and nobody hangs up: the server ends each stream itself.
            wait_for(lambda: service.readers(job_id) == 0, timeout=120, what="the silent streams to be dropped")
            wait_for(lambda: connections(server) == 0, timeout=30, what="their connections to be closed")
        growth = peak.rss - before
        # Each silent stream held at most a 64 KiB chunk, uvicorn's copy of it in the
        # transport, and its own objects (about 300 KB measured); before the bounds it
        # held a 5,000-event page for good: 200 streams, +594 MB, never released.
        assert growth < streams * 512 * 1024, f"{growth / MB:.0f} MB for {streams} silent streams"
    finally:
        for sock in sockets:
            sock.close()
        logging.getLogger("uvicorn.error").removeHandler(errors)
    assert [record.getMessage() for record in errors.records] == []  # dropping a stream is no error

    # The server went on serving: a client that reads gets every event, in order.
    with server.client() as client:
        client.stop(job_id)
        ids = [event.id for event in client.stream(job_id)]
    assert ids == list(range(1, STEPS + 7))  # five statuses, every step, `stopped`

    # A finished job's stream ends by itself; one whose client never reads its end
    # does not keep the connection (and its buffer) open either.
    sockets = [silent_stream(server, job_id) for _ in range(20)]
    try:
        wait_for(lambda: connections(server) == 0 and service.readers(job_id) == 0, timeout=60,
                 what="the finished job's silent streams to be closed")
    finally:
        for sock in sockets:
            sock.close()


def test_a_job_takes_at_most_max_streams_per_job_streams_then_503(live_server: Any, tmp_path: Path) -> None:
    assert Settings().max_streams_per_job >= 2000  # the 1,000-client budget of docs/BENCHMARKS.md, twice
    server = live_server(LoudLauncher(steps=3, status_bytes=100), max_streams_per_job=3)
    service = server.app.state.studio.service
    with server.client() as client:
        job_id = client.start(start_body(dataset(tmp_path)))
        wait_for(lambda: client.status(job_id)["phase"] == "training", what="training")
        held = [silent_stream(server, job_id) for _ in range(3)]
        try:
            wait_for(lambda: service.readers(job_id) == 3, what="three streams")
            refused = httpx.get(f"{server.url}/train/stream/{job_id}", timeout=10)
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "5"
            detail = refused.json()["detail"]
            assert f"job {job_id} has 3 open streams, this server's limit per job" in detail
            assert "FINETUNE_STUDIO_MAX_STREAMS_PER_JOB" in detail

            held.pop().close()  # a stream that ends gives its place back
            wait_for(lambda: service.readers(job_id) == 2, what="the closed stream to be counted out")
            first = next(iter(client.stream(job_id)))
            assert first.id == 1 and first.kind == "status"
        finally:
            for sock in held:
                sock.close()
        client.stop(job_id)


def large_bodies(data: Path) -> list[bytes]:
    """Two requests of about 1 MiB (the default limit): 20,000 unknown fields, and one unknown field with a 1 MB name."""
    base = start_body(data)
    many = dict(base)
    for n in range(20_000):
        many[f"unknown_field_{n:06d}_{'x' * 20}"] = n
    one = {**base, "k" * 1_000_000: "v"}
    bodies = [json.dumps(many).encode(), json.dumps(one).encode()]
    assert all(900_000 < len(body) <= 1024 * 1024 for body in bodies)
    return bodies


def test_a_full_queue_of_large_requests_holds_little_memory_and_small_statuses(live_server: Any, tmp_path: Path) -> None:
    server = live_server(LoudLauncher(steps=1, status_bytes=100))  # the first job holds the only slot
    data = dataset(tmp_path)
    bodies = large_bodies(data)
    json_type = {"content-type": "application/json"}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        running = http.post("/train/start", json=start_body(data)).json()["job_id"]
        for _ in range(3):  # the same path once, so that the baseline has paid for what is paid once
            http.post("/train/start", content=bodies[0], headers=json_type)
        before = rss()
        queued = []
        for n in range(100):
            answer = http.post("/train/start", content=bodies[n % 2], headers=json_type)
            assert answer.status_code == 200, answer.text[:200]
            queued.append(answer.json()["job_id"])
        growth = rss() - before
        # 100 MB of requests; a queued job keeps its stored row and nothing else in
        # memory (before: +380 MB, every ignored field kept for the job's worker).
        assert growth < 40 * MB, f"{growth / MB:.0f} MB for 100 queued requests of 1 MiB"

        for job_id in queued[:2]:
            status = http.get(f"/train/status/{job_id}")
            assert len(status.content) < 2000
            warnings = status.json()["details"]["warnings"]
            assert len(warnings) == 1 and warnings[0].startswith("unknown field") and warnings[0].endswith("ignored")
            with http.stream("GET", f"/train/stream/{job_id}") as stream:
                first = next(line for line in stream.iter_lines() if line.startswith("data:"))
            assert len(first) < 2000
        stored = server.app.state.studio.service.store.get_job(queued[0]).request
        assert set(stored) <= set(TrainingStartRequest.model_fields) | {WITHHELD_SECRETS, QUEUED_WARNINGS}
        http.post(f"/train/stop/{running}")
