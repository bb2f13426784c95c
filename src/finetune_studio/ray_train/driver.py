"""Entry point of a job's Ray driver: `python -m finetune_studio.ray_train.driver --job-id ID --address ADDR`.

The server starts it as it starts a training child (supervisor/ray_launcher.py) and
it speaks the same wire (finetune_studio.wire): the spec then `stop` lines on
stdin, status and progress lines on stdout, everything else in the job's
worker.log. It:

1. connects to the cluster, creates the job's sink actor (sink.py), and runs
   `TorchTrainer.fit()` in a Ray task that asks for no CPU, so that a stop before
   training can cancel the whole run at once;
2. says what the job waits for while Ray places its workers (one placement group:
   the job starts when every worker's share is free), then relays rank 0's lines
   as they come (a long poll on the sink: no polling delay);
3. turns a stop into the sink's flag (every rank stops after the same step and
   saves), or, before training began, cancels the run;
4. says so when Ray Train restarts the run after losing a worker (it resumes from
   the job's last checkpoint), and reports the end itself when the run cannot:
   `error` with `worker_died` naming the lost worker's node once `max_failures`
   restarts are spent, a worker's own failure, or `stopped`.

ray is imported after the first status, so the server hears from the driver at once.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Optional

from finetune_studio.child.channel import Channel, StopSignal, open_child_wire
from finetune_studio.jobs.phases import REPEATABLE, RUNNING_ORDER, TERMINAL
from finetune_studio.ray_train.storage import (
    StorageError,
    Store,
    get_checkpoint,
    get_outputs,
    upload_inputs,
)
from finetune_studio.schemas import Phase, TrainingStartRequest
from finetune_studio.uris import is_uri, join, redacted
from finetune_studio.wire import CHILD_ENV, JobFolder, WorkerSpec, checkpoint_step

# How long one pull on the sink waits for a line: the longest a stop waits to be passed on.
PULL_SECONDS = 0.25
# The order of the phases before the end (jobs/phases.py): a restarted run's early phases
# are not said again, but for those the job may be told again with new words (REPEATABLE).
ORDER: tuple[Phase, ...] = ("idle", *RUNNING_ORDER)
# Why a worker actor died, when it was lost rather than ended by Ray Train (which ends
# the others with RAY_KILL once one is gone): ActorDiedErrorContext.Reason's names.
LOST_REASONS = frozenset({"WORKER_DIED", "NODE_DIED"})


def describe_resources(resources: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:g}" for name, value in sorted(resources.items())) or "nothing"


def run_fit(config: dict[str, Any], num_workers: int, resources: dict[str, float], storage: str, name: str,
            max_failures: int) -> None:
    """The Ray task that runs Ray Train (on any node; it asks for no CPU)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from finetune_studio.ray_train.worker import train_loop_per_worker

    gpu = resources.get("GPU", 0) > 0
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=config,
        # The same code path for both: only the backend differs (NCCL is untested here, docs/SCALE-OUT.md).
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=gpu, resources_per_worker=resources),
        run_config=RunConfig(name=name, storage_path=storage, failure_config=FailureConfig(max_failures=max_failures)),
    )
    trainer.fit()


