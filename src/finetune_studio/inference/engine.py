"""The requests and the scheduler: one step loop over every unfinished answer, which
decodes the running answers in batches.

The child's one thread calls `Engine.step()` again and again, and feeds commands
in between steps (`handle`). A step does two things:

1. **Decode.** Every running answer advances by one token. The answers on one
   transformers base decode together, in one batch (batch.py): one forward pass for
   all of them, each row through its own adapter (peft's mixed-adapter batches,
   `adapter_names`; the base's rows through none). peft mixes no DoRA adapter with
   others, so each DoRA adapter's answers make a batch of their own; a llama.cpp
   model's answers (gguf.py) are not batched, and take a forward pass each. Each
   row's token is chosen from its own row of the logits with its request's own
   parameters and `torch.Generator` (sampling.py), so that an answer is what it is
   alone: greedy, the tokens `generate(do_sample=False)` gives for it; seeded, the
   same draw whatever runs beside it. Nothing of one answer reaches another: each
   row's padding is masked, its positions are its own, and its adapter is chosen
   for its row.
2. **Admit.** Waiting requests start, in arrival order, while fewer than
   `max_batch_size` answers run (each one's KV cache is the bulk of its memory) and
   the step's PREFILL_TOKENS_PER_STEP last (at least one starts). A start loads what
   the request needs (the base, its adapter) and reads the prompt (`started`); then
   the prompts that start in the step on one base and lane are prefilled together, in
   one left-padded forward pass into a cache of their own (batch.py's `prefill`; a
   request alone, and a llama.cpp model's, by itself), which yields each one's first
   token; they then join their batch, from the next step on. So a new request waits
   for no answer to finish, only for the step under way, and a long prompt holds the
   running answers up for one step. Prompts whose every position's logits are wanted
   (prompt logprobs) are prefilled apart from those that want the last one's only, and
   prompts that begin as kept ones (prefix.py) apart from the rest, together when as many
   of their tokens come after the kept start (each on a copy of its kept columns). A
   prompt whose every token but the last is kept (an evaluation's answer, asked after
   its row's loss pass) has no prefill at all: it joins its batch on a copy of those
   columns, and its last token runs in the next decode step, beside the others' tokens.

An answer that ends (its end-of-turn token, a stop string, max_tokens), fails or is
cancelled leaves its batch at once: its row and its cache columns are dropped
before the next forward pass (a cancel, at once). Loading a model happens when its
first request starts and holds the others up for as long as it takes (seconds,
once per base).

Log-probabilities (logprobs.py), when a request asks, come from the logits the step
computed anyway: one `log_softmax` per step over the rows that asked, and over
the prompt's positions at the prefill.
"""

from __future__ import annotations

import math
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional, Union, cast

import torch

from finetune_studio import failures
from finetune_studio.inference import logprobs
from finetune_studio.inference.batch import Batch, BatchedModel, prefill
from finetune_studio.inference.chat_model import BaseKey, ChatModel
from finetune_studio.inference.failures import RequestFailed
from finetune_studio.inference.pool import ModelPool
from finetune_studio.inference.prefix import Kept, PrefixCache, seed_rows
from finetune_studio.inference.sampling import make_generator, next_token
from finetune_studio.inference.text import TextStream
from finetune_studio.wire import MAX_TOP_LOGPROBS, ModelRef, TokenLogprob

Emit = Callable[[dict[str, Any]], None]

# Answers running at once when the child is not told (--max-batch-size; the server's
# FINETUNE_STUDIO_MAX_BATCH_SIZE).
MAX_BATCH_SIZE = 16
# Prompt tokens prefilled in one step, at most (but one prompt always is): more
# requests that arrive together start in the steps after, between decode steps.
PREFILL_TOKENS_PER_STEP = 2048
# How often, at most, the child says how it decodes (`stats`, for the server's /metrics): one
# line a second while answers run, and one when the last of them ends.
STATS_SECONDS = 1.0


