"""OpenAI's (legacy) completions route (docs/API.md, Completions): POST /v1/completions over
every model /v1/models lists, served by the chat child's batched engine as chat is.

Each prompt (a text, or token ids used as given), times `n`, is one answer in the chat
child (`InferenceManager.complete`), where they decode together; choice `i * n + j` is
prompt i's j-th, as OpenAI orders them. The child gives each token's log-probability and
top alternatives from one log_softmax (inference/logprobs.py), the prompt's own under
`echo` (`prompt_logprobs`), and the end-of-text token that ends an answer too
(`eos_logprobs`), as OpenAI's completions list it; this module only puts them in OpenAI's
legacy shape `{tokens, token_logprobs, top_logprobs, text_offset}`:

- `top_logprobs[i]` is `{token: logprob}`: the `logprobs` most likely tokens, and the
  chosen one beside them (OpenAI's "up to logprobs + 1"); the prompt's first token has
  none (`null`), nothing coming before it;
- the echoed prompt is the text its tokens spell (their bytes, as UTF-8): the prompt
  itself with a byte-level tokenizer, and a BOS the model puts first leads it;
- `text_offset[i]` is where token i starts in the choice's text, in characters, counted
  over the tokens' bytes (so a token that is part of a character starts where it does).

Streamed (`stream: true`), each choice's lines come in turn (choice 0's, then 1's; all
of them decode together meanwhile): the echoed prompt first, then the answer as it
grows, then its `finish_reason`; `usage` last with `stream_options.include_usage`,
then `data: [DONE]`.
"""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Optional

from fastapi import APIRouter, Response, status
from fastapi.responses import JSONResponse

from finetune_studio.api.deps import Responses, StudioDep
from finetune_studio.api.request_scoped import RequestScopedRoute, request_scoped
from finetune_studio.api.routes.chat import (
    DONE,
    OPENAI_ERRORS,
    answer_text,
    error_line,
    error_of,
    finish_reason,
    raise_if_failed,
    wait_for_llama_build,
)
from finetune_studio.api.served_models import resolve_model
from finetune_studio.api.streaming import BoundedEventStream
from finetune_studio.openai_wire import Completion, CompletionChoice, CompletionLogprobs, CompletionRequest, Usage
from finetune_studio.supervisor.inference import Generation
from finetune_studio.text import clean_text

router = APIRouter(prefix="/v1", tags=["openai"], route_class=RequestScopedRoute)
SEEDS = 2**64  # seeds run 0 to SEEDS - 1; choice j of a prompt draws with seed + j

