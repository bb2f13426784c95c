"""EventFeed: an unfinished job's recent events, each encoded once as SSE bytes.

Every stream reader of a job shares its feed. Publishing an event encodes it once
(`sse_frame`), appends the frame and wakes the readers; a reader then takes every
frame past its cursor as one joined chunk, so a thousand readers cost a thousand
slices and writes per event, not a thousand queries and encodings. A reader that
is further behind than the feed holds (a replay from event 0, a slow client) reads
from the database instead, in pages; the feed only ever holds the newest frames.

A chunk holds at most `max_bytes` of frames (at least one frame): what a reader
takes at once is what the server holds for it until the client has read it.
"""

from __future__ import annotations

import asyncio
import bisect
import time

from finetune_studio.jobs.store import StoredEvent

KEEPALIVE = b": keep-alive\n\n"
# The most bytes of frames one chunk holds (a single larger frame goes alone). A
# chunk stays in the server's memory until its client has read it, so this bounds
# what one slow reader costs; a 300-byte progress event is ~200 to a chunk.
CHUNK_BYTES = 64 * 1024
# The most bytes `sse_frame` adds to an event's data (names, the id, line breaks).
FRAME_OVERHEAD = 48


def sse_frame(event: StoredEvent) -> bytes:
    """One event in the text/event-stream wire format.

    The data is compact JSON from the store, which never holds a raw line break,
    so it is always a single `data:` line.
    """
    return b"event: %s\ndata: %s\nid: %d\n\n" % (event.kind.encode(), event.data.encode(), event.id)


class EventFeed:
    """Frames with consecutive event ids, first_id .. last_id, and a wake-up for readers."""

    def __init__(self, first_id: int, capacity: int) -> None:
        self.first_id = first_id
        self.finished = False  # the terminal status is the last frame
        self._capacity = capacity
        self._frames: list[bytes] = []
        # _ends[i]: the bytes of every frame ever appended, up to and including frame i
        # (so a chunk's size is a difference, and its end a bisection).
        self._ends: list[int] = []
        # When each frame was appended (time.monotonic()): the event write-to-client latency.
        self._times: list[float] = []
        self._appended = 0
        self._changed = asyncio.Event()

    @property
    def last_id(self) -> int:
        return self.first_id + len(self._frames) - 1

    def covers(self, cursor: int) -> bool:
        """Whether every event after `cursor` is (or will be) in this feed."""
        return cursor >= self.first_id - 1

    def append(self, event: StoredEvent, frame: bytes, terminal: bool) -> None:
        if event.id != self.last_id + 1:
            # Not the next id (cannot happen while the service is the only writer):
            # start over from this event; readers before it go to the database.
            self.first_id, self._frames, self._ends, self._times = event.id, [], [], []
        self._appended += len(frame)
        self._frames.append(frame)
        self._ends.append(self._appended)
        self._times.append(time.monotonic())
        if len(self._frames) >= 2 * self._capacity:
            drop = len(self._frames) - self._capacity
            del self._frames[:drop]
            del self._ends[:drop]
            del self._times[:drop]
            self.first_id += drop
        self.finished = terminal
        self.wake()

    def frames_after(self, cursor: int, max_bytes: int = CHUNK_BYTES) -> tuple[bytes, int]:
        """The frames after `cursor`, at most `max_bytes` of them (at least one), as
        one chunk, and the new cursor."""
        start = max(0, cursor - self.first_id + 1)
        if start >= len(self._frames):
            return b"", cursor
        before = self._ends[start] - len(self._frames[start])
        end = max(start + 1, bisect.bisect_right(self._ends, before + max_bytes, lo=start))
        return b"".join(self._frames[start:end]), self.first_id + end - 1

    def appended_at(self, event_id: int) -> float:
        """When the event (one this feed holds) was appended, as time.monotonic() says."""
        return self._times[event_id - self.first_id]

    def wake(self) -> None:
        """Wake every waiting reader (on a new event, or for a keep-alive)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self) -> None:
        await self._changed.wait()