@dataclass
class Params:
    """A request's sampling parameters, checked (`SamplingParams` on the wire)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: Optional[int] = None
    stop: list[str] = field(default_factory=list)
    seed: Optional[int] = None
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: bool = False
    eos_logprobs: bool = False

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
        # 0: the prompt's own logprobs, and no answer (/v1/completions' echo).
        fewest = 0 if raw.get("prompt_logprobs") is True else 1
        if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < fewest):
            raise RequestFailed("invalid_request", f"max_tokens must be at least {fewest}, not {max_tokens!r}", "max_tokens")
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
        for name in ("logprobs", "prompt_logprobs", "eos_logprobs"):
            value = raw.get(name) or False
            if not isinstance(value, bool):
                raise RequestFailed("invalid_request", f"{name} must be true or false, not {value!r}", name)
            setattr(params, name, value)
        top = raw.get("top_logprobs") or 0
        if not _is_int(top) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise RequestFailed("invalid_request", f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, not {top!r}",
                                "top_logprobs")
        if top and not (params.logprobs or params.prompt_logprobs):
            raise RequestFailed("invalid_request", "top_logprobs needs logprobs (or prompt_logprobs) to be true", "top_logprobs")
        params.top_logprobs = top
        return params


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_prompt(raw: Any) -> Union[str, list[int]]:
    """A completion's prompt: a text, or token ids (checked against the vocabulary at the start)."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list) and raw and all(_is_int(token) and token >= 0 for token in raw):
        return [int(token) for token in raw]
    raise RequestFailed("invalid_request", "prompt must be a text or a non-empty list of token ids (integers, 0 or more)", "prompt")


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
    messages: Optional[list[dict[str, str]]]  # a chat; None: a completion of `prompt`
    params: Params
    prompt: Union[str, list[int], None] = None
    run: Optional[Running] = None  # from its start on; None while it waits
    entry: Optional[ChatModel] = None  # held from its start until it ends
    adapter: Optional[str] = None  # the adapter's name in `entry`; None: the base


@dataclass
class Running:
    """What is a started answer's own: its generator, its text, and its place in a
    batch (or, decoded alone, its own KV cache)."""

    entry: ChatModel
    adapter: Optional[str]
    generator: torch.Generator
    stream: TextStream
    prompt_tokens: int
    max_tokens: int
    batch: Optional[Batch] = None  # None: decoded alone, in `cache`
    cache: Any = None
    seen: int = 0  # tokens in `cache`
    completion: list[int] = field(default_factory=list)
    # What the next decode step runs before the answer has a token: the prompt's last token, for
    # a prompt that joined its batch with every other token's keys and values kept (prefix.py).
    last_prompt_token: Optional[int] = None

    @property
    def next_input(self) -> int:
        """The token the next decode step runs on this answer's row."""
        if self.completion:
            return self.completion[-1]
        if self.last_prompt_token is None:  # never: a row decodes once it has a token, or a prompt's last to run
            raise RequestFailed("internal_error", "an answer with no token was decoded")
        return self.last_prompt_token


