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
import json
import os
import shutil
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Optional, cast

import ray
import ray.train

from finetune_studio.child.channel import Channel, JobFailure, StopRequested, StopSignal
from finetune_studio.jobs.phases import TERMINAL
from finetune_studio.ray_train.storage import (
    PathMap,
    StorageError,
    Store,
    fetch_inputs,
    get_checkpoint,
    localize,
    put_outputs,
)
from finetune_studio.training.child import classify
from finetune_studio.wire import WorkerSpec, checkpoint_name, last_checkpoint


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
        # The node's paths and the server's words for them (a job whose files travel through a URI).
        self.paths: Optional[PathMap] = None

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self._mute:
            return len(text)
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            if line and self.paths is not None:
                line = json.dumps(self.paths.restore(json.loads(line)), separators=(",", ":"))  # the channel's own JSON
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
    """Ray Train's per-worker function. `config` holds the job's spec (a wire line), the sink,
    and, when the job's files travel through a URI, the URI and the inputs uploaded there."""
    sink = config["sink"]
    rank = ray.train.get_context().get_world_rank()
    runtime = ray.get_runtime_context()
    where = {"node_ip": ray.util.get_node_ip_address(), "node_id": runtime.get_node_id(), "pid": os.getpid(),
             "actor_id": runtime.get_actor_id()}
    attempt: int = ray.get(sink.register.remote(rank, where))
    spec = WorkerSpec.from_line(config["spec"])
    stop = SharedStop(sink, attempt)
    stream = SinkStream(sink, attempt, mute=rank != 0)
    channel = Channel(cast(IO[str], stream), stop)
    scratch: Optional[Scratch] = None
    if config.get("storage"):
        try:
            scratch = Scratch.prepare(Store(config["storage"]), spec, rank, attempt, config.get("inputs") or {})
        except StorageError as exc:  # the same storage for every rank: each says so, rank 0 is heard
            channel.status("error", "Training failed", error=str(exc),
                           details={"output_dir": str(spec.output_dir), "error_code": "storage_unavailable"})
            return
        stream.paths = scratch.paths
        channel = ScratchChannel(cast(IO[str], stream), stop, scratch, rank)
        spec = scratch.spec
    elif attempt > 1 and last_checkpoint(spec.output_dir) is not None:
        # Ray Train started the workers again after losing one: go on from the job's last checkpoint.
        spec.request["resume_from_checkpoint"] = str(spec.output_dir)
    try:
        run(spec, channel, cast(IO[str], stream), stop, rank, where, sink, scratch)
    finally:
        if scratch is not None:
            scratch.remove()


def run(spec: WorkerSpec, channel: Channel, stream: IO[str], stop: StopSignal, rank: int, where: dict[str, Any], sink: Any,
        scratch: Optional[Scratch]) -> None:
    from finetune_studio.training.recipe import Recipe

    try:
        recipe = Recipe(spec, channel, stop)
    except JobFailure as exc:  # the request does not hold up: the same on every rank
        channel.status("error", "Training failed", error=exc.message,
                       details={"output_dir": str(spec.output_dir), "error_code": exc.error_code})
        return
    if scratch is not None:
        from finetune_studio.ray_train.checkpoints import CheckpointUpload

        recipe.extra_callbacks.append(CheckpointUpload(scratch.store, spec.job_id, rank, Scratch.announce(stream), channel.warn))
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


def node_cache() -> Path:
    """This node's folder for jobs whose files travel through a URI: its temporary directory's."""
    return Path(tempfile.gettempdir()) / "finetune-studio-ray"


@dataclass
class Scratch:
    """One worker's own folder on its node, for a job whose files travel through a URI:
    it trains there, with the node's copies of the inputs, and uploads what it saves."""

    store: Store
    job_id: str
    run_dir: Path
    spec: WorkerSpec
    paths: PathMap

    @classmethod
    def prepare(cls, store: Store, server_spec: WorkerSpec, rank: int, attempt: int, placed: dict[str, str]) -> Scratch:
        job_id = server_spec.job_id
        runs = node_cache() / "runs"
        for earlier in runs.glob(f"{job_id}-rank*-attempt*"):
            # A worker of an earlier attempt on this node that was lost before it could clean up.
            number = earlier.name.rpartition("-attempt")[2]
            if number.isdigit() and int(number) < attempt:
                shutil.rmtree(earlier, ignore_errors=True)
        run_dir = runs / f"{job_id}-rank{rank}-attempt{attempt}"
        shutil.rmtree(run_dir, ignore_errors=True)
        folder = run_dir / job_id  # the job folder's twin: the recipe writes here
        folder.mkdir(parents=True)
        local = fetch_inputs(store, placed, node_cache())
        request = localize(server_spec.request, local)
        stored = store.stored_checkpoints(job_id) if attempt > 1 else []
        if stored:
            # Ray Train started the workers again after losing one: go on from the job's last stored checkpoint.
            get_checkpoint(store, job_id, checkpoint_name(stored[-1]), folder)
            request["resume_from_checkpoint"] = str(folder)
        spec = WorkerSpec(job_id=job_id, output_dir=folder, request=request, warnings=server_spec.warnings)
        paths = PathMap([(str(folder), str(server_spec.output_dir)), *((copy, text) for text, copy in local.items())])
        return cls(store, job_id, run_dir, spec, paths)

    @staticmethod
    def announce(stream: IO[str]) -> Callable[[str], None]:
        """How rank 0 tells the driver that a checkpoint is stored (a line the driver keeps to itself)."""
        def stored(name: str) -> None:
            stream.write(json.dumps({"type": "stored", "checkpoint": name}) + "\n")

        return stored

    def put_outputs(self) -> None:
        put_outputs(self.store, self.job_id, self.spec.output_dir, self.paths)

    def remove(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)


class ScratchChannel(Channel):
    """Rank 0's channel when the job's files travel through a URI: its results are uploaded
    before it says the job ended, so the driver finds them there when it hears it."""

    def __init__(self, stream: IO[str], stop: StopSignal, scratch: Scratch, rank: int) -> None:
        super().__init__(stream, stop)
        self._scratch = scratch
        self._rank = rank

    def status(self, phase: Any, message: str, *, error: Optional[str] = None, details: Optional[dict[str, Any]] = None) -> None:
        if phase in TERMINAL and self._rank == 0:
            try:
                self._scratch.put_outputs()
            except StorageError as exc:
                if phase == "error":  # the job's own error comes first; the storage's is a warning
                    self.warn(str(exc))
                else:
                    phase, message, error = "error", "Training failed", f"{exc} The job had {phase}: {message}"
                    details = {**(details or {}), "error_code": "storage_unavailable"}
        super().status(phase, message, error=error, details=details)
