"""Experiment trackers of a run (the request's `report_to`): MLflow and Trackio, logged by the
studio itself so that a tracker's run holds exactly what the job's events say.

W&B and TensorBoard (`enable_wandb`, `enable_tensorboard`, or named in `report_to`) stay with
transformers' own integrations (recipe.py). MLflow and Trackio are logged here instead:

- the parameters are the request's settings (secrets removed), not the trainer's arguments;
- each step's metrics are the very numbers of the job's `progress` event (ProgressCallback
  hands every event it sends to `Trackers.log_step`), so the tracker and the page agree;
- where the run went (the tracker's run id, and its URL where it has one) is in
  `details.trackers`, on every status from `training` on, for the page to link to.

A tracker never costs the run: one that is not installed, not configured or not reachable is
a warning (in `details.warnings`) and the run goes on without it. MLflow's client would retry
an unreachable server 5 times with 120 s timeouts, so the child sets
MLFLOW_HTTP_REQUEST_MAX_RETRIES=0 and MLFLOW_HTTP_REQUEST_TIMEOUT=5 unless the user's
environment says otherwise, and asks the server once before the run (the probe). Metrics are
sent by one thread of their own, so a slow tracker never delays a training step; a tracker
that fails mid-run is warned about once and left.
"""

from __future__ import annotations

import json
import math
import os
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any, Optional
from urllib.parse import urlsplit

from finetune_studio.bounds import excerpt
from finetune_studio.schemas import TrainingStartRequest
from finetune_studio.uris import redacted

# The trackers logged here; the others of `report_to` go to transformers (recipe.py).
OWN_TRACKERS = ("mlflow", "trackio")
# MLflow's client settings the child sets unless the user's environment has them.
MLFLOW_CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
DEFAULT_PROJECT = "finetune-studio"  # the experiment (MLflow) or project (Trackio) of a run without project_name
MAX_PARAM_CHARS = 6000  # MLflow's limit on a parameter's value
MLFLOW_BATCH = 100  # MLflow takes at most 100 parameters in one log_batch
FINISH_WAIT_SECONDS = 30.0  # how long the end of a run waits for the metrics still queued

# The numbers of a `progress` event that are step metrics (the rest say where the step is).
STEP_METRICS = ("loss", "learning_rate", "grad_norm", "epoch", "num_tokens", "tokens_per_second", "mfu",
                "mean_token_accuracy", "eval_loss", "eval_mean_token_accuracy", "memory_bytes", "gpu_memory_bytes")


def wanted_trackers(request: TrainingStartRequest) -> list[str]:
    """Every tracker the request asks for, once each: `report_to` and the Studio's two flags."""
    names: list[str] = list(dict.fromkeys(request.report_to))
    for flag, name in ((request.enable_wandb, "wandb"), (request.enable_tensorboard, "tensorboard")):
        if flag and name not in names:
            names.append(name)
    return names


def parameters(request: TrainingStartRequest) -> dict[str, str]:
    """The request's settings as a tracker's parameters: every known field but the secrets,
    lists and objects as JSON, each value within MLflow's limit."""
    found = {}
    for name, value in request.redacted().items():
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        found[name] = excerpt(text, MAX_PARAM_CHARS)
    return found


def step_metrics(progress: dict[str, Any]) -> dict[str, float]:
    """A progress event's metrics by name (its method's own, such as `rewards/margins`, too)."""
    found = {name: float(progress[name]) for name in STEP_METRICS if _finite(progress.get(name))}
    for name, value in (progress.get("metrics") or {}).items():
        if _finite(value):
            found.setdefault(name, float(value))
    return found


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {excerpt(text, 300)}" if text else type(exc).__name__


class TrackerRun:
    """One tracker's run: `log` a step, `end` the run. Where it went: `where`."""

    name = ""

    def __init__(self) -> None:
        self.where: dict[str, Any] = {}

    def log(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def end(self, outcome: str) -> None:
        raise NotImplementedError


class MlflowRun(TrackerRun):
    name = "mlflow"
    # How a job's end reads as an MLflow run status.
    STATUS = {"completed": "FINISHED", "stopped": "KILLED", "error": "FAILED"}

    def __init__(self, request: TrainingStartRequest, job_id: str, params: dict[str, str]) -> None:
        """Probes the tracking server (its first request) and opens the run; raises what went wrong."""
        super().__init__()
        uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
        if not uri:
            raise LookupError("MLFLOW_TRACKING_URI is not set (a server such as http://host:5000, or sqlite:///path/mlflow.db)")
        for name, value in MLFLOW_CLIENT_DEFAULTS.items():
            os.environ.setdefault(name, value)
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or request.project_name or DEFAULT_PROJECT
        # The probe: one request, with the short timeout and no retries.
        experiment = self.client.get_experiment_by_name(experiment_name)
        experiment_id = experiment.experiment_id if experiment is not None else self.client.create_experiment(experiment_name)
        run = self.client.create_run(experiment_id, run_name=job_id, tags={"finetune_studio.job_id": job_id})
        self.run_id: str = run.info.run_id
        items = [Param(key, value) for key, value in params.items()]
        for start in range(0, len(items), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=items[start:start + MLFLOW_BATCH])
        # A server's address without its credentials; a local store's (sqlite:////path) as it is.
        shown = redacted(uri) if urlsplit(uri).netloc else uri
        self.where = {"name": self.name, "run_id": self.run_id, "experiment_id": experiment_id,
                      "experiment": experiment_name, "tracking_uri": shown}
        if uri.startswith(("http://", "https://")):
            self.where["url"] = f"{shown.rstrip('/')}/#/experiments/{experiment_id}/runs/{self.run_id}"

    def log(self, step: int, metrics: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key, value, now, step) for key, value in metrics.items()])

    def end(self, outcome: str) -> None:
        self.client.set_terminated(self.run_id, self.STATUS.get(outcome, "FAILED"))