class Engine:
    """Every request the child was given and has not finished; see the module's docstring."""

    def __init__(self, emit: Emit, *, max_loaded: int = 1, idle_seconds: float = 600.0,
                 max_batch_size: int = MAX_BATCH_SIZE, pool: Optional[ModelPool] = None) -> None:
        self._emit = emit
        self.pool = pool or ModelPool(max_loaded, idle_seconds)
        self.max_batch_size = max(1, max_batch_size)
        self._requests: dict[str, Request] = {}  # every unfinished request, in arrival order
        self._batches: dict[tuple[BaseKey, str], Batch] = {}  # per base and lane (ChatModel.batch_lane)
        self.prefixes = PrefixCache()  # recent prompts' keys and values (prefix.py)
        # What the next `stats` line reports: tokens decoded and seconds spent in steps since the
        # last one, the widest step among them, and when the last one went.
        self._stats_tokens = 0
        self._stats_seconds = 0.0
        self._stats_widest = 0
        self._stats_sent = 0.0  # when the report under way began (its first step)

    @property
    def busy(self) -> bool:
        return bool(self._requests)

    @property
    def running(self) -> int:
        """Requests started and not finished (at most max_batch_size)."""
        return sum(1 for request in self._requests.values() if request.run is not None)

    @property
    def waiting(self) -> list[str]:
        """The requests not started yet, in the order they start."""
        return [request.id for request in self._requests.values() if request.run is None]

    @property
    def decode_batches(self) -> list[Batch]:
        """The batches that decode now, one per base and lane."""
        return list(self._batches.values())

    def batches(self) -> list[list[str]]:
        """The requests of each decode batch, row by row."""
        return [batch.members for batch in self._batches.values()]

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
            self._forget_unloaded()
        elif isinstance(command, dict) and isinstance(command.get("id"), str):
            self._failed(command["id"], RequestFailed("invalid_request", f"unknown command type {kind!r}"))
        else:
            print(f"ignored a command that is not understood: {str(command)[:200]}", file=sys.stderr)

    def submit(self, command: dict[str, Any]) -> None:
        """Take a `generate` command; it starts at the next step that has room for it."""
        request_id = command.get("id")
        if not isinstance(request_id, str) or not request_id:
            print("ignored a generate command without an id", file=sys.stderr)
            return
        if request_id in self._requests:
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
            if "prompt" in command:
                request = Request(request_id, BaseKey.of(ref), adapter, None, Params.parse(command.get("params")),
                                  _parse_prompt(command.get("prompt")))
            else:
                request = Request(request_id, BaseKey.of(ref), adapter, _parse_messages(command.get("messages")),
                                  Params.parse(command.get("params")))
        except RequestFailed as exc:
            self._failed(request_id, exc)
            return
        self._requests[request_id] = request

    def cancel(self, request_id: str) -> None:
        """Stop generating `request_id` (its client went away); nothing more is sent for it,
        and its row leaves its batch now."""
        request = self._requests.get(request_id)
        if request is not None:
            batch = request.run.batch if request.run is not None else None
            self._close(request)
            if batch is not None:
                batch.compact()
            if self._stats_tokens and not self.running:  # the steps until now, reported with the last answer's end
                self._report()

    # -- the loop -------------------------------------------------------------

    def step(self) -> None:
        """One step: every running request advances by one token, then waiting ones start."""
        began = time.monotonic()
        decoding = sum(len(batch.members) for batch in self._batches.values()) + sum(
            1 for r in self._requests.values() if r.run is not None and r.run.batch is None)
        self._decode()
        if decoding:
            self._count_step(decoding, time.monotonic() - began)
        elif self._stats_tokens and not self.running:  # the last answers were cancelled or failed
            self._report()

    def _count_step(self, rows: int, seconds: float) -> None:
        """Count a step that decoded `rows` answers; say so (`stats`) once a second, and when the
        last answer has ended: {"type": "stats", "batch_size": the widest step's answers,
        "tokens": tokens decoded, "seconds": time in those steps, "running": answers running now}."""
        now = time.monotonic()
        if not self._stats_tokens:  # a report's second starts with its first step
            self._stats_sent = now - seconds
        self._stats_tokens += rows
        self._stats_seconds += seconds
        self._stats_widest = max(self._stats_widest, rows)
        if now - self._stats_sent >= STATS_SECONDS or not self.running:
            self._report()

    def _report(self) -> None:
        self._emit({"type": "stats", "batch_size": self._stats_widest, "tokens": self._stats_tokens,
                    "seconds": round(self._stats_seconds, 6), "running": self.running})
        self._stats_tokens, self._stats_seconds, self._stats_widest = 0, 0.0, 0

    def _decode(self) -> None:
        for batch in list(self._batches.values()):
            self._decode_batch(batch)
        for request in [r for r in self._requests.values() if r.run is not None and r.run.batch is None]:
            try:
                self._decode_alone(request, _running(request))
            except Exception as exc:  # noqa: BLE001 - one request's failure must not end the others
                self._fail(request, _failure(exc))
        self._admit()

    def unload_idle(self) -> None:
        self.pool.unload_idle()
        self._forget_unloaded()

    def _forget_unloaded(self) -> None:
        """Drop the kept prompts of models no longer loaded (their tensors would outlive them)."""
        if len(self.prefixes):
            self.prefixes.forget([entry for key in self.pool.loaded if (entry := self.pool.get(key)) is not None])

    def seconds_until_idle(self) -> Optional[float]:
        return self.pool.seconds_until_idle()

    # -- decoding ---------------------------------------------------------------

    def _decode_batch(self, batch: Batch) -> None:
        requests = [self._requests[request_id] for request_id in batch.members]
        if not requests:
            return
        runs = [_running(request) for request in requests]
        try:
            logits = batch.forward([run.next_input for run in runs])
        except Exception as exc:  # noqa: BLE001 - which row failed cannot be told: the batch's requests fail, the others go on
            failure = _failure(exc)
            for request in requests:
                self._fail(request, failure)
            return
        tokens, described = self._choose(requests, runs, logits)
        for request, run, token, entry in zip(requests, runs, tokens, described, strict=True):
            try:
                self._accept(request, run, token, entry)
            except Exception as exc:  # noqa: BLE001 - one request's failure must not end the others
                self._fail(request, _failure(exc))
        batch.compact()

    def _decode_alone(self, request: Request, run: Running) -> None:
        logits = run.entry.forward([run.completion[-1]], run.cache, run.seen, run.adapter)
        run.seen += 1
        tokens, described = self._choose([request], [run], logits.view(1, -1))
        self._accept(request, run, tokens[0], described[0])

    @staticmethod
    def _choose(requests: list[Request], runs: list[Running], logits: torch.Tensor) -> tuple[list[int], list[Optional[TokenLogprob]]]:
        """Each row's next token, chosen from its row of `logits` (`[rows, vocab]`, float32)
        as its request asks, and its logprobs when asked (one log_softmax for all)."""
        greedy: list[int] = logits.argmax(dim=-1).tolist()
        tokens = [
            greedy[row] if request.params.temperature == 0
            else next_token(logits[row], request.params.temperature, request.params.top_p, run.generator)
            for row, (request, run) in enumerate(zip(requests, runs, strict=True))
        ]
        described: list[Optional[TokenLogprob]] = [None] * len(requests)
        # The end-of-turn token is not part of the answer's text, nor of a chat's logprobs (a completion's, it is).
        asking = [row for row, (request, run) in enumerate(zip(requests, runs, strict=True))
                  if request.params.logprobs and (request.params.eos_logprobs or tokens[row] not in run.entry.eos_ids)]
        if asking:
            rows = logits if len(asking) == len(requests) else logits.index_select(
                0, torch.tensor(asking, dtype=torch.long, device=logits.device))
            found = logprobs.entries(rows, [tokens[row] for row in asking],
                                     [requests[row].params.top_logprobs for row in asking], runs[asking[0]].entry.token_bytes)
            for row, entry in zip(asking, found, strict=True):
                described[row] = entry
        return tokens, described

    # -- starting -----------------------------------------------------------------

    def _admit(self) -> None:
        """Start waiting requests, in order, while there is room (see the module's docstring):
        those of one base and lane prefill together, one forward pass for all of them."""
        budget = PREFILL_TOKENS_PER_STEP
        room = self.max_batch_size - self.running
        groups: dict[tuple[Any, ...], list[tuple[Request, list[int]]]] = {}
        starts: dict[str, tuple[Kept, int]] = {}  # the requests that begin as a kept prompt, and how many tokens
        if any(r.run is None for r in self._requests.values()):
            self._forget_unloaded()  # a model the pool unloaded to load another
        for request in [r for r in self._requests.values() if r.run is None]:
            if budget <= 0 or room <= 0:
                break
            try:
                prompt = self._prepare(request)
            except Exception as exc:  # noqa: BLE001 - one request's failure must not end the others
                self._fail(request, _failure(exc))
                continue
            room -= 1
            run = _running(request)
            lane = run.entry.batch_lane(run.adapter)
            start = None if lane is None or request.params.prompt_logprobs else self.prefixes.longest(
                run.entry, request.adapter_folder, prompt)
            budget -= len(prompt) - (start[1] if start is not None else 0)
            # Apart: a model that does not batch; prompts that begin as kept ones (prefilled on copies of
            # them) by how many tokens come after, so that every row runs as many; and a prompt whose every
            # position's logits are wanted with one that wants the last only (those logits are the bulk of
            # a long prompt's memory).
            if lane is None:
                key: tuple[Any, ...] = (request.id,)
            elif start is not None and start[1] == len(prompt) - 1 and run.max_tokens > 0:
                # All but its last token kept: it joins its batch now, and that token runs in the next
                # decode step with the others' (whose logits choose its first token): no pass of its own.
                try:
                    self._join_on_kept(request, prompt, start)
                except Exception as exc:  # noqa: BLE001 - one request's failure must not end the others
                    self._fail(request, _failure(exc))
                continue
            elif start is not None:
                key = (run.entry.key, lane, "kept", len(prompt) - start[1])
                starts[request.id] = start
            else:
                key = (run.entry.key, lane, request.params.prompt_logprobs)
            groups.setdefault(key, []).append((request, prompt))
        for group in groups.values():
            try:
                if len(group) == 1:
                    self._prefill_alone(*group[0], starts.get(group[0][0].id))
                else:
                    self._prefill_together(group, [starts[r.id] for r, _ in group] if group[0][0].id in starts else None)
            except Exception as exc:  # noqa: BLE001 - the prefill's requests fail, the others go on
                failure = _failure(exc)
                for request, _ in group:
                    self._fail(request, failure)

    def _prepare(self, request: Request) -> list[int]:
        """Load what the request needs, read its prompt (`started`), make its run; the prompt's tokens."""
        entry = request.entry = self.pool.acquire(request.base)
        if request.adapter_folder is not None:
            request.adapter = entry.use_adapter(request.adapter_folder)
        prompt = _prompt_ids(request, entry)
        params = request.params
        max_tokens = self._max_tokens(len(prompt), params.max_tokens, entry.context_length,
                                      "messages" if request.messages is not None else "prompt")
        if not params.prompt_logprobs:  # at once; with prompt logprobs, once the prefill has them
            self._emit({"type": "started", "id": request.id, "prompt_tokens": len(prompt)})
        request.run = Running(
            entry=entry,
            adapter=request.adapter,
            generator=make_generator(entry.device, params.seed),
            stream=TextStream(entry.decode, params.stop),
            prompt_tokens=len(prompt),
            max_tokens=max_tokens,
        )
        return prompt

    def _prefilled(self, request: Request, prompt: list[int], logits: torch.Tensor) -> Optional[torch.Tensor]:
        """Say what a prefill's `logits` (the last position's, or every position's with prompt
        logprobs) give the request before its first token: the last position's logits, or
        None when the request is over (its prompt's logprobs were all it asked for)."""
        run = _running(request)
        if request.params.prompt_logprobs:
            self._emit({"type": "started", "id": request.id, "prompt_tokens": len(prompt), "prompt_logprobs":
                        logprobs.prompt_entries(logits, prompt, request.params.top_logprobs, run.entry.token_bytes)})
            logits = logits[-1]
        if run.max_tokens == 0:
            self._finish(request, run, "length")
            return None
        return logits

    def _prefill_alone(self, request: Request, prompt: list[int], start: Optional[tuple[Kept, int]] = None) -> None:
        """Prefill one prompt in a cache of its own (on a copy of the kept prompt it begins as, `start`),
        choose the first token, join the batch (if any)."""
        run = _running(request)
        entry = run.entry
        lane = entry.batch_lane(run.adapter)
        cache = entry.new_cache(len(prompt) + run.max_tokens)
        seen = 0
        if start is not None:
            seen = start[1]
            seed_rows(cache, [start])
        logits = entry.forward(prompt[seen:], cache, seen, run.adapter, all_positions=request.params.prompt_logprobs)
        if lane is not None:
            self.prefixes.keep(entry, request.adapter_folder, prompt, cache)
        last = self._prefilled(request, prompt, logits)
        if last is None:
            return
        if lane is None:
            run.cache, run.seen = cache, len(prompt)
        tokens, described = self._choose([request], [run], last.view(1, -1))
        self._accept(request, run, tokens[0], described[0])
        if lane is not None and request.id in self._requests:  # not finished at its first token: it joins its batch
            run.batch = self._batch(entry, lane)
            run.batch.join(request.id, run.adapter, cache, len(prompt))

    def _join_on_kept(self, request: Request, prompt: list[int], start: tuple[Kept, int]) -> None:
        """Join a prompt whose every token but the last is kept to its batch, on a copy of those
        columns; its last token is its row's input at the next decode step."""
        run = _running(request)
        cache = run.entry.new_cache(len(prompt) + run.max_tokens)
        seed_rows(cache, [start])
        run.last_prompt_token = prompt[-1]
        run.batch = self._batch(run.entry, cast(str, run.entry.batch_lane(run.adapter)))
        run.batch.join(request.id, run.adapter, cache, start[1])

    def _prefill_together(self, group: list[tuple[Request, list[int]]], starts: Optional[list[tuple[Kept, int]]] = None) -> None:
        """Prefill the prompts of one base and lane in one left-padded forward pass (batch.py),
        choose each one's first token, and join the batch with the rows not finished. `starts`:
        the kept prompt each begins as and how many of its tokens to reuse (prefix.py), the same
        number of tokens after them in every row."""
        requests = [request for request, _ in group]
        runs = [_running(request) for request in requests]
        entry = runs[0].entry
        lane = cast(str, entry.batch_lane(runs[0].adapter))
        model = cast(BatchedModel, entry)
        cache = entry.new_cache(0)
        seeded = seed_rows(cache, starts) if starts else None
        rest = [prompt[held:] for (_, prompt), held in zip(group, seeded, strict=True)] if seeded else [prompt for _, prompt in group]
        rows, logits = prefill(model, [r.id for r in requests], [run.adapter for run in runs], rest, cache,
                               all_positions=requests[0].params.prompt_logprobs, seeded=seeded)
        for row, (request, prompt) in enumerate(group):
            self.prefixes.keep(entry, request.adapter_folder, prompt, cache, row, rows.pads[row])
        going: list[int] = []  # the rows that go on after the prefill
        last: list[torch.Tensor] = []
        for row, (request, prompt) in enumerate(group):
            found = self._prefilled(request, prompt, logits[row, rows.pads[row]:] if logits.dim() == 3 else logits[row])
            if found is None:
                rows.leave(request.id)
            else:
                going.append(row)
                last.append(found)
        if not going:
            return
        tokens, described = self._choose([requests[row] for row in going], [runs[row] for row in going], torch.stack(last))
        for row, token, entry_logprob in zip(going, tokens, described, strict=True):
            try:
                self._accept(requests[row], runs[row], token, entry_logprob)
            except Exception as exc:  # noqa: BLE001 - one request's failure must not end the others
                self._fail(requests[row], _failure(exc))
        for row in going:
            if requests[row].id not in self._requests:  # finished (or failed) at its first token
                rows.leave(requests[row].id)
        batch = self._batch(entry, lane)
        batch.merge(rows)
        for row in going:
            if requests[row].id in self._requests:
                runs[row].batch = batch

    def _batch(self, entry: ChatModel, lane: str) -> Batch:
        """The decode batch of a base and lane, made if there is none."""
        batch = self._batches.get((entry.key, lane))
        if batch is None:
            batch = self._batches[(entry.key, lane)] = Batch(cast(BatchedModel, entry))
        return batch

    @staticmethod
    def _max_tokens(prompt: int, wanted: Optional[int], context: int, what: str = "messages") -> int:
        """The answer's tokens at most; `what` names the prompt (a chat's `messages`, a completion's `prompt`)."""
        if prompt > context or (prompt == context and wanted != 0):
            raise RequestFailed(
                "context_length_exceeded",
                f"The {what} {'are' if what == 'messages' else 'is'} {prompt} tokens long, and this model's context is"
                f" {context} tokens, which must also hold the answer; shorten the {what}.",
                what,
            )
        if wanted is not None and prompt + wanted > context:
            raise RequestFailed(
                "context_length_exceeded",
                f"The {what} ({prompt} tokens) and max_tokens ({wanted}) come to {prompt + wanted} tokens, over this"
                f" model's context of {context} tokens; ask for at most {context - prompt} tokens.",
                "max_tokens",
            )
        return wanted if wanted is not None else context - prompt

    # -- one token ----------------------------------------------------------------

    def _accept(self, request: Request, run: Running, token: int, entry: Optional[TokenLogprob]) -> None:
        """Take the chosen token and say what it changes."""
        run.completion.append(token)
        if token in run.entry.eos_ids:
            if entry is not None:  # a completion lists the token that ended it
                self._emit({"type": "delta", "id": request.id, "text": "", "logprobs": [entry]})
            self._finish(request, run, "stop")
            return
        delta = run.stream.push(token)
        if delta or entry is not None:
            message: dict[str, Any] = {"type": "delta", "id": request.id, "text": delta}
            if entry is not None:
                message["logprobs"] = [entry]
            self._emit(message)
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
        if request.id in self._requests:
            self._failed(request.id, exc)
            self._close(request)

    def _failed(self, request_id: str, exc: RequestFailed) -> None:
        self._emit({"type": "failed", "id": request_id, "code": exc.code, "message": exc.message, "param": exc.param})

    def _close(self, request: Request) -> None:
        """The request is over: its row leaves its batch (its memory goes at the batch's
        next compact), and what it held is released."""
        self._requests.pop(request.id, None)
        run, request.run = request.run, None
        if run is not None and run.batch is not None:
            run.batch.leave(request.id)
            if not len(run.batch):  # an empty batch holds nothing: not even the model
                self._batches = {key: batch for key, batch in self._batches.items() if batch is not run.batch}
                run.batch.compact()
        entry, request.entry = request.entry, None
        if entry is not None:
            if request.adapter is not None:
                entry.release_adapter(request.adapter)
            self.pool.release(entry)


