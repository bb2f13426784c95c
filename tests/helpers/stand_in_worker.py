"""The stand-in training child: speaks the wire (docs/PROCESSES.md), trains nothing.

    python -m tests.helpers.stand_in_worker --job-id ID

Its request's `project_name` names a script; any other name, or none, is a run:

    (a run)   every phase, then `max_steps` progress events (3 by default), then
              `completed`; asked to stop, it ends `stopped` after the current step (a
              stop during the last step: the training is done, `completed`, as a real
              child). The environment shapes it (below).
    polite    every phase, one step (of 10), then it waits: a stop ends it `stopped`
              (adapter_dir "none"); the end of stdin (the server went away) ends it
              saying nothing
    gated     as polite, but it holds in training before its step until the file `go`
              appears in its job folder (or a stop arrives, or stdin ends)
    stubborn  as polite, but it ignores the stop and SIGTERM: SIGKILL ends it
    crash     as polite, but it exits with code 3 after its step

Every status's details carry `worker_pid`, as the real child's do. A run's environment:

    FAKE_WORKER_LOG     a file: "start ID" and "end ID" lines are appended to it
    FAKE_WORKER_GO      a file: the worker waits for it to exist before its first step
    FAKE_WORKER_STEP_S  seconds per step (default 0)
    FAKE_WORKER_LINGER  when set, it does not exit after its last status (and ignores SIGTERM)
    FAKE_WORKER_CHECKPOINTS  when set, a stop saves checkpoints/checkpoint-<step> (as a pause needs),
                        and a request's resume_from_checkpoint starts after that step
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tests.helpers.stand_in_wire import Stop, begin, send

SCRIPTS = ("polite", "gated", "stubborn", "crash")
PHASES = ("loading_model", "loading_dataset", "configuring")  # then training


def status(phase: str, **details: object) -> None:
    send({"type": "status", "phase": phase, "message": phase, "details": {"worker_pid": os.getpid(), **details}})


def progress(step: int, total: int, loss: float, learning_rate: float) -> None:
    send({"type": "progress", "progress": {"step": step, "total_steps": total, "loss": loss,
                                           "learning_rate": learning_rate, "progress_percent": 100.0 * step / total}})


def note(job_id: str, what: str) -> None:
    log = os.environ.get("FAKE_WORKER_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"{what} {job_id}\n")


def hold_forever() -> None:
    """Never exit on its own, whatever is asked (SIGKILL ends it)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)


def scripted(spec: dict[str, Any], stop: Stop, script: str) -> int:
    for phase in (*PHASES, "training"):
        status(phase)
    go = Path(spec["output_dir"]) / "go"
    while script == "gated" and not go.exists() and not stop.wait(0.01):
        pass
    if not stop.is_set():
        progress(1, 10, loss=1.0, learning_rate=0.1)
    if script == "crash":
        return 3
    if script == "stubborn":
        hold_forever()
    stop.wait()
    if stop.requested:
        status("stopped", adapter_dir="none")
    return 0


def run(spec: dict[str, Any], stop: Stop) -> int:
    job_id = spec["job_id"]
    note(job_id, "start")
    steps = int(spec["request"].get("max_steps") or 3)
    pause = float(os.environ.get("FAKE_WORKER_STEP_S", "0"))
    for phase in PHASES:
        status(phase)
    go = os.environ.get("FAKE_WORKER_GO")
    while go and not Path(go).exists() and not stop.is_set():
        time.sleep(0.01)
    checkpoints = bool(os.environ.get("FAKE_WORKER_CHECKPOINTS"))
    resume = spec["request"].get("resume_from_checkpoint")
    step = int(Path(resume).name.removeprefix("checkpoint-")) if checkpoints and resume else 0
    status("training", total_steps=steps)
    while step < steps and not stop.is_set():
        step += 1
        time.sleep(pause)
        progress(step, steps, loss=1.0 / step, learning_rate=1e-3)
    note(job_id, "end")
    details: dict[str, object] = {"steps": step}
    stopped = stop.is_set() and step < steps  # a stop during the last step: the training is done (as a real child)
    if checkpoints and stopped and step:
        saved = Path(spec["output_dir"]) / "checkpoints" / f"checkpoint-{step}"
        saved.mkdir(parents=True, exist_ok=True)
        (saved / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        details["last_checkpoint"] = str(saved)
    status("stopped" if stopped else "completed", **details)
    if os.environ.get("FAKE_WORKER_LINGER"):
        hold_forever()
    return 0


def main() -> int:
    spec, stop = begin()
    script = spec["request"].get("project_name")
    return scripted(spec, stop, script) if script in SCRIPTS else run(spec, stop)


if __name__ == "__main__":
    sys.exit(main())
