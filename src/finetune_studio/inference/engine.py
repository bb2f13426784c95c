"""The requests and the scheduler: one step loop over every unfinished answer.

The child's one thread calls `Engine.step()` again and again, and feeds commands
in between steps (`handle`). A step is one round-robin turn over the active
requests in arrival order, and each advances by exactly one forward pass: a new
request's turn loads what it needs (the base, its adapter), reads the prompt
(`started`) and runs the prefill, which yields its first token; every later turn
feeds the last token back and yields one more. So every concurrent answer gets
one token per turn: the two streams of a compare run grow side by side, and a
long answer does not keep a short one waiting.

Each request keeps its own KV cache and its own `torch.Generator`, and names its
adapter (or none) for each forward pass, so nothing of one answer can reach
another: a base and a fine-tuned answer that interleave give exactly what each
gives alone. The price of this simplicity is no batching: N answers cost N
forward passes per turn. Loading a model happens in its request's turn and holds
the others up for as long as it takes (seconds, once per base).
"""

from __future__ import annotations

import math
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional, cast

import torch

from finetune_studio import failures
from finetune_studio.inference.chat_model import BaseKey, ChatModel
from finetune_studio.inference.failures import RequestFailed
from finetune_studio.inference.pool import ModelPool
from finetune_studio.inference.sampling import make_generator, next_token
from finetune_studio.inference.text import TextStream
from finetune_studio.wire import ModelRef

Emit = Callable[[dict[str, Any]], None]



@dataclass
class Params:
    """A request's sampling parameters, checked (`SamplingParams` on the wire)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: Optional[int] = None
    stop: list[str] = field(default_factory=list)
    seed: Optional[int] = None

    @classmethod
    def parse(cls, raw: Any) -> Params:
        if not isinstance(raw, dict):
            raise RequestFailed("invalid_request", "params must be an object", "params")
        params = cls()
        temperature = raw.get("temperature", 1.0)
        if not _is_number(temperature) or not 0 <= temperature <= 2:
            raise RequestFailed("invalid_request", f"temperature must be a number from 0 to 2, not {temperature!r}", "temperature")
        params.temperature = float(temperature)
        top_p = raw.get("top_p", 1.0)
        if not _is_number(top_p) or not 0 < top_p <= 1:
            raise RequestFailed("invalid_request", f"top_p must be a number above 0 and at most 1, not {top_p!r}", "top_p")
        params.top_p = float(top_p)
        max_tokens = raw.get("max_tokens")
        if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
            raise RequestFailed("invalid_request", f"max_tokens must be at least 1, not {max_tokens!r}", "max_tokens")
        params.max_tokens = max_tokens
        stop = raw.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(item, str) for item in stop):
            raise RequestFailed("invalid_request", "stop must be a string or a list of strings", "stop")
        params.stop = stop
        seed = raw.get("seed")
        if seed is not None and not _is_int(seed):
            raise RequestFailed("invalid_request", f"seed must be an integer, not {seed!r}", "seed")
        params.seed = seed
        return params


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_messages(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise RequestFailed("invalid_request", "messages must be a non-empty list", "messages")
    for message in raw:
        if not (isinstance(message, dict) and isinstance(message.get("role"), str) and isinstance(message.get("content"), str)):
            raise RequestFailed("invalid_request", "each message must have a string role and a string content", "messages")
    return [{"role": m["role"], "content": m["content"]} for m in raw]


@dataclass
class Request:
    """One answer asked for: what the command said."""

    id: str
    base: BaseKey
    adapter_folder: Optional[str]
    messages: list[dict[str, str]]
    params: Params
    run: Optional[Running] = None  # from its first turn on
    entry: Optional[ChatModel] = None  # held from its first turn until it ends
    adapter: Optional[str] = None  # the adapter's name in `entry`; None: the base


@dataclass
class Running:
    """What is a started answer's own: its KV cache, generator and text."""

    entry: ChatModel
    adapter: Optional[str]
    cache: Any
    generator: torch.Generator
    stream: TextStream
    prompt_tokens: int
    max_tokens: int
    seen: int = 0  # tokens in the cache
    completion: list[int] = field(default_factory=list)


