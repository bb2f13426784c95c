"""The event sink: one small async actor per job, the meeting point of driver and workers.

- Rank 0 pushes every wire message (one JSON line) as it happens; the driver
  long-polls `pull` and gets them with no polling delay (RAY-FACTS: a push costs
  1-2 ms). Messages are numbered per worker attempt, so they are relayed in the
  order they were sent even if Ray runs two pushes out of order.
- The stop flag, and the one decision per (attempt, step) that every rank reads at
  the end of that step: all ranks leave the training loop at the same step, which
  is what keeps DDP's collectives from hanging.
- The workers of each attempt register where they run (node, pid), which names a
  lost worker in the stream; the sink also reads, for the driver, why a worker's
  actor died (the cluster's actor table cannot be read through Ray Client, where
  the driver may run: a `ray://` address).

It asks for no CPU (`num_cpus=0` where it is created): on a small cluster a
coordinating actor that takes a CPU takes it from the training workers.
"""

from __future__ import annotations

import asyncio
from typing import Any


class EventSink:
    def __init__(self) -> None:
        self._ready: list[tuple[int, str]] = []
        self._wake = asyncio.Event()
        # Per sender (attempt): the next number expected, and lines that came early.
        self._next: dict[int, int] = {}
        self._early: dict[int, dict[int, str]] = {}
        self._stop = False
        self._decisions: dict[tuple[int, int], bool] = {}
        self._attempts: dict[int, int] = {}
        self._workers: list[dict[str, Any]] = []
        self._failures: list[dict[str, Any]] = []

    async def register(self, rank: int, where: dict[str, Any]) -> int:
        """A worker started; its attempt (1 for the first run, 2 after the first restart, ...)."""
        attempt = self._attempts.get(rank, 0) + 1
        self._attempts[rank] = attempt
        self._workers.append({**where, "rank": rank, "attempt": attempt})
        return attempt

    async def workers(self) -> list[dict[str, Any]]:
        return list(self._workers)

    async def note_failure(self, rank: int, where: dict[str, Any], code: str, text: str) -> None:
        """A worker's training failed with an error it did not expect (an out-of-memory, say)."""
        self._failures.append({**where, "rank": rank, "error_code": code, "error": text})

    async def failures(self) -> list[dict[str, Any]]:
        return list(self._failures)

    async def death_reasons(self, actor_ids: list[str]) -> dict[str, str]:
        """Why each of these actors died, as the cluster recorded it: the name of its
        ActorDiedErrorContext.Reason (WORKER_DIED, NODE_DIED, RAY_KILL, ...), or "" while it
        is alive or when its record cannot be read. Asked here, inside the cluster, because
        the actor table (a developer API of Ray's) is not served through Ray Client."""
        return {actor_id: death_reason(actor_id) for actor_id in actor_ids}

    async def push(self, attempt: int, seq: int, line: str) -> None:
        early = self._early.setdefault(attempt, {})
        early[seq] = line
        expected = self._next.get(attempt, 0)
        while expected in early:
            self._ready.append((attempt, early.pop(expected)))
            expected += 1
        self._next[attempt] = expected
        self._wake.set()

    async def pull(self, timeout: float) -> list[tuple[int, str]]:
        """(attempt, line) for each line pushed since the last pull; waits up to `timeout` seconds for one."""
        if not self._ready:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                return []
        lines, self._ready = self._ready, []
        return lines

    async def request_stop(self) -> None:
        self._stop = True

    async def stop_requested(self) -> bool:
        return self._stop

    async def stops_at(self, attempt: int, step: int) -> bool:
        """Whether training stops after `step`: decided by the first rank that asks,
        and the same answer for every other rank of the attempt."""
        return self._decisions.setdefault((attempt, step), self._stop)


def death_reason(actor_id: str) -> str:
    """One actor's recorded cause of death (see EventSink.death_reasons)."""
    from ray._private.state import actors

    try:
        info = dict(actors(actor_id))
    except Exception:  # noqa: BLE001 - a table that cannot be read names nothing
        return ""
    context = getattr(info.get("DeathCause"), "actor_died_error_context", None)
    if info.get("State") != "DEAD" or context is None:
        return ""
    return str(type(context).Reason.Name(context.reason))
