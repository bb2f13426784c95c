"""A stand-in training child for supervisor tests: speaks the wire, trains nothing.

    python -m tests.unit.scripted_worker --job-id ID   (behaviour from the request's
    `project_name`: "stubborn" ignores stop and SIGTERM; "crash" exits with code 3
    mid-training; "gated" waits in training, before its first step, until the file
    `go` appears in its job folder or a stop arrives; anything else stops cleanly
    when asked)
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def status(phase: str, **details: object) -> None:
    send({"type": "status", "phase": phase, "message": phase, "details": details})


class StopListener:
    """Reads stdin on a thread: `requested` once "stop" arrives, `ended` on either
    that or the end of stdin (the server went away)."""

    def __init__(self) -> None:
        self.requested = False
        self.ended = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                self.requested = True
                break
        self.ended.set()


def main() -> int:
    spec = json.loads(sys.stdin.readline())
    mode = spec["request"].get("project_name") or "polite"
    stop = StopListener()
    for phase in ("loading_model", "loading_dataset", "configuring", "training"):
        status(phase)
    go = Path(spec["output_dir"]) / "go"
    while mode == "gated" and not go.exists() and not stop.ended.wait(0.01):
        pass
    if not stop.ended.is_set():
        send({"type": "progress", "progress": {"step": 1, "total_steps": 10, "loss": 1.0, "learning_rate": 0.1, "progress_percent": 10.0}})
    if mode == "crash":
        return 3
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)
    stop.ended.wait()
    if stop.requested:
        status("stopped", adapter_dir="none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
