"""What GET /metrics reports: a prometheus_client Collector that reads the studio's state
and its own counters (jobs/counters.py) when Prometheus scrapes, and nothing in between.

    finetune_studio_jobs{kind, phase}                        jobs in the store, by kind and phase
    finetune_studio_queue_depth{slot}                        waiting: training, export, evaluation
                                                             (inspection: always 0, as none waits)
    finetune_studio_running{slot}, finetune_studio_slots{slot}  running now, and how many may run at once
    finetune_studio_event_latency_seconds (histogram)        an event's write to its client taking it,
                                                             once per live chunk of a stream
    finetune_studio_open_streams                             event streams open now
    finetune_studio_chat_requests_total{stream}              chat completion requests
    finetune_studio_chat_batch_size                          answers the chat child decodes together (its
                                                             widest step of the last second; 0 when idle)
    finetune_studio_chat_tokens_per_second                   its decoded tokens per second of decoding, the
                                                             same second (0 when idle)
    finetune_studio_chat_decoded_tokens_total, ..._chat_decode_seconds_total  the same, summed: for rate()
    finetune_studio_webhook_attempts_total{result}           delivered | failed | exhausted | refused
    finetune_studio_webhook_deliveries{state}                deliveries kept: pending | delivered | failed
    finetune_studio_training_tokens_per_second{job_id}       the running training jobs' latest step
    finetune_studio_training_mfu{job_id}                     the same, where the child measured it
    finetune_studio_child_memory_bytes{child, id}            each child's resident memory (with psutil):
                                                             training, export, evaluation (by job id),
                                                             chat, inspection (by pid)

The server's own process metrics come from prometheus_client's ProcessCollector.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any, Optional

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from finetune_studio.jobs.counters import LATENCY_BUCKETS
from finetune_studio.jobs.phases import KINDS, PHASES_OF

# The slots' names as /metrics says them, per job kind.
SLOTS: dict[str, str] = {"train": "training", "export": "export", "eval": "evaluation"}
PREFIX = "finetune_studio"


def _psutil() -> Any:
    try:
        return importlib.import_module("psutil")
    except ImportError:
        return None


class StudioCollector(Collector):
    def __init__(self, app_state: Any) -> None:
        self.state = app_state
        self.psutil = _psutil()

    def collect(self) -> Iterator[Metric]:
        studio = self.state.studio
        store = studio.service.store
        counters = studio.service.counters
        supervisor = studio.supervisor

        jobs = GaugeMetricFamily(f"{PREFIX}_jobs", "Jobs in the store, by kind and phase.", labels=["kind", "phase"])
        counts = store.phase_counts()
        for kind in KINDS:
            for phase in PHASES_OF[kind]:
                jobs.add_metric([kind, phase], counts.get((kind, phase), 0))
        yield jobs

        depth = GaugeMetricFamily(f"{PREFIX}_queue_depth", "Work waiting for a slot.", labels=["slot"])
        running = GaugeMetricFamily(f"{PREFIX}_running", "Work running now.", labels=["slot"])
        slots = GaugeMetricFamily(f"{PREFIX}_slots", "How much may run at once.", labels=["slot"])
        active = supervisor.active()
        for kind, slot in SLOTS.items():
            depth.add_metric([slot], len(supervisor.queue_positions(kind)))
            running.add_metric([slot], sum(1 for job in active if job[0] == kind))
            slots.add_metric([slot], supervisor.slots[kind])
        inspector = self.state.inspector
        depth.add_metric(["inspection"], 0)  # beyond its slots an inspection is refused (429), never queued
        running.add_metric(["inspection"], inspector.running)
        slots.add_metric(["inspection"], inspector.slots)
        yield from (depth, running, slots)

        buckets, total = [], 0
        for bound, count in zip((*LATENCY_BUCKETS, float("inf")), counters.latency_counts, strict=True):
            total += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), total))
        yield HistogramMetricFamily(
            f"{PREFIX}_event_latency_seconds", "From an event's write to a stream client taking it (per live chunk).",
            buckets=buckets, sum_value=counters.latency_sum,
        )
        yield GaugeMetricFamily(f"{PREFIX}_open_streams", "Event streams open now.", value=studio.service.open_streams())

        chat = CounterMetricFamily(f"{PREFIX}_chat_requests", "Chat completion requests.", labels=["stream"])
        for label in ("false", "true"):
            chat.add_metric([label], counters.chat_requests.get(label, 0))
        yield chat
        decoding = studio.inference.decoding
        busy = decoding.running > 0  # as the child's latest report says: its counts are complete once it says 0
        yield GaugeMetricFamily(f"{PREFIX}_chat_batch_size", "Answers the chat child decodes together (its widest step"
                                " of the last second; 0 when idle).", value=decoding.batch_size if busy else 0)
        yield GaugeMetricFamily(f"{PREFIX}_chat_tokens_per_second", "The chat child's decoded tokens per second of"
                                " decoding, over the last second (0 when idle).", value=decoding.tokens_per_second if busy else 0.0)
        yield CounterMetricFamily(f"{PREFIX}_chat_decoded_tokens", "Tokens the chat child decoded.", value=decoding.tokens)
        yield CounterMetricFamily(f"{PREFIX}_chat_decode_seconds", "Seconds the chat child spent decoding.", value=decoding.seconds)
        attempts = CounterMetricFamily(f"{PREFIX}_webhook_attempts", "Webhook delivery attempts, by result.", labels=["result"])
        for result in ("delivered", "failed", "exhausted", "refused"):
            attempts.add_metric([result], counters.webhook_attempts.get(result, 0))
        yield attempts
        kept = GaugeMetricFamily(f"{PREFIX}_webhook_deliveries", "Webhook deliveries kept, by state.", labels=["state"])
        states = {"pending": 0, "delivered": 0, "failed": 0}
        for (_, state), count in store.webhooks.counts().items():
            states[state] = states.get(state, 0) + count
        for state, count in states.items():
            kept.add_metric([state], count)
        yield kept

        speed = GaugeMetricFamily(f"{PREFIX}_training_tokens_per_second", "The running training jobs' latest step.", labels=["job_id"])
        mfu = GaugeMetricFamily(f"{PREFIX}_training_mfu", "Model FLOPs utilization of the running training jobs' latest step.", labels=["job_id"])
        for kind, job_id, _ in active:
            if kind != "train":
                continue
            progress = store.get_job(job_id).progress or {}
            if isinstance(progress.get("tokens_per_second"), (int, float)):
                speed.add_metric([job_id], float(progress["tokens_per_second"]))
            if isinstance(progress.get("mfu"), (int, float)):
                mfu.add_metric([job_id], float(progress["mfu"]))
        yield from (speed, mfu)

        if self.psutil is not None:
            memory = GaugeMetricFamily(f"{PREFIX}_child_memory_bytes", "Each child process's resident memory.", labels=["child", "id"])
            children: list[tuple[str, str, Optional[int]]] = [(SLOTS[kind], job_id, pid) for kind, job_id, pid in active]
            children.append(("chat", "chat", studio.inference.pid))
            children.extend(("inspection", str(pid), pid) for pid in inspector.pids())
            for child, ident, pid in children:
                rss = self._rss(pid)
                if rss is not None:
                    memory.add_metric([child, ident], rss)
            yield memory

    def _rss(self, pid: Optional[int]) -> Optional[int]:
        if pid is None:
            return None
        try:
            return int(self.psutil.Process(pid).memory_info().rss)
        except (self.psutil.Error, OSError):
            return None  # it ended between the listing and now


def registry(app_state: Any) -> CollectorRegistry:
    """The app's own registry (never prometheus_client's global one: two apps in one process stay apart)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StudioCollector(app_state))
    ProcessCollector(registry=reg)
    return reg
