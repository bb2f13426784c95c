"""A job driven through JobService by hand, and the ids of the frames its stream sent
(tests/unit/test_stream.py, test_stream_chunks.py)."""

from __future__ import annotations

import re

from finetune_studio.jobs.feed import KEEPALIVE
from finetune_studio.jobs.service import JobService

FRAME = re.compile(rb"event: (status|progress)\ndata: ([^\n]*)\nid: (\d+)\n\n")


def to_training(service: JobService, steps: int = 0) -> str:
    """A new job, taken through every phase to training, that has reported `steps` steps; its id."""
    job = service.create_job({}, "queued", {})
    for phase in ("loading_model", "loading_dataset", "configuring", "training"):
        service.transition(job.id, phase, phase)
    for n in range(1, steps + 1):
        step(service, job.id, n)
    return job.id


def step(service: JobService, job_id: str, n: int) -> None:
    service.record_progress(job_id, {"step": n, "total_steps": 10_000, "loss": 1.0, "learning_rate": 1e-4,
                                     "progress_percent": 0.0, "epoch": 0.0, "elapsed_seconds": 1.0, "eta_seconds": 1.0})


def ids(chunks: list[bytes]) -> list[int]:
    """The event ids of the frames in `chunks` (keepalives left out); every byte must be a whole frame."""
    text = b"".join(chunks).replace(KEEPALIVE, b"")
    frames = FRAME.findall(text)
    assert b"".join(b"event: %s\ndata: %s\nid: %s\n\n" % f for f in frames) == text, "a malformed frame"
    return [int(f[2]) for f in frames]
