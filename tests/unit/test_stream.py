"""The event fan-out: JobService.stream over the in-memory feed and the database.

Every reader must get every event after its cursor exactly once, in order, ending
with the terminal status, whether it reads from the feed (live), from the database
(behind the feed, or after a restart) or from both in turn.

The tests never sleep to let readers run: `Waiting` wraps `EventFeed.wait`, which a
reader calls only once it has read everything there is, and a test waits for that.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from finetune_studio.jobs import service as service_module
from finetune_studio.jobs.feed import KEEPALIVE, EventFeed, sse_frame
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobStore, StoredEvent
from tests.helpers.streams import ids, step, to_training


def make_service(tmp_path: Path, **kwargs: float) -> JobService:
    return JobService(JobStore(tmp_path / "studio.db"), tmp_path / "jobs", **kwargs)


async def read_all(stream: AsyncIterator[bytes], chunks: list[bytes]) -> None:
    async for chunk in stream:
        chunks.append(chunk)


class Waiting:
    """The readers waiting on a feed, and the last event each had read when it began
    to wait (a reader waits only once it has taken every frame: the feed's `last_id`
    then is the last event it read), kept by wrapping `EventFeed.wait`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.read: dict[object, int] = {}  # a waiting reader's task -> the last event it read
        self.waits: Counter[object] = Counter()  # how many times each reader began to wait
        self._changed = asyncio.Event()
        original = EventFeed.wait

        async def wait(feed: EventFeed) -> None:
            reader = asyncio.current_task()
            self.read[reader] = feed.last_id
            self.waits[reader] += 1
            self._changed.set()
            try:
                await original(feed)
            finally:
                self.read.pop(reader, None)

        monkeypatch.setattr(EventFeed, "wait", wait)

    async def until(self, ready: Callable[[], bool]) -> None:
        """Return once ready() holds, checking each time a reader begins to wait
        (bounded, so that a reader that never waits fails the test)."""

        async def check() -> None:
            while not ready():
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(check(), 30)

    async def caught_up(self, readers: list[asyncio.Task[None]], event_id: int) -> None:
        """Until every one of readers waits, having read every event up to event_id
        (a reader that ends first fails the test at once)."""
        for reader in readers:
            reader.add_done_callback(lambda _: self._changed.set())

        def ready() -> bool:
            ended = [reader for reader in readers if reader.done()]
            assert not ended, f"{len(ended)} reader(s) ended before reading event {event_id}"
            return all(self.read.get(reader, -1) >= event_id for reader in readers)

        await self.until(ready)


@pytest.fixture
def waiting(monkeypatch: pytest.MonkeyPatch) -> Waiting:
    return Waiting(monkeypatch)


def test_a_frame_is_the_sse_wire_format() -> None:
    event = StoredEvent("j", 7, "progress", '{"step":3,"note":"a\\nb"}')
    assert sse_frame(event) == b'event: progress\ndata: {"step":3,"note":"a\\nb"}\nid: 7\n\n'


def test_the_feed_keeps_only_the_newest_frames_and_says_what_it_covers() -> None:
    feed = EventFeed(first_id=1, capacity=4)
    for n in range(1, 9):
        feed.append(StoredEvent("j", n, "progress", "{}"), b"%d;" % n, terminal=False)
    # At twice its capacity it drops the oldest down to capacity.
    assert (feed.first_id, feed.last_id) == (5, 8)
    assert feed.covers(4) and not feed.covers(3)
    assert feed.frames_after(5) == (b"6;7;8;", 8)
    assert feed.frames_after(8) == (b"", 8)
    feed.append(StoredEvent("j", 9, "status", "{}"), b"9;", terminal=True)
    assert feed.finished and feed.frames_after(8) == (b"9;", 9)