@dataclass
class Relay:
    """What the driver knows of the run as it relays it."""

    events: IO[str]
    channel: Channel
    facts: dict[str, Any]
    max_failures: int
    phase: Phase = "idle"
    attempt: int = 1
    training_started: bool = False
    terminal: Optional[str] = None
    restarts: list[str] = field(default_factory=list)
    mirror: Optional[Mirror] = None  # when the job's files travel through a URI
    storage: str = ""  # Ray Train's storage_path

    def say(self, phase: Phase, message: str, **details: Any) -> None:
        self.phase = phase
        self.channel.status(phase, message, details={**self.facts, **details})

    def line(self, attempt: int, text: str, sink: Any) -> None:
        """One of rank 0's lines: relayed unless a restarted run says again what was said."""
        if attempt > self.attempt:
            self.attempt = attempt
            self.restarted(sink)
        try:
            message = json.loads(text)
        except ValueError:
            return
        if message.get("type") == "stored":  # rank 0 stored a checkpoint at the URI: copy it here
            if self.mirror is not None:
                self.mirror.checkpoint(str(message.get("checkpoint")))
            return
        if message.get("type") == "status":
            phase = str(message.get("phase"))
            if phase in TERMINAL:
                self.terminal = phase
                if self.mirror is not None:  # the results are at the URI: copy them here before saying so
                    self.mirror.outputs(message)
            elif phase in ORDER:
                now, then = ORDER.index(phase), ORDER.index(self.phase) if self.phase in ORDER else 0
                if now < then or (now == then and phase not in REPEATABLE):
                    print(f"driver: not repeating {phase} of restart {attempt - 1}: {message.get('message')}", file=sys.stderr)
                    return
                self.training_started = self.training_started or phase == "training"
                self.phase = ORDER[now]
            details = message.get("details")
            if isinstance(details, dict):
                details.update({key: value for key, value in self.facts.items() if key not in details})
                if self.restarts:
                    details["restarts"] = list(self.restarts)
            text = json.dumps(message, separators=(",", ":"), allow_nan=False)
        try:
            self.events.write(text + "\n")
            self.events.flush()
        except (BrokenPipeError, OSError, ValueError):
            # The server went away (its stdin listener sets the stop too). Keep relaying into
            # nothing until the run ends: leaving now would end the run with this Ray client,
            # before the ranks save what the stop asks for (as Channel does for a local child).
            pass

    def restarted(self, sink: Any) -> None:
        import ray

        lost = lost_workers(ray.get(sink.workers.remote()), self.attempt - 1, sink)
        what = f"A worker was lost ({lost})" if lost else "A worker was lost"
        restart = self.attempt - 1
        note = (f"{what}; Ray Train restarted the run (restart {restart} of at most {self.max_failures})"
                " and it resumes from the job's last checkpoint")
        self.restarts.append(note)
        self.channel.warn(note)
        if self.phase in REPEATABLE:
            self.say(self.phase, note, restarts=list(self.restarts))


class Mirror:
    """Copies what the workers store at the URI into the job's folder on this machine
    (storage.py): each checkpoint as rank 0 says it is stored, in a thread beside the
    relay, and the results before the relay passes on the end of the job."""

    def __init__(self, store: Store, job_id: str, folder: Path) -> None:
        self.store = store
        self.job_id = job_id
        self.folder = folder
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mirror")
        self._pending: list[Future[None]] = []
        self.problems: list[str] = []

    def checkpoint(self, name: str) -> None:
        if checkpoint_step(name) is not None:
            self._pending.append(self._pool.submit(self._copy, name))

    def _copy(self, name: str) -> None:
        try:
            get_checkpoint(self.store, self.job_id, name, self.folder)
        except StorageError as exc:
            self.problems.append(f"{name} stays at the job storage only: {exc}")

    def settle(self) -> None:
        """Wait for the copies asked for so far."""
        for future in self._pending:
            future.result()
        self._pending.clear()

    def outputs(self, message: dict[str, Any]) -> None:
        """Copy the results, then say in the end `message` what could not be copied."""
        self.settle()
        try:
            get_outputs(self.store, self.job_id, self.folder)
        except StorageError as exc:
            self.problems.append(f"The results stay at the job storage only ({join(redacted(self.store.uri), 'jobs', self.job_id)}): {exc}")
        details = message.get("details")
        if self.problems and isinstance(details, dict):
            details["warnings"] = [*details.get("warnings", []), *self.problems]
        self.problems = []


def controller_failure(text: str) -> Optional[str]:
    """When Ray Train's controller failed as it was created (before any worker: it first checks
    the run's storage), the last error line of its traceback; otherwise None."""
    if "TrainController.__init__" not in text:
        return None
    causes = [line.strip() for line in text.splitlines() if re.match(r"(\w+\.)*\w+(Error|Exception): ", line.strip())]
    own = [line for line in causes if not line.startswith(("ray.exceptions.", "RayTaskError"))] or causes
    return own[-1] if own else "an error as it started (the job's worker.log has it)"


def where(worker: dict[str, Any]) -> str:
    return f"worker {worker.get('rank')} on node {worker.get('node_ip')} (node id {str(worker.get('node_id'))[:12]}, pid {worker.get('pid')})"


