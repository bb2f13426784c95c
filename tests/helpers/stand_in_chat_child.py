"""A stand-in inference child for the chat routes' tests: speaks the wire of
`finetune_studio.wire` (bottom), loads no model.

    python -m tests.helpers.stand_in_chat_child --max-loaded N --idle-seconds S

It answers by echoing the last user message word by word ("a b c" -> "a ", "b ",
"c"), one word per request per turn, round-robin over every active request as the
real child does, and honours `max_tokens` ("length") and `stop` ("stop", text cut
before it). Its context is 64 "tokens" (words of every message). Special last user
messages:

- `__model__`: answers with the request's ModelRef as JSON (what the server resolved);
- `__params__`: answers with the request's sampling params as JSON;
- `__by_adapter__ A | B`: echoes A for a model with an adapter (a job's), B for one without (a
  base), so an evaluation of a job against its base sees two models answer apart;
- a completion (`prompt`, /v1/completions): no answer; with `prompt_logprobs` asked, each
  prompt word a token (logprob -0.5, the first null);
- with `logprobs` asked: each word (a token here) has logprob -0.5, and its
  `top_logprobs` alternatives are `alt1`, `alt2`... at -1.0, -1.5 ...;
- `forever`: "tick " every 10 ms until max_tokens or a cancel;
- `hang`: starts, then never says anything more (until cancelled); it logs
  `holding <id>`, so a test knows which request to see cancelled;
- `fail internal`: a `failed` message with code internal_error.

It logs every command to stderr (the server's inference.log): `cancelled <id>`,
`unloaded`, `args <argv>`, `holding <id>`; tests read the log to see what the child was told.
"""

from __future__ import annotations

import json
import queue
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

