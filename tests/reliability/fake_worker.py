"""A stand-in training child for the load and fuzz tests: speaks the wire, trains nothing.

    python -m tests.reliability.fake_worker --job-id ID

It announces every phase, sends `max_steps` progress events (3 by default), and
completes; it stops after the current step when asked. The environment shapes it:

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

from tests.reliability.fake_wire import begin, send


def status(phase: str, **details: object) -> None:
    send({"type": "status", "phase": phase, "message": phase, "details": {"worker_pid": os.getpid(), **details}})


def note(job_id: str, what: str) -> None:
    log = os.environ.get("FAKE_WORKER_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"{what} {job_id}\n")


def main() -> int:
    spec, stop = begin()
    job_id = spec["job_id"]
    note(job_id, "start")
    steps = int(spec["request"].get("max_steps") or 3)
    pause = float(os.environ.get("FAKE_WORKER_STEP_S", "0"))
    for phase in ("loading_model", "loading_dataset", "configuring"):
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
        send({"type": "progress", "progress": {"step": step, "total_steps": steps, "loss": 1.0 / step,
                                               "learning_rate": 1e-3, "progress_percent": 100.0 * step / steps}})
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
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