class Engine:
    """Every request the child was given and has not finished; see the module's docstring."""

    def __init__(self, emit: Emit, *, max_loaded: int = 1, idle_seconds: float = 600.0, pool: Optional[ModelPool] = None) -> None:
        self._emit = emit
        self.pool = pool or ModelPool(max_loaded, idle_seconds)
        self._active: dict[str, Request] = {}  # in arrival order: the round-robin order

    @property
    def busy(self) -> bool:
        return bool(self._active)

    # -- commands -------------------------------------------------------------

    def handle(self, command: Any) -> None:
        """One command from the server (a parsed line of stdin)."""
        kind = command.get("type") if isinstance(command, dict) else None
        if kind == "generate":
            self.submit(command)
        elif kind == "cancel":
            self.cancel(str(command.get("id")))
        elif kind == "unload":
            self.pool.unload_all()
        elif isinstance(command, dict) and isinstance(command.get("id"), str):
            self._failed(command["id"], RequestFailed("invalid_request", f"unknown command type {kind!r}"))
        else:
            print(f"ignored a command that is not understood: {str(command)[:200]}", file=sys.stderr)

    def submit(self, command: dict[str, Any]) -> None:
        """Take a `generate` command; it runs from the next step on."""
        request_id = command.get("id")
        if not isinstance(request_id, str) or not request_id:
            print("ignored a generate command without an id", file=sys.stderr)
            return
        if request_id in self._active:
            self._failed(request_id, RequestFailed("invalid_request", f"a request with id {request_id!r} is already running"))
            return
        try:
            raw_ref = command.get("model")
            if not isinstance(raw_ref, dict):
                raise RequestFailed("invalid_request", "model must be an object", "model")
            ref = cast(ModelRef, raw_ref)  # its fields are checked here and by BaseKey.of
            adapter = ref.get("adapter")
            if adapter is not None and not isinstance(adapter, str):
                raise RequestFailed("invalid_request", "model.adapter must be a folder or null", "model")
            request = Request(request_id, BaseKey.of(ref), adapter, _parse_messages(command.get("messages")),
                              Params.parse(command.get("params")))
        except RequestFailed as exc:
            self._failed(request_id, exc)
            return
        self._active[request_id] = request

    def cancel(self, request_id: str) -> None:
        """Stop generating `request_id` (its client went away); nothing more is sent for it."""
        request = self._active.get(request_id)
        if request is not None:
            self._close(request)

    # -- the loop -------------------------------------------------------------

    def step(self) -> None:
        """One turn: every active request advances by one forward pass."""
        for request in list(self._active.values()):
            try:
                if request.run is None:
                    self._start(request)
                else:
                    self._decode(request, request.run)
            except RequestFailed as exc:
                self._fail(request, exc)
            except Exception as exc:  # noqa: BLE001 - one request's failure must not end the others
                traceback.print_exc()
                self._fail(request, _unexpected(exc))

    def unload_idle(self) -> None:
        self.pool.unload_idle()

    def seconds_until_idle(self) -> Optional[float]:
        return self.pool.seconds_until_idle()

    # -- one request ------------------------------------------------------------

    def _start(self, request: Request) -> None:
        entry = request.entry = self.pool.acquire(request.base)
        if request.adapter_folder is not None:
            request.adapter = entry.use_adapter(request.adapter_folder)
        try:
            prompt = entry.prompt_ids(request.messages)
        except Exception as exc:  # noqa: BLE001 - the template is the model's code; what it refuses is the messages
            raise RequestFailed("invalid_request", f"the model's chat template refused these messages: {exc}", "messages") from None
        max_tokens = self._max_tokens(len(prompt), request.params.max_tokens, entry.context_length)
        self._emit({"type": "started", "id": request.id, "prompt_tokens": len(prompt)})
        run = request.run = Running(
            entry=entry,
            adapter=request.adapter,
            cache=entry.new_cache(len(prompt) + max_tokens),
            generator=make_generator(entry.device, request.params.seed),
            stream=TextStream(entry.decode, request.params.stop),
            prompt_tokens=len(prompt),
            max_tokens=max_tokens,
        )
        logits = entry.forward(prompt, run.cache, 0, run.adapter)
        run.seen = len(prompt)
        self._accept(request, run, logits)

    def _decode(self, request: Request, run: Running) -> None:
        logits = run.entry.forward([run.completion[-1]], run.cache, run.seen, run.adapter)
        run.seen += 1
        self._accept(request, run, logits)

    @staticmethod
    def _max_tokens(prompt: int, wanted: Optional[int], context: int) -> int:
        if prompt >= context:
            raise RequestFailed(
                "context_length_exceeded",
                f"The messages are {prompt} tokens long, and this model's context is {context} tokens, which must"
                " also hold the answer; shorten the messages.",
                "messages",
            )
        if wanted is not None and prompt + wanted > context:
            raise RequestFailed(
                "context_length_exceeded",
                f"The messages ({prompt} tokens) and max_tokens ({wanted}) come to {prompt + wanted} tokens, over this"
                f" model's context of {context} tokens; ask for at most {context - prompt} tokens.",
                "max_tokens",
            )
        return wanted if wanted is not None else context - prompt

    def _accept(self, request: Request, run: Running, logits: torch.Tensor) -> None:
        """Choose the next token and say what it changes."""
        params = request.params
        token = next_token(logits, params.temperature, params.top_p, run.generator)
        run.completion.append(token)
        if token in run.entry.eos_ids:
            self._finish(request, run, "stop")
            return
        delta = run.stream.push(token)
        if delta:
            self._emit({"type": "delta", "id": request.id, "text": delta})
        if run.stream.stopped:
            self._finish(request, run, "stop")
        elif len(run.completion) >= run.max_tokens:
            self._finish(request, run, "length")

    def _finish(self, request: Request, run: Running, reason: str) -> None:
        rest = run.stream.finish()
        if rest:
            self._emit({"type": "delta", "id": request.id, "text": rest})
        completion = len(run.completion)
        usage = {"prompt_tokens": run.prompt_tokens, "completion_tokens": completion,
                 "total_tokens": run.prompt_tokens + completion}
        self._emit({"type": "done", "id": request.id, "finish_reason": reason, "usage": usage})
        self._close(request)

    def _fail(self, request: Request, exc: RequestFailed) -> None:
        self._failed(request.id, exc)
        self._close(request)

    def _failed(self, request_id: str, exc: RequestFailed) -> None:
        self._emit({"type": "failed", "id": request_id, "code": exc.code, "message": exc.message, "param": exc.param})

    def _close(self, request: Request) -> None:
        self._active.pop(request.id, None)
        request.run = None  # its KV cache is the bulk of a request's memory
        entry, request.entry = request.entry, None
        if entry is not None:
            if request.adapter is not None:
                entry.release_adapter(request.adapter)
            self.pool.release(entry)


def _unexpected(exc: BaseException) -> RequestFailed:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if failures.cause_of(exc) == "out_of_memory":
        return RequestFailed("internal_error", f"Out of memory while answering ({text}). {failures.advice('out_of_memory', 'chat')}")
    return RequestFailed("internal_error", f"Generation failed: {type(exc).__name__}: {text}")