class TrackioRun(TrackerRun):
    name = "trackio"

    def __init__(self, request: TrainingStartRequest, job_id: str, params: dict[str, str]) -> None:
        super().__init__()
        import trackio
        from trackio.utils import TRACKIO_DIR

        project = request.project_name or DEFAULT_PROJECT
        # Local unless the user's environment names a Space or server (TRACKIO_SPACE_ID, ...);
        # no system metrics of its own (the events carry the memory).
        # The settings as they are (numbers, lists): Trackio keeps JSON, not only text.
        config = json.loads(json.dumps(request.redacted(), default=str))
        self.run = trackio.init(project=project, name=job_id, config=config, embed=False,
                                auto_log_cpu=False, auto_log_gpu=False)
        self.where = {"name": self.name, "project": project, "run": job_id,
                      "dir": str(os.environ.get("TRACKIO_DIR") or TRACKIO_DIR)}
        url = getattr(self.run, "url", None)
        if isinstance(url, str) and url.startswith(("http://", "https://")):
            self.where["url"] = url

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def end(self, outcome: str) -> None:
        self.run.finish()


OPENERS: dict[str, Callable[[TrainingStartRequest, str, dict[str, str]], TrackerRun]] = {
    "mlflow": MlflowRun, "trackio": TrackioRun}
INSTALL_HINT = "pip install 'finetune-studio[trackers]'"


class Trackers:
    """The run's MLflow and Trackio runs, fed by one thread of their own."""

    def __init__(self, runs: list[TrackerRun], warn: Callable[[str], None]) -> None:
        self.runs = runs
        self.warn = warn
        self.queue: queue.Queue[Optional[tuple[int, dict[str, float]]]] = queue.Queue()
        self.thread: Optional[threading.Thread] = None
        self.ended = False
        if runs:
            self.thread = threading.Thread(target=self._send, name="trackers", daemon=True)
            self.thread.start()

    @classmethod
    def open(cls, request: TrainingStartRequest, job_id: str, warn: Callable[[str], None],
             names: Optional[Iterable[str]] = None) -> Trackers:
        """The runs of the trackers asked for that could be opened; a warning for each that could not."""
        params = parameters(request)
        runs: list[TrackerRun] = []
        for name in names if names is not None else wanted_trackers(request):
            opener = OPENERS.get(name)
            if opener is None:
                continue
            try:
                runs.append(opener(request, job_id, params))
            except ImportError as exc:
                warn(f"report_to {name}: {exc.name or name} is not installed ({INSTALL_HINT}); the run is not logged to {name}")
            except Exception as exc:  # noqa: BLE001 - a tracker is never a reason to fail the run
                warn(f"report_to {name}: the tracker could not be reached or refused the run ({_reason(exc)});"
                     f" the run is not logged to {name}")
        return cls(runs, warn)

    def details(self) -> list[dict[str, Any]]:
        """Where the run is logged, for `details.trackers`."""
        return [run.where for run in self.runs]

    def log_step(self, progress: dict[str, Any]) -> None:
        """Queue a progress event's metrics (ProgressCallback, as it sends the event)."""
        if self.thread is None or self.ended:
            return
        metrics = step_metrics(progress)
        if metrics:
            self.queue.put((int(progress["step"]), metrics))

    def _send(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            step, metrics = item
            for run in list(self.runs):
                try:
                    run.log(step, metrics)
                except Exception as exc:  # noqa: BLE001 - training goes on without this tracker
                    self.warn(f"report_to {run.name}: logging step {step} failed ({_reason(exc)}); no more steps are logged to it")
                    self.runs.remove(run)

    def end(self, outcome: str) -> None:
        """Send what is queued and end each run as the job ended ("completed", "stopped", "error")."""
        if self.thread is None or self.ended:
            return
        self.ended = True
        self.queue.put(None)
        self.thread.join(FINISH_WAIT_SECONDS)
        if self.thread.is_alive():
            self.warn(f"report_to: the trackers took more than {FINISH_WAIT_SECONDS:g} s to take the last steps; they may miss some")
            return
        for run in self.runs:
            try:
                run.end(outcome)
            except Exception as exc:  # noqa: BLE001 - the run has ended; the tracker's record of it is all that is missing
                self.warn(f"report_to {run.name}: the run could not be marked as ended ({_reason(exc)})")
