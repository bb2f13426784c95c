"""What every suite of the evaluation child shares: its context (the server's API, the models,
the stop signal, the progress counter), requests run a few at a time, and what a suite gives
back (its metrics and its per-sample rows)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

from finetune_studio.child.channel import Channel, StopRequested, StopSignal
from finetune_studio.evaluation.api import OpenAIEndpoint
from finetune_studio.evaluation.stats import Estimate

# Requests in flight at once per suite: the chat child decodes concurrent answers in one batch
# (8 streams decode at 4.8x one on 2 CPU cores, docs/BENCHMARKS.md), and half the batch's default
# room (max_batch_size 16) stays free for the chats of people using the server meanwhile.
CONCURRENT_REQUESTS = 8
# Text of a per-sample row (a prompt, an answer, a reason) is cut to this many characters.
MAX_SAMPLE_TEXT = 4000
# At most one progress event this often (the last of a suite always goes).
PROGRESS_EVERY_SECONDS = 0.25

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")


def clip(text: Optional[str], limit: int = MAX_SAMPLE_TEXT) -> str:
    text = text or ""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


@dataclass
class ModelInfo:
    """A model as the child reaches it: the id it names at /v1, and where its tokenizer is."""

    id: str
    tokenizer: Optional[dict[str, str]] = None  # {"kind", "location"}, training.models.ModelSource's
    trust_remote_code: bool = False


class Progress:
    """Samples done of samples in all, sent as EvalProgress events (at most every PROGRESS_EVERY_SECONDS)."""

    def __init__(self, channel: Channel, clock: Callable[[], float] = time.monotonic) -> None:
        self.channel = channel
        self.clock = clock
        self.started = clock()
        self.total = 0
        self.done = 0
        self._sent_at = -math.inf
        self._lock = threading.Lock()

    def add(self, samples: int) -> None:
        with self._lock:
            self.total += samples

    def advance(self, suite: str, model: Optional[str], samples: int = 1, *, force: bool = False) -> None:
        with self._lock:
            self.done = min(self.total, self.done + samples) if self.total else self.done + samples
            now = self.clock()
            if not force and now - self._sent_at < PROGRESS_EVERY_SECONDS and self.done < self.total:
                return
            self._sent_at = now
            done, total = self.done, max(self.total, self.done)
        elapsed = now - self.started
        percent = 100.0 * done / total if total else 100.0
        eta = elapsed * (total - done) / done if done else None
        self.channel.progress(
            step=done, total_steps=total, progress_percent=round(percent, 2), suite=suite, model=model,
            elapsed_seconds=round(elapsed, 2), eta_seconds=round(eta, 1) if eta is not None else None, timestamp=time.time(),
        )


@dataclass
class Context:
    """What a suite runs with."""

    api: OpenAIEndpoint  # the server's /v1
    models: list[ModelInfo]
    stop: StopSignal
    progress: Progress
    channel: Channel
    tokenizers: dict[str, Any] = field(default_factory=dict)  # model id -> its tokenizer (heldout's chat template)
    completions: Optional[bool] = None  # whether the server has /v1/completions (probed once)
    server: dict[str, Any] = field(default_factory=dict)  # {"url", "token"}
    judge_keys: dict[str, str] = field(default_factory=dict)  # suite index -> an external judge's API key

    @property
    def ids(self) -> list[str]:
        return [model.id for model in self.models]

    def has_completions(self) -> bool:
        if self.completions is None:
            self.completions = self.api.has_completions(self.models[0].id)
        return self.completions


@dataclass
class SuiteResult:
    """A suite's rows of the results table and its per-sample rows."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def add(self, suite: str, name: str, estimate: Estimate, *, higher_is_better: bool, samples: int) -> None:
        self.metrics.append({
            "suite": suite,
            "name": f"{suite}/{name}",
            "values": {model: _round(value) for model, value in estimate.values.items()},
            "ci95": {model: [_round(v) for v in pair] for model, pair in estimate.ci95.items()},
            "deltas": {model: _round(value) for model, value in estimate.deltas.items()},
            "deltas_ci95": {model: [_round(v) for v in pair] for model, pair in estimate.deltas_ci95.items()},
            "higher_is_better": higher_is_better,
            "samples": samples,
        })


def _round(value: Any) -> Any:
    return round(float(value), 8) if isinstance(value, (int, float)) else value


def run_concurrently(items: Sequence[_Item], work: Callable[[_Item], _Result], stop: StopSignal, workers: int = CONCURRENT_REQUESTS) -> list[_Result]:
    """`work(item)` for every item, a few at a time (daemon threads), results in the items' order.
    A stop ends it at once (StopRequested): requests under way are abandoned, and the server
    cancels each as its connection closes. The first failure ends it too."""
    results: dict[int, _Result] = {}
    failures: list[BaseException] = []
    pending = list(enumerate(items))
    lock = threading.Lock()
    finished = threading.Event()

    def worker() -> None:
        while not stop.is_set() and not failures:
            with lock:
                if not pending:
                    break
                index, item = pending.pop(0)
            try:
                result = work(item)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                with lock:
                    failures.append(exc)
                break
            with lock:
                results[index] = result
        with lock:
            running[0] -= 1
            if running[0] == 0:
                finished.set()

    if not items:
        return []
    count = max(1, min(workers, len(items)))
    running = [count]
    for number in range(count):
        threading.Thread(target=worker, name=f"eval-request-{number}", daemon=True).start()
    while not finished.wait(0.1):
        if stop.is_set():
            raise StopRequested(stop.reason)
    if failures:
        raise failures[0]
    stop.check()
    return [results[index] for index in range(len(items))]
