"""A stand-in for the dataset inspection child (tests/unit/test_inspector.py).

It reads the request line like the real child, writes its pid to `pid_file`, then
does what `act` says: "hang" (sleeps until killed), "crash" (says why on stderr and
exits 3), or "answer" (answers `inspection` as the real child does).
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    request = json.loads(sys.stdin.readline())
    with open(request["pid_file"], "w") as handle:
        handle.write(str(os.getpid()))
    if request["act"] == "hang":
        while True:
            time.sleep(1)
    if request["act"] == "crash":
        print("stand-in: the tokenizer exploded", file=sys.stderr)
        return 3
    print("a library's chatter on stdout before the answer")
    print(json.dumps({"type": "inspection", "inspection": request["inspection"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