def test_live_readers_get_every_event_once_in_order_and_end_after_the_terminal(tmp_path: Path, waiting: Waiting) -> None:
    async def scenario() -> None:
        service = make_service(tmp_path)
        job_id = to_training(service)  # events 1..5
        readers: list[list[bytes]] = [[] for _ in range(20)]
        tasks = [asyncio.create_task(read_all(service.stream(job_id, 0), chunks)) for chunks in readers]
        await waiting.caught_up(tasks, 5)
        for n in range(1, 301):
            step(service, job_id, n)
            if n % 7 == 0:
                await waiting.caught_up(tasks, 5 + n)  # readers catch up every 7 events, not after each
        service.transition(job_id, "completed", "done")
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        expected = list(range(1, 307))
        for chunks in readers:
            assert ids(chunks) == expected
            # Events a reader was behind on came in one chunk: the first five, then
            # each 7 it caught up on, then the last 6 steps with the terminal status.
            assert len(chunks) == 1 + 300 // 7 + 1
        assert job_id not in service._feeds  # a finished job's feed is dropped

    asyncio.run(scenario())


def test_a_reader_far_behind_the_feed_reads_the_database_then_joins_the_feed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, waiting: Waiting
) -> None:
    monkeypatch.setattr(service_module, "FEED_CAPACITY", 8)
    monkeypatch.setattr(service_module, "REPLAY_PAGE", 10)

    async def scenario() -> None:
        service = make_service(tmp_path)
        job_id = to_training(service, steps=100)
        assert service._feeds[job_id].first_id > 50  # the feed holds only the newest
        for after in (0, 3, 50, 104, 105):
            chunks: list[bytes] = []
            task = asyncio.create_task(read_all(service.stream(job_id, after), chunks))
            before = service.store.get_job(job_id).last_event_id
            await waiting.caught_up([task], before)
            assert ids(chunks) == list(range(after + 1, before + 1))
            step(service, job_id, 101 + after)  # live, once the reader has come through the database to the feed
            last = service.store.get_job(job_id).last_event_id
            assert last == before + 1
            await waiting.caught_up([task], last)
            assert ids(chunks) == list(range(after + 1, last + 1))
            task.cancel()
        service.transition(job_id, "stopped", "stopped")

    asyncio.run(scenario())


def test_replay_of_a_finished_job_reads_pages_and_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service_module, "REPLAY_PAGE", 7)

    async def scenario() -> None:
        service = make_service(tmp_path)
        job_id = to_training(service, steps=40)
        service.transition(job_id, "completed", "done")
        for after, expected in ((0, list(range(1, 47))), (45, [46]), (46, []), (10**6, [])):
            chunks: list[bytes] = []
            await asyncio.wait_for(read_all(service.stream(job_id, after), chunks), 10)
            assert ids(chunks) == expected
        chunks = []
        await read_all(service.stream(job_id, 0), chunks)
        assert len(chunks) == 7  # 46 events in pages of 7

    asyncio.run(scenario())


def test_after_a_restart_a_reader_of_an_unfinished_job_follows_new_events(tmp_path: Path, waiting: Waiting) -> None:
    async def scenario() -> None:
        first = make_service(tmp_path)
        job_id = to_training(first)
        step(first, job_id, 1)
        first.store.close()
        # A new server: no feed in memory; the reader replays from the database and
        # then waits for events that the new service publishes.
        service = make_service(tmp_path)
        chunks: list[bytes] = []
        task = asyncio.create_task(read_all(service.stream(job_id, 2), chunks))
        await waiting.caught_up([task], 6)
        assert ids(chunks) == [3, 4, 5, 6]
        step(service, job_id, 2)
        service.transition(job_id, "error", "server restarted", error="server_restarted")
        await asyncio.wait_for(task, 10)
        assert ids(chunks) == [3, 4, 5, 6, 7, 8]

    asyncio.run(scenario())


def test_an_idle_stream_sends_a_keepalive_comment(tmp_path: Path, waiting: Waiting) -> None:
    async def scenario() -> None:
        service = make_service(tmp_path, keepalive_seconds=0.02)
        job_id = service.create_job({}, "queued", {}).id
        ticker = asyncio.create_task(service.keep_streams_alive())
        chunks: list[bytes] = []
        task = asyncio.create_task(read_all(service.stream(job_id, 0), chunks))
        await waiting.until(lambda: waiting.waits[task] >= 3)  # its first wait, and one after each of two ticks
        assert chunks.count(KEEPALIVE) >= 2 and ids(chunks) == [1]
        service.transition(job_id, "stopped", "stopped before it started")
        await asyncio.wait_for(task, 10)
        assert ids(chunks) == [1, 2]
        ticker.cancel()

    asyncio.run(scenario())
