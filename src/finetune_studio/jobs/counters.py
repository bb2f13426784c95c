"""The studio's own counters: plain numbers the hot paths bump without a lock, which
/metrics reads at scrape time (api/metrics.py's collector). prometheus_client's own
metrics take a lock on every `inc` and `observe`; these cost an add.

Plain Python; bumped from the server's event loop thread only.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# The upper bounds (seconds) of the event write-to-client latency histogram's buckets.
LATENCY_BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass
class Counters:
    # Per bucket of LATENCY_BUCKETS, and one more for +Inf: not cumulative (the collector adds them up).
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    latency_sum: float = 0.0
    # Chat completion requests, by whether they asked for a stream ("true" | "false").
    chat_requests: dict[str, int] = field(default_factory=dict)
    # Webhook attempts by result: delivered, failed (another attempt follows), exhausted (the last failed), refused.
    webhook_attempts: dict[str, int] = field(default_factory=dict)

    def observe_latency(self, seconds: float) -> None:
        self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum += seconds

    @staticmethod
    def bump(counts: dict[str, int], label: str) -> None:
        counts[label] = counts.get(label, 0) + 1


@dataclass
class ChatDecoding:
    """How the chat child decodes, from its `stats` lines (inference/engine.py; at most one a
    second while answers run, one when the last ends): the server's InferenceManager keeps one."""

    batch_size: int = 0  # answers decoded together in the widest step of the latest report
    tokens_per_second: float = 0.0  # decoded tokens over the seconds spent in steps, in the latest report
    running: int = 0  # answers running when the latest report was sent
    tokens: int = 0  # decoded tokens, all reports
    seconds: float = 0.0  # seconds in decode steps, all reports

    def record(self, message: dict[str, object]) -> None:
        """Take a `stats` line; one that is malformed is ignored."""
        batch, tokens, seconds, running = (message.get(name) for name in ("batch_size", "tokens", "seconds", "running"))
        if not (isinstance(batch, int) and isinstance(tokens, int) and isinstance(seconds, (int, float))
                and isinstance(running, int)) or tokens < 0 or seconds < 0:
            return
        self.batch_size, self.running = batch, running
        self.tokens_per_second = tokens / seconds if seconds > 0 else 0.0
        self.tokens += tokens
        self.seconds += float(seconds)
