"""EventFeed: an unfinished job's recent events, each encoded once as SSE bytes.

Every stream reader of a job shares its feed. Publishing an event encodes it once
(`sse_frame`), appends the frame and wakes the readers; a reader then takes every
frame past its cursor as one joined chunk, so a thousand readers cost a thousand
slices and writes per event, not a thousand queries and encodings. A reader that
is further behind than the feed holds (a replay from event 0, a slow client) reads
from the database instead, in pages; the feed only ever holds the newest frames.
"""

from __future__ import annotations

import asyncio

from finetune_studio.jobs.store import StoredEvent

KEEPALIVE = b": keep-alive\n\n"


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
            self.first_id, self._frames = event.id, []
        self._frames.append(frame)
        if len(self._frames) >= 2 * self._capacity:
            drop = len(self._frames) - self._capacity
            del self._frames[:drop]
            self.first_id += drop
        self.finished = terminal
        self.wake()

    def frames_after(self, cursor: int) -> tuple[bytes, int]:
        """All frames after `cursor` as one chunk, and the new cursor."""
        start = max(0, cursor - self.first_id + 1)
        if start >= len(self._frames):
            return b"", cursor
        return b"".join(self._frames[start:]), self.last_id

    def wake(self) -> None:
        """Wake every waiting reader (on a new event, or for a keep-alive)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self) -> None:
        await self._changed.wait()
