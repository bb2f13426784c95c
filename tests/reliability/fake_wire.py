"""The wire as the stand-in children here speak it (fake_worker.py, fake_export_worker.py).

    spec, stop = begin()   the spec (the first line on stdin), and an Event that is set
                           when "stop" arrives or stdin ends (the server went away)
    send(message)          one JSON message on stdout

Each fake keeps its own `status()`: what a status carries differs between them.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def begin() -> tuple[dict[str, Any], threading.Event]:
    """Read the spec, then listen for a stop on a thread."""
    spec: dict[str, Any] = json.loads(sys.stdin.readline())
    stop = threading.Event()

    def listen() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                stop.set()
        stop.set()  # the server went away

    threading.Thread(target=listen, daemon=True).start()
    return spec, stop
