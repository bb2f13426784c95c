"""What one reader takes at once is bounded: at most CHUNK_BYTES of frames per chunk
(a larger frame goes alone), from the feed and from the database alike, and every
event still arrives once, in order."""

from __future__ import annotations

import asyncio
from pathlib import Path

from finetune_studio.jobs.feed import CHUNK_BYTES, EventFeed
from finetune_studio.jobs.service import JobService
from finetune_studio.jobs.store import JobStore, StoredEvent
from tests.helpers.streams import ids, step, to_training


def test_the_feed_gives_at_most_max_bytes_and_a_large_frame_alone() -> None:
    async def run() -> None:
        feed = EventFeed(1, capacity=100)
        sizes = [10, 10, 10, 50, 10]
        for n, size in enumerate(sizes, start=1):
            feed.append(StoredEvent("j", n, "progress", ""), b"x" * size, terminal=False)
        assert feed.frames_after(0, 25) == (b"x" * 20, 2)
        assert feed.frames_after(2, 25) == (b"x" * 10, 3)
        assert feed.frames_after(3, 25) == (b"x" * 50, 4)  # over the bound, and alone
        assert feed.frames_after(3, 1000) == (b"x" * 60, 5)
        assert feed.frames_after(5, 25) == (b"", 5)

    asyncio.run(run())


def test_a_live_reader_and_a_replay_take_bounded_chunks_and_every_event(tmp_path: Path) -> None:
    async def run() -> tuple[list[bytes], list[bytes]]:
        service = JobService(JobStore(tmp_path / "studio.db"), tmp_path / "jobs")
        job_id = to_training(service)
        for n in range(1, 3001):  # about 600 KB of frames, all in the job's feed
            step(service, job_id, n)
        live: list[bytes] = []
        stream = service.stream(job_id, 0)
        while not live or ids(live)[-1] < 3005:  # everything there is, from the feed: no wait
            live.append(await stream.__anext__())
        service.transition(job_id, "completed", "done")
        live.extend([chunk async for chunk in stream])
        replay = [chunk async for chunk in service.stream(job_id, 0)]  # the feed is gone: the database
        return live, replay

    live, replay = asyncio.run(run())
    for chunks in (live, replay):
        assert ids(chunks) == list(range(1, 3007))
        assert max(len(chunk) for chunk in chunks) < CHUNK_BYTES + 1000
        assert len(chunks) >= sum(len(chunk) for chunk in chunks) // CHUNK_BYTES > 5
