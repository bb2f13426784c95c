"""A stand-in training child for supervisor tests: speaks the wire, trains nothing.

    python -m tests.unit.scripted_worker --job-id ID   (behaviour from the request's
    `project_name`: "stubborn" ignores stop and SIGTERM; "crash" exits with code 3
    mid-training; anything else stops cleanly when asked)
"""

from __future__ import annotations

import json
import signal
import sys
import time


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def status(phase: str, **details: object) -> None:
    send({"type": "status", "phase": phase, "message": phase, "details": details})


def main() -> int:
    spec = json.loads(sys.stdin.readline())
    mode = spec["request"].get("project_name") or "polite"
    for phase in ("loading_model", "loading_dataset", "configuring", "training"):
        status(phase)
    send({"type": "progress", "progress": {"step": 1, "total_steps": 10, "loss": 1.0, "learning_rate": 0.1, "progress_percent": 10.0}})
    if mode == "crash":
        return 3
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)
    for line in sys.stdin:
        if line.strip() == "stop":
            status("stopped", adapter_dir="none")
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
