"""The wire as the stand-in children here speak it (stand_in_worker.py, stand_in_export_worker.py).

    spec, stop = begin()   the spec (the first line on stdin), and a Stop: an Event that is
                           set when "stop" arrives or stdin ends (the server went away);
                           `stop.requested` says which (True: a stop arrived)
    send(message)          one JSON message on stdout

Each stand-in keeps its own `status()`: what a status carries differs between them.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any


class Stop(threading.Event):
    """Set by a stop or by the end of stdin; `requested` once a stop arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.requested = False


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def begin() -> tuple[dict[str, Any], Stop]:
    """Read the spec, then listen for a stop on a thread."""
    spec: dict[str, Any] = json.loads(sys.stdin.readline())
    stop = Stop()

    def listen() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                stop.requested = True
                stop.set()
        stop.set()  # the server went away

    threading.Thread(target=listen, daemon=True).start()
    return spec, stop
