"""The real chat child process, over its real pipes: ready, started, delta, done;
`cancel` stops an answer; EOF on stdin ends the child."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import pytest

# Bounds on waiting for a message, so that a broken child fails the test instead of
# hanging it (loading torch and the model on a busy machine takes seconds).
MESSAGE_WAIT_SECONDS = 120


class Child:
    """`python -m finetune_studio.inference.child`, its stdout read on a thread."""

    def __init__(self, log: Path, *args: str) -> None:
        self._log = log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "finetune_studio.inference.child", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
        )
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        assert self.process.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.messages.put(json.loads(line))  # every stdout line is a protocol message

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def next(self) -> dict[str, Any]:
        try:
            return self.messages.get(timeout=MESSAGE_WAIT_SECONDS)
        except queue.Empty:
            raise AssertionError(f"no message from the child in {MESSAGE_WAIT_SECONDS} s") from None

    def until(self, kind: str, request_id: str) -> list[dict[str, Any]]:
        """Messages up to and including the first `kind` message of `request_id`."""
        seen = []
        while True:
            message = self.next()
            seen.append(message)
            if message["type"] == kind and message.get("id") == request_id:
                return seen

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join(timeout=MESSAGE_WAIT_SECONDS)  # the pipe's end: EOF
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()
        self._log.close()


def generate(request_id: str, model: Path, max_tokens: int) -> dict[str, Any]:
    return {
        "type": "generate",
        "id": request_id,
        "model": {"base": {"kind": "folder", "location": str(model)}, "adapter": None, "trust_remote_code": False},
        "messages": [{"role": "user", "content": "Say something."}],
        "params": {"temperature": 0, "top_p": 1, "max_tokens": max_tokens, "stop": [], "seed": None},
    }


@pytest.mark.train
def test_the_child_answers_cancels_and_ends_at_eof(tiny_model: Path, tmp_path: Path) -> None:
    child = Child(tmp_path / "inference.log", "--max-loaded", "1", "--idle-seconds", "0")
    try:
        assert child.next() == {"type": "ready"}

        child.send(generate("first", tiny_model, max_tokens=4))
        first = child.until("done", "first")
        kinds = [m["type"] for m in first]
        assert kinds[0] == "started" and kinds[-1] == "done" and set(kinds[1:-1]) == {"delta"}, kinds
        assert first[0]["prompt_tokens"] > 0
        assert first[-1]["usage"]["completion_tokens"] == 4 and first[-1]["finish_reason"] == "length"

        # A long answer, cancelled once it runs; the commands are read in order, so
        # after the next request's `started` nothing more may come for it.
        child.send(generate("long", tiny_model, max_tokens=3000))
        child.until("delta", "long")
        child.send({"type": "cancel", "id": "long"})
        child.send(generate("after", tiny_model, max_tokens=3))
        before = child.until("started", "after")
        assert not [m for m in before if m["type"] != "delta" and m.get("id") == "long"], before
        rest = child.until("done", "after")
        assert all(m.get("id") == "after" for m in rest if m["type"] != "stats"), rest
        assert rest[-1]["usage"]["completion_tokens"] == 3
        # How it decodes (for /metrics): once the last answer has ended, the steps since the last report.
        stats = child.next()
        assert stats["type"] == "stats" and stats["batch_size"] == 1 and stats["running"] == 0, stats
        assert stats["tokens"] >= 2 and stats["seconds"] > 0, stats  # after's 2 decoded tokens at least (its first is the prefill's)

        assert child.process.stdin is not None
        child.process.stdin.close()
        assert child.process.wait(timeout=MESSAGE_WAIT_SECONDS) == 0
        assert child.messages.empty()
    finally:
        child.close()