def lost_workers(workers: list[dict[str, Any]], attempt: int, sink: Any) -> str:
    """The workers of `attempt` that died on their own, as words ('' when none can be named).

    When one worker dies Ray Train ends the others itself; the one whose process or
    node went away is told apart by the cause the cluster recorded for its actor,
    which the sink reads inside the cluster (the actor table is not served through
    Ray Client, where the driver may run)."""
    import ray

    alive_nodes = {node["NodeID"] for node in ray.nodes() if node.get("Alive")}
    mine = [w for w in workers if w.get("attempt") == attempt]
    reasons: dict[str, str] = ray.get(sink.death_reasons.remote([str(w.get("actor_id")) for w in mine]))
    gone = []
    for worker in mine:
        if str(worker.get("node_id")) not in alive_nodes:
            gone.append(f"{where(worker)}: its node left the cluster")
        elif reasons.get(str(worker.get("actor_id"))) in LOST_REASONS:
            gone.append(where(worker))
    return "; ".join(gone)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="finetune_studio.ray_train.driver")
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--address", required=True, help="the Ray cluster (auto, HOST:PORT or ray://HOST:PORT)")
    parser.add_argument("--max-failures", type=int, default=0)
    parser.add_argument("--storage", required=True, help="Ray Train's storage_path (a shared folder or a URI)")
    args = parser.parse_args(argv)

    spec, channel, stop, events = open_child_wire()
    facts: dict[str, Any] = {"output_dir": str(spec.output_dir)}
    try:
        request = TrainingStartRequest.model_validate(spec.request)
    except ValueError as exc:
        channel.status("error", "Training failed", error=f"the request is not valid: {exc}",
                       details={**facts, "error_code": "config_invalid"})
        return 1
    resources = dict(request.resources_per_worker or {"CPU": 1.0})
    facts["model_name"] = request.model_name
    facts["ray"] = {"address": args.address, "num_workers": request.num_workers, "resources_per_worker": resources,
                    "max_failures": args.max_failures, "backend": "nccl" if resources.get("GPU", 0) > 0 else "gloo"}
    relay = Relay(events, channel, facts, args.max_failures)
    relay.say("loading_model", f"Connecting to the Ray cluster at {args.address}")

    import ray

    try:
        ray.init(address=args.address, runtime_env={"env_vars": dict(CHILD_ENV)}, log_to_driver=True)
    except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, ValueError: all mean no cluster
        traceback.print_exc()
        channel.status(
            "error", "Training failed",
            error=f"The Ray cluster at {args.address} could not be reached ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})."
            " Start it (ray start --head), or start the server with the --ray-address of a running cluster"
            " (docs/SCALE-OUT.md).",
            details={**facts, "error_code": "cluster_unavailable"},
        )
        return 1
    try:
        return drive(relay, spec, request, resources, args, stop)
    finally:
        ray.shutdown()


def drive(relay: Relay, spec: WorkerSpec, request: TrainingStartRequest, resources: dict[str, float],
          args: argparse.Namespace, stop: StopSignal) -> int:
    import ray
    from ray.exceptions import TaskCancelledError

    from finetune_studio.ray_train.sink import EventSink

    sink: Any = ray.remote(EventSink).options(name=f"finetune-studio-sink-{spec.job_id}", num_cpus=0).remote()
    config: dict[str, Any] = {"spec": spec.to_line().decode(), "sink": sink}
    ray_storage = args.storage
    if is_uri(args.storage):
        # The nodes share no folder: the job's inputs and files travel through the URI (storage.py).
        try:
            store = Store(args.storage)
            relay.say("loading_model", f"Uploading the job's local inputs to {redacted(args.storage)} (once per content)")
            config["inputs"] = upload_inputs(store, spec.request, spec.output_dir.parent)
        except StorageError as exc:
            relay.channel.status("error", "Training failed", error=str(exc),
                                 details={**relay.facts, "error_code": "storage_unavailable"})
            return 1
        config["storage"] = args.storage
        relay.mirror = Mirror(store, spec.job_id, spec.output_dir)
        relay.facts["storage"] = join(redacted(args.storage), "jobs", spec.job_id)
        ray_storage = join(args.storage, "ray")
    relay.storage = ray_storage
    fit = ray.remote(num_cpus=0, max_retries=0)(run_fit)
    ref = fit.remote(config, request.num_workers, resources, ray_storage, spec.job_id, args.max_failures)

    total = ray.cluster_resources()
    free = ray.available_resources()
    asked = {name: value * request.num_workers for name, value in resources.items()}
    relay.say(
        "loading_model",
        f"Waiting for the Ray cluster to place {request.num_workers} worker{'s' if request.num_workers > 1 else ''}"
        f" with {describe_resources(resources)} each (in all {describe_resources(asked)}; free now:"
        f" {describe_resources({k: free.get(k, 0.0) for k in asked})} of {describe_resources({k: total.get(k, 0.0) for k in asked})})",
        waiting_for={"num_workers": request.num_workers, "resources_per_worker": resources},
    )

    cancelled = False
    stop_passed = False
    while True:
        if stop.is_set() and not stop_passed:
            stop_passed = True
            ray.get(sink.request_stop.remote())
            if not relay.training_started:
                # Nothing trained yet (waiting for the cluster, or loading): end the whole run now.
                ray.cancel(ref, force=True)
                cancelled = True
        for attempt, line in ray.get(sink.pull.remote(PULL_SECONDS)):
            relay.line(attempt, line, sink)
        done, _ = ray.wait([ref], timeout=0)
        if done:
            break
    while lines := ray.get(sink.pull.remote(0.05)):
        for attempt, line in lines:
            relay.line(attempt, line, sink)

    try:
        ray.get(ref)
    except TaskCancelledError:
        pass
    except Exception as exc:  # noqa: BLE001 - how the run failed is reported below, in words
        traceback.print_exc()
        if relay.terminal is None:
            return failed(relay, spec, exc, sink)
    if relay.terminal is not None:
        return 1 if relay.terminal == "error" else 0  # as the training child: a stop is no failure
    if stop.is_set() or cancelled:
        relay.channel.status(
            "stopped", f"Stopped during {relay.phase} ({stop.reason}); nothing was trained",
            details={**relay.facts, **JobFolder(spec.output_dir).outputs()},
        )
        return 0
    relay.channel.status("error", "Training failed", error="The Ray run ended without reporting how (see the job's worker.log)",
                         details={**relay.facts, "error_code": "internal_error"})
    return 1


def failed(relay: Relay, spec: WorkerSpec, exc: BaseException, sink: Any) -> int:
    """The run failed past what Ray Train retries: a worker's own error, or a lost worker."""
    import ray

    if relay.mirror is not None:
        relay.mirror.settle()  # the checkpoints stored before the loss are here
    details: dict[str, Any] = {**relay.facts, **JobFolder(spec.output_dir).outputs()}
    checkpoint = JobFolder(spec.output_dir).last_checkpoint()
    if checkpoint is not None:
        details["last_checkpoint"] = str(checkpoint)
    if relay.restarts:
        details["restarts"] = list(relay.restarts)
    text = "".join(traceback.format_exception(exc))
    cause = controller_failure(text)
    if cause is not None and relay.attempt == 1 and not ray.get(sink.workers.remote()):
        relay.channel.status(
            "error", "Training failed",
            error=f"Ray Train could not start the run on the cluster: {cause}. It keeps the run's state in"
            f" {redacted(relay.storage)} first: check that the nodes can write there (for a URI, credentials in the"
            " environment each node's `ray start` was given; docs/SCALE-OUT.md, section 5).",
            details={**details, "error_code": "storage_unavailable" if cause.startswith("OSError") else "training_failed"},
        )
        return 1
    lost = lost_workers(ray.get(sink.workers.remote()), relay.attempt, sink)
    failures = ray.get(sink.failures.remote())
    if failures and not lost:  # a worker's own error (when one is lost, the others' errors follow from it)
        last = failures[-1]
        relay.channel.status("error", "Training failed", error=f"{where(last).capitalize()}: {last['error']}",
                             details={**details, "error_code": last["error_code"]})
        return 1
    reason = str(exc).strip().splitlines()
    cause = next((line.strip() for line in reason if "died" in line.lower() or "lost" in line.lower()), reason[0] if reason else type(exc).__name__)
    spent = (f"after {relay.max_failures} restart{'s' if relay.max_failures != 1 else ''} (max_failures)"
             if relay.max_failures else "and max_failures is 0, so the run is not restarted")
    kept = f" Its last checkpoint is {checkpoint}: start the job again with resume_from_checkpoint {spec.job_id!r} to go on." if checkpoint else ""
    relay.channel.status(
        "error", "Training failed",
        error=f"A Ray worker was lost: {lost or 'see the cause below'}; the run failed {spent}.{kept} Ray said: {cause}",
        details={**details, "error_code": "worker_died", "lost_workers": lost},
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