def _prompt_ids(request: Request, entry: ChatModel) -> list[int]:
    """The prompt's tokens: the chat template's over the messages, the text's, or the ids as given."""
    if request.messages is not None:
        try:
            return entry.prompt_ids(request.messages)
        except Exception as exc:  # noqa: BLE001 - the template is the model's code; what it refuses is the messages
            raise RequestFailed("invalid_request", f"the model's chat template refused these messages: {exc}", "messages") from None
    if isinstance(request.prompt, str):
        ids = entry.encode(request.prompt)
        if not ids:
            raise RequestFailed("invalid_request", "the prompt has no tokens: send some text (or token ids)", "prompt")
        return ids
    ids = list(request.prompt or [])
    outside = [token for token in ids if token >= entry.vocab_size]
    if outside:
        raise RequestFailed("invalid_request", f"the prompt's token ids must be below this model's vocabulary size of"
                            f" {entry.vocab_size}; {outside[0]} is not", "prompt")
    return ids


def _running(request: Request) -> Running:
    if request.run is None:  # never: only started requests are decoded
        raise RequestFailed("internal_error", f"request {request.id} is decoded before it started")
    return request.run


def _failure(exc: BaseException) -> RequestFailed:
    """What a request that raised `exc` ends with (an unexpected error is logged, traceback and all)."""
    if isinstance(exc, RequestFailed):
        return exc
    traceback.print_exception(exc)
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if failures.cause_of(exc) == "out_of_memory":
        return RequestFailed("internal_error", f"Out of memory while answering ({text}). {failures.advice('out_of_memory', 'chat')}")
    return RequestFailed("internal_error", f"Generation failed: {type(exc).__name__}: {text}")
