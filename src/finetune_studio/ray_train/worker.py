"""What every Ray Train worker runs: the same recipe as a local job, wired to the job's sink.

Ray Train has already set up torch.distributed (gloo on CPU, NCCL on GPU) and the
RANK / LOCAL_RANK / WORLD_SIZE variables when this runs, so the recipe's Trainer
trains data-parallel without knowing it: each rank takes its share of every batch,
and the gradients are averaged across ranks.

- Rank 0 reports: its channel's lines go to the sink, in order; the other ranks'
  channels are mute (they would say the same things).
- Stop: every rank asks the sink, once per step, whether to stop after it; the
  sink answers the same for all of them (see sink.py).
- A restart (Ray Train starts the workers again after losing one) resumes from the
  job's last checkpoint in its folder, which every node sees.
- A failure the recipe does not expect is noted in the sink (code and words, for
  the driver to report if the run cannot go on) and raised, so that Ray Train
  counts it against `max_failures`.
"""

from __future__ import annotations

import io
import os
import traceback
from typing import IO, Any, cast

import ray
import ray.train

from finetune_studio.training.channel import Channel, JobFailure, StopRequested, StopSignal
from finetune_studio.training.child import classify
from finetune_studio.wire import WorkerSpec, last_checkpoint


class SinkStream(io.TextIOBase):
    """A text stream whose every line becomes one numbered push to the sink (rank 0),
    or goes nowhere (the other ranks)."""

    def __init__(self, sink: Any, attempt: int, mute: bool) -> None:
        super().__init__()
        self._sink = sink
        self._attempt = attempt
        self._mute = mute
        self._seq = 0
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self._mute:
            return len(text)
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            if line:
                # Fire and forget: the step does not wait for the sink (1-2 ms if it did).
                self._sink.push.remote(self._attempt, self._seq, line)
                self._seq += 1
        return len(text)


class SharedStop(StopSignal):
    """The stop signal of a data-parallel worker: set only when the sink says this
    step is the last, which it says alike to every rank."""

    def __init__(self, sink: Any, attempt: int) -> None:
        super().__init__()
        self._sink = sink
        self._attempt = attempt

    def stops_at(self, step: int) -> bool:
        if self.is_set():
            return True
        if ray.get(self._sink.stops_at.remote(self._attempt, step)):
            self.set("a stop was requested")
            return True
        return False


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's per-worker function: `config` holds the job's spec (a wire line) and the sink."""
    from finetune_studio.training.recipe import Recipe

    sink = config["sink"]
    rank = ray.train.get_context().get_world_rank()
    runtime = ray.get_runtime_context()
    where = {"node_ip": ray.util.get_node_ip_address(), "node_id": runtime.get_node_id(), "pid": os.getpid(),
             "actor_id": runtime.get_actor_id()}
    attempt: int = ray.get(sink.register.remote(rank, where))
    spec = WorkerSpec.from_line(config["spec"])
    if attempt > 1 and last_checkpoint(spec.output_dir) is not None:
        # Ray Train started the workers again after losing one: go on from the job's last checkpoint.
        spec.request["resume_from_checkpoint"] = str(spec.output_dir)
    stop = SharedStop(sink, attempt)
    channel = Channel(cast(IO[str], SinkStream(sink, attempt, mute=rank != 0)), stop)

    try:
        recipe = Recipe(spec, channel, stop)
    except JobFailure as exc:  # the request does not hold up: the same on every rank
        channel.status("error", "Training failed", error=exc.message,
                       details={"output_dir": str(spec.output_dir), "error_code": exc.error_code})
        return
    try:
        recipe.run()
    except StopRequested as exc:
        channel.status("stopped", f"Stopped during {recipe.phase} ({exc}); nothing was trained", details=recipe.details())
    except JobFailure as exc:
        channel.status("error", "Training failed", error=exc.message, details={**recipe.details(), "error_code": exc.error_code})
    except BaseException as exc:
        traceback.print_exc()
        code, text = classify(exc)
        ray.get(sink.note_failure.remote(rank, where, code, text))
        raise