CONTEXT = 64


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def note(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


@dataclass
class Request:
    id: str
    words: list[str]
    prompt_tokens: int
    max_tokens: Optional[int]
    stops: list[str]
    forever: bool = False
    hang: bool = False
    text: str = ""
    emitted: int = 0  # characters of `text` already sent
    tokens: int = 0
    next_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    top_logprobs: Optional[int] = None  # None: no logprobs asked for
    pending: list[dict[str, Any]] = field(default_factory=list)  # the logprobs of words not sent yet


def read_commands(commands: queue.Queue[Optional[dict[str, Any]]]) -> None:
    for line in sys.stdin:
        if line.strip():
            commands.put(json.loads(line))
    commands.put(None)  # EOF: the server is gone


def prompt_words(prompt: Any) -> list[str]:
    """A /v1/completions prompt as this child's tokens: a text's words with the spaces after
    them, or token ids as they are (each id's text its digits and a space)."""
    if isinstance(prompt, list):
        return [f"{token} " for token in prompt]
    return re.findall(r"\S+\s*|\s+", str(prompt))


def start_completion(command: dict[str, Any]) -> Request:
    """A completion (/v1/completions): the prompt's tokens, with their logprobs when asked (each
    -0.5 but the first's, null; the alternatives as for an answer); no answer is made, and the
    prompt "hang" is held (`holding <id>`) until it is cancelled."""
    params = command["params"]
    words = prompt_words(command["prompt"])
    top = int(params.get("top_logprobs") or 0)
    started: dict[str, Any] = {"type": "started", "id": command["id"], "prompt_tokens": len(words)}
    if params.get("prompt_logprobs"):
        entries = []
        for index, word in enumerate(words):
            entry = {**logprob(word, 1), "top_logprobs": [logprob(f"alt{rank}", rank + 1) for rank in range(1, top + 1)]}
            if index == 0:
                entry["logprob"], entry["top_logprobs"] = None, []
            entries.append(entry)
        started["prompt_logprobs"] = entries
    send(started)
    hang = isinstance(command["prompt"], str) and command["prompt"].strip() == "hang"
    if hang:  # held until cancelled, as a chat answer to "hang" is
        note(f"holding {command['id']}")
    return Request(command["id"], [], len(words), params["max_tokens"], [], hang=hang,
                   top_logprobs=top if params.get("logprobs") else None)


def start(command: dict[str, Any]) -> Optional[Request]:
    if "prompt" in command:
        return start_completion(command)
    messages = command["messages"]
    last = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    params = command["params"]
    prompt_tokens = sum(len(m["content"].split()) + 1 for m in messages)
    max_tokens = params["max_tokens"]
    if prompt_tokens + (max_tokens or 0) > CONTEXT:
        param = "messages" if prompt_tokens >= CONTEXT else "max_tokens"
        send({"type": "failed", "id": command["id"], "code": "context_length_exceeded", "param": param,
              "message": f"the prompt ({prompt_tokens} tokens) and max_tokens ({max_tokens}) exceed the context of {CONTEXT}"})
        return None
    if last == "fail internal":
        send({"type": "failed", "id": command["id"], "code": "internal_error", "param": None, "message": "the fake child failed on purpose"})
        return None
    if last == "__model__":
        words = [json.dumps(command["model"], sort_keys=True)]
    elif last == "__params__":
        words = [json.dumps(params, sort_keys=True)]
    else:
        if last.startswith("__by_adapter__ ") and " | " in last:
            tuned, base = last[len("__by_adapter__ "):].split(" | ", 1)
            last = tuned if (command.get("model") or {}).get("adapter") else base
        split = last.split(" ")
        words = [word + " " for word in split[:-1]] + [split[-1]]
    send({"type": "started", "id": command["id"], "prompt_tokens": prompt_tokens})
    if last == "hang":
        note(f"holding {command['id']}")
    stops = [] if last in ("__model__", "__params__") else list(params["stop"])  # the JSON answered whole
    return Request(command["id"], words, prompt_tokens, max_tokens or CONTEXT - prompt_tokens, stops,
                   forever=last == "forever", hang=last == "hang",
                   top_logprobs=int(params.get("top_logprobs") or 0) if params.get("logprobs") else None)


def logprob(word: str, rank: int) -> dict[str, Any]:
    return {"id": rank, "token": word, "bytes": list(word.encode()), "logprob": -0.5 * rank}


def step(request: Request) -> bool:
    """One token of the request; True when it is finished."""
    if request.forever:
        word = "tick "
    elif request.tokens < len(request.words):
        word = request.words[request.tokens]
    else:
        finish(request, "stop")
        return True
    request.tokens += 1
    request.text += word
    if request.top_logprobs is not None:  # each word is a token: logprob -0.5, alternatives "alt1"... below it
        request.pending.append({**logprob(word, 1), "top_logprobs": [logprob(f"alt{rank}", rank + 1)
                                                                      for rank in range(1, request.top_logprobs + 1)]})
    for stop in request.stops:
        at = request.text.find(stop)
        if at >= 0:
            request.text = request.text[:at]
            flush(request)
            finish(request, "stop")
            return True
    flush(request)
    if request.max_tokens is not None and request.tokens >= request.max_tokens:
        finish(request, "length")
        return True
    return False


def flush(request: Request) -> None:
    # Hold back what could still become a stop string, as the real child does.
    hold = max((len(stop) - 1 for stop in request.stops), default=0)
    upto = max(request.emitted, len(request.text) - hold)
    if upto > request.emitted:
        send_delta(request, request.text[request.emitted:upto])
        request.emitted = upto


def send_delta(request: Request, text: str) -> None:
    message: dict[str, Any] = {"type": "delta", "id": request.id, "text": text}
    if request.top_logprobs is not None:
        message["logprobs"], request.pending = request.pending, []
    send(message)


def finish(request: Request, reason: str) -> None:
    if len(request.text) > request.emitted or request.pending:
        send_delta(request, request.text[request.emitted:])
    usage = {"prompt_tokens": request.prompt_tokens, "completion_tokens": request.tokens,
             "total_tokens": request.prompt_tokens + request.tokens}
    send({"type": "done", "id": request.id, "finish_reason": reason, "usage": usage})


def main() -> int:
    note(f"args {' '.join(sys.argv[1:])}")
    commands: queue.Queue[Optional[dict[str, Any]]] = queue.Queue()
    threading.Thread(target=read_commands, args=(commands,), daemon=True).start()
    active: dict[str, Request] = {}
    send({"type": "ready"})
    while True:
        working = [r for r in active.values() if not r.hang]
        try:
            command = commands.get(timeout=0.005) if working else commands.get()
        except queue.Empty:
            command = {}
        if command is None:
            return 0
        kind = command.get("type")
        if kind == "generate":
            request = start(command)
            if request is not None:
                active[request.id] = request
        elif kind == "cancel":
            if active.pop(command["id"], None) is not None:
                note(f"cancelled {command['id']}")
        elif kind == "unload":
            note("unloaded")
        now = time.monotonic()
        for request in list(active.values()):  # one token each, in turn
            if request.hang or (request.forever and now < request.next_at):
                continue
            request.next_at = now + 0.01
            if step(request):
                del active[request.id]


if __name__ == "__main__":
    sys.exit(main())