_STREAM: Responses = {
    status.HTTP_200_OK: {
        "description": "A `text_completion`, or with `stream: true` Server-Sent Events: `data: <text_completion>` lines"
        " closed by `data: [DONE]`",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}


@router.post("/completions", response_model=Completion, responses={**_STREAM, **OPENAI_ERRORS})
@request_scoped
async def completions(body: CompletionRequest, studio: StudioDep) -> Response:
    """OpenAI's completions over a trained job or a base model: `echo` with `logprobs` gives the
    prompt's own log-probabilities (what lm-evaluation-harness's `local-completions` asks)."""
    model = resolve_model(studio.service.store, body.model)
    params = body.sampling()
    if body.logprobs is not None:
        params["logprobs"] = params["eos_logprobs"] = True
        params["top_logprobs"] = body.logprobs
    if body.echo:  # the prompt's tokens spell the echoed text, with or without their logprobs
        params["prompt_logprobs"] = True
        params["top_logprobs"] = body.logprobs or 0
    await wait_for_llama_build(model)
    n = body.n or 1
    generations: list[Generation] = []
    streaming = False

    def close() -> None:
        for generation in generations:
            generation.close()

    try:
        for prompt in body.prompts:
            for j in range(n):
                seeded = params if body.seed is None or not j else {**params, "seed": (body.seed + j) % SEEDS}
                generations.append(await studio.inference.complete(model, prompt, seeded))
        starts = []
        for generation in generations:
            started = await generation.next()
            raise_if_failed(started)
            starts.append(started)
        choices = [_Choice(index, started, body.echo, body.logprobs) for index, started in enumerate(starts)]
        prompt_tokens = sum(int(started.get("prompt_tokens", 0)) for started in starts[::n])
        head = _Head(generations[0].id, int(time.time()), body.model)
        if body.stream:
            lines = _lines(generations, choices, head, prompt_tokens, body.include_usage)
            response = BoundedEventStream(lines, stall_seconds=studio.settings.stream_stall_seconds, on_close=close,
                                          headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            streaming = True  # the stream owns the generations now: it closes them however it ends
            return response
        completion_tokens = 0
        for generation, choice in zip(generations, choices, strict=True):
            while (message := await generation.next()).get("type") == "delta":
                choice.add(message)
            if message.get("type") != "done":
                raise error_of(message)
            choice.finish = finish_reason(message)
            completion_tokens += int((message.get("usage") or {}).get("completion_tokens", 0))
        answer = head.completion([choice.whole() for choice in choices], _usage(prompt_tokens, completion_tokens))
        return JSONResponse(answer.model_dump(mode="json"))
    finally:
        if not streaming:
            close()  # a no-op once the answers are complete; otherwise it cancels them in the child


@dataclass(frozen=True)
class _Head:
    """What every line of one answer says alike."""

    id: str
    created: int
    model: str

    def completion(self, choices: list[CompletionChoice], usage: Optional[Usage] = None) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)


class _Offsets:
    """Characters so far of a text spelled by tokens' bytes: where each token starts."""

    def __init__(self, start: int = 0) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.chars = start
        self.text = ""

    def place(self, raw: bytes) -> int:
        """The offset `raw`'s token starts at (a token in the middle of a character: that character's)."""
        at = self.chars
        decoded = self._decoder.decode(raw)
        self.text += decoded
        self.chars += len(decoded)
        return at

    def finish(self) -> str:
        self.text += self._decoder.decode(b"", final=True)
        return self.text


class _Choice:
    """One choice's text and logprobs as they grow (see the module's docstring)."""

    def __init__(self, index: int, started: dict[str, Any], echo: bool, logprobs: Optional[int]) -> None:
        self.index = index
        self.logprobs = None if logprobs is None else CompletionLogprobs()
        self.finish: Optional[str] = None
        self.text = ""
        self._sent = 0  # characters of `text` already streamed
        self._logprobs_sent = 0
        prompt = _Offsets()
        for entry in (started.get("prompt_logprobs") or []) if echo else []:
            self._token(entry, prompt)
        self.text = clean_text(prompt.finish())
        self._answer = _Offsets(len(self.text))

    def add(self, delta: dict[str, Any]) -> None:
        self.text += answer_text(delta)
        for entry in delta.get("logprobs") or []:
            self._token(entry, self._answer)

    def _token(self, entry: dict[str, Any], offsets: _Offsets) -> None:
        at = offsets.place(bytes(entry.get("bytes") or []))
        if self.logprobs is None:
            return
        logprob = entry.get("logprob")
        top: Optional[dict[str, float]] = None
        if logprob is not None:
            top = {}
            for other in [*(entry.get("top_logprobs") or []), entry]:  # two tokens of one text: the likelier is named
                top.setdefault(clean_text(str(other.get("token", ""))), float(other["logprob"]))
        self.logprobs.tokens.append(clean_text(str(entry.get("token", ""))))
        self.logprobs.token_logprobs.append(None if logprob is None else float(logprob))
        self.logprobs.top_logprobs.append(top)
        self.logprobs.text_offset.append(at)

    def whole(self) -> CompletionChoice:
        return CompletionChoice(text=self.text, index=self.index, logprobs=self.logprobs,
                                finish_reason="length" if self.finish == "length" else "stop")

    def news(self) -> CompletionChoice:
        """What was added since the last call, for a streamed line."""
        text, self._sent = self.text[self._sent :], len(self.text)
        logprobs = None
        if self.logprobs is not None:
            start, self._logprobs_sent = self._logprobs_sent, len(self.logprobs.tokens)
            logprobs = CompletionLogprobs(tokens=self.logprobs.tokens[start:], token_logprobs=self.logprobs.token_logprobs[start:],
                                          top_logprobs=self.logprobs.top_logprobs[start:],
                                          text_offset=self.logprobs.text_offset[start:])
        return CompletionChoice(text=text, index=self.index, logprobs=logprobs)


async def _lines(generations: list[Generation], choices: list[_Choice], head: _Head, prompt_tokens: int,
                 include_usage: bool) -> AsyncIterator[bytes]:
    completion_tokens = 0
    for generation, choice in zip(generations, choices, strict=True):
        if choice.text or (choice.logprobs is not None and choice.logprobs.tokens):  # the echoed prompt
            yield _sse(head.completion([choice.news()]))
        while True:
            message = await generation.next()
            kind = message.get("type")
            if kind == "delta":
                choice.add(message)
                yield _sse(head.completion([choice.news()]))
            elif kind == "done":
                last = choice.news()
                last.finish_reason = finish_reason(message)
                completion_tokens += int((message.get("usage") or {}).get("completion_tokens", 0))
                yield _sse(head.completion([last]))
                break
            else:
                yield error_line(message)
                return
    if include_usage:
        yield _sse(head.completion([], _usage(prompt_tokens, completion_tokens)))
    yield DONE


def _usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens)


def _sse(chunk: Completion) -> bytes:
    data = chunk.model_dump(mode="json")
    if chunk.usage is None:
        del data["usage"]
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"
