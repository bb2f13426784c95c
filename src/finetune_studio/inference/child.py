"""Entry point of the chat child:
`python -m finetune_studio.inference.child [--max-loaded N] [--idle-seconds S] [--precision auto|bf16|fp32]
[--max-batch-size N]`.

The wire is `finetune_studio.wire` ("the inference child"): commands on stdin,
one JSON object a line; messages on stdout, one JSON object a line, and nothing
else (whatever a library prints goes to stderr, the server's inference.log).

Two threads: one reads stdin into a queue (so a command arrives while an answer is
being generated); the main thread owns the models and everything written to
stdout, and runs the engine: it takes the commands waiting, runs one step, and
again. With nothing to answer it sleeps on the queue until a command comes or a
loaded model's idle time is up. EOF on stdin means the server is gone: it exits.
`ready` is sent before torch is imported, so the server knows at once that the
child runs; commands sent meanwhile wait in the queue.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
from typing import IO, TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from finetune_studio.inference.engine import Engine

_EOF = object()


class ServerGone(BaseException):
    """stdout is closed: nobody reads the answers any more. A BaseException, as
    SystemExit is: it ends the child, and no request's error handling may keep it."""


class Outbox:
    """Writes one JSON message per line to the server."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def send(self, message: dict[str, Any]) -> None:
        try:
            self._stream.write(json.dumps(message) + "\n")
            self._stream.flush()
        except (BrokenPipeError, ValueError, OSError) as exc:
            raise ServerGone(str(exc)) from None


def read_commands(stream: IO[str], commands: queue.Queue[object]) -> threading.Thread:
    """Parse stdin's lines into `commands` on a daemon thread; `_EOF` at the end."""

    def read() -> None:
        for line in stream:
            if not line.strip():
                continue
            try:
                commands.put(json.loads(line))
            except ValueError:
                print(f"ignored a line that is not JSON: {line[:200]!r}", file=sys.stderr)
        commands.put(_EOF)

    thread = threading.Thread(target=read, name="command-reader", daemon=True)
    thread.start()
    return thread


def serve(engine: Engine, commands: queue.Queue[object]) -> None:
    """The main loop: commands, one step, again; returns at EOF."""
    while True:
        for command in _waiting(commands, engine):
            if command is _EOF:
                return
            engine.handle(command)
        engine.step()
        engine.unload_idle()


def _waiting(commands: queue.Queue[object], engine: Engine) -> list[object]:
    """The commands that arrived; when there is nothing to generate, wait for one
    (or until a model's idle time is up)."""
    found: list[object] = []
    if not engine.busy:
        timeout: Optional[float] = engine.seconds_until_idle()
        try:
            found.append(commands.get(timeout=timeout))
        except queue.Empty:
            return found
    while True:
        try:
            found.append(commands.get_nowait())
        except queue.Empty:
            return found


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="finetune_studio.inference.child")
    parser.add_argument("--max-loaded", type=int, default=1, help="base models kept loaded at most (0: none kept)")
    parser.add_argument("--idle-seconds", type=float, default=600.0,
                        help="unload a model unused this long (0: never)")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                        help="the dtype transformers models answer in (auto: bf16 where it is native)")
    parser.add_argument("--max-batch-size", type=int, default=16,
                        help="answers decoded at once (one batch per base); more wait their turn, in order")
    args = parser.parse_args(argv)
    if args.max_loaded < 0:
        parser.error("--max-loaded must be 0 or more")
    if args.max_batch_size < 1:
        parser.error("--max-batch-size must be 1 or more")

    # Keep stdout for messages only: anything a library prints goes to the log.
    outbox = Outbox(os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, encoding="utf-8"))
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    commands: queue.Queue[object] = queue.Queue()
    read_commands(open(sys.stdin.fileno(), encoding="utf-8", closefd=False), commands)  # stdin, as UTF-8 whatever the locale
    try:
        outbox.send({"type": "ready"})
        from finetune_studio.inference.engine import Engine  # torch: after `ready`
        from finetune_studio.inference.models import set_precision

        set_precision(args.precision)

        serve(Engine(outbox.send, max_loaded=args.max_loaded, idle_seconds=args.idle_seconds,
                     max_batch_size=args.max_batch_size), commands)
    except ServerGone as exc:
        print(f"the server stopped reading ({exc}); exiting", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
