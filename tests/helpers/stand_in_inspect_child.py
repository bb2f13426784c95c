"""A stand-in for the dataset inspection child (tests/unit/test_inspector.py):
`python -m tests.helpers.stand_in_inspect_child`.

It reads the request line like the real child, writes its pid to `pid_file`, then
does what `act` says: "hang" (sleeps until killed), "crash" (says why on stderr and
exits 3), or "answer" (answers `inspection` as the real child does).

A request as a server sends it (a `DatasetInspectRequest`, which has no `act`:
tests/reliability/test_disconnect.py) names its act in `model_name`,
"stand-in/<act>" ("answer" when it names none), and is answered with the least
inspection a server takes; it has no `pid_file` (the server knows its child).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def main() -> int:
    request = json.loads(sys.stdin.readline())
    if "pid_file" in request:
        with open(request["pid_file"], "w") as handle:
            handle.write(str(os.getpid()))
    act = request["act"] if "act" in request else act_named(request)
    if act == "hang":
        while True:
            time.sleep(1)
    if act == "crash":
        print("stand-in: the tokenizer exploded", file=sys.stderr)
        return 3
    inspection = request.get("inspection", {"ok": True, "max_seq_length": request.get("max_seq_length", 0)})
    print("a library's chatter on stdout before the answer")
    print(json.dumps({"type": "inspection", "inspection": inspection}))
    return 0


def act_named(request: dict[str, Any]) -> str:
    """The act a server's request names in its `model_name` ("stand-in/hang"), or "answer"."""
    prefix, _, act = str(request.get("model_name") or "").partition("stand-in/")
    return act if not prefix and act else "answer"


if __name__ == "__main__":
    sys.exit(main())
