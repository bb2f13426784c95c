"""The OpenAI-compatible chat routes (docs/API.md, Chat): GET /v1/models and
POST /v1/chat/completions (whole, or streamed as `chat.completion.chunk` lines
closed by `data: [DONE]`).

Generation runs in the inference child (`supervisor/inference.py`); a route sends
its request there and turns the child's messages into OpenAI's answer. A streamed
answer starts only once the child has read the prompt, so that a request it cannot
serve (an unloadable model, a prompt over the context) still gets its 4xx status.
The chat route is `@request_scoped` (api/request_scoped.py): a client that goes
away, while it waits or while its answer streams, takes its request with it (it
is cancelled in the child).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Optional

from fastapi import APIRouter, Response, status
from fastapi.responses import JSONResponse

from finetune_studio import llama_build
from finetune_studio.api.deps import Responses, StudioDep
from finetune_studio.api.request_scoped import RequestScopedRoute, request_scoped
from finetune_studio.api.served_models import resolve_model, served_models
from finetune_studio.api.streaming import BoundedEventStream
from finetune_studio.errors import InferenceUnavailable, InvalidChatRequest, ModelNotFound, OpenAIError
from finetune_studio.jobs.counters import Counters
from finetune_studio.openai_wire import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
    ErrorResponse,
    FinishReason,
    ModelList,
    TokenLogprob,
    TopLogprob,
    Usage,
    error_body,
)
from finetune_studio.supervisor.inference import Generation
from finetune_studio.text import clean_text
from finetune_studio.wire import ModelRef

router = APIRouter(prefix="/v1", tags=["openai"], route_class=RequestScopedRoute)
DONE = b"data: [DONE]\n\n"
log = logging.getLogger("finetune_studio.chat")
# A chat with an export's GGUF, asked for while llama.cpp's build runs in the
# background (llama_build.py), waits for it: looking again this often, at most this long.
LLAMA_BUILD_POLL_SECONDS = 2.0
LLAMA_BUILD_WAIT_SECONDS = 30 * 60.0

OPENAI_ERRORS: Responses = {
    status.HTTP_400_BAD_REQUEST: {"model": ErrorResponse, "description": "A bad parameter; `error.param` names it"},
    status.HTTP_404_NOT_FOUND: {"model": ErrorResponse, "description": "No such model, or a job with nothing to serve yet"},
    status.HTTP_503_SERVICE_UNAVAILABLE: {"model": ErrorResponse, "description": "The inference process died; the message says why"},
}
CHAT_STREAM: Responses = {
    status.HTTP_200_OK: {
        "description": "A `chat.completion`, or with `stream: true` Server-Sent Events: `data: <chat.completion.chunk>`"
        " lines closed by `data: [DONE]`",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}


@router.get("/models")
async def list_models(studio: StudioDep) -> ModelList:
    """The models this server serves: every job that saved an adapter or model (id = the job id),
    every GGUF file of a completed export (id = `<export id>/<file name>`, answered by llama.cpp),
    and every base model a job loaded (id = its `model_name`)."""
    return ModelList(data=served_models(studio.service.store))


@router.post("/chat/completions", response_model=ChatCompletion, responses={**CHAT_STREAM, **OPENAI_ERRORS})
@request_scoped
async def chat_completions(body: ChatCompletionRequest, studio: StudioDep) -> Response:
    """OpenAI's chat completion over a trained job or a base model. `temperature: 0` is greedy."""
    Counters.bump(studio.service.counters.chat_requests, "true" if body.stream else "false")
    model = resolve_model(studio.service.store, body.model)
    params = body.sampling()
    if body.logprobs:
        params["logprobs"] = True
        params["top_logprobs"] = body.top_logprobs or 0
    messages = [{"role": message.template_role, "content": message.text} for message in body.messages]
    await wait_for_llama_build(model)
    generation = await studio.inference.generate(model, messages, params)
    streaming = False
    try:
        started = await generation.next()
        raise_if_failed(started)
        created = int(time.time())
        if body.stream:
            chunks = _chunks(generation, body.model, created, int(started.get("prompt_tokens", 0)), body.include_usage,
                             bool(body.logprobs))
            response = BoundedEventStream(
                chunks,
                stall_seconds=studio.settings.stream_stall_seconds,
                on_close=generation.close,
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
            streaming = True  # the stream owns the generation now: it closes it however it ends
            return response
        answer = await _collect(generation, body.model, created, started, bool(body.logprobs))
        return JSONResponse(answer.model_dump(mode="json"))
    finally:
        if not streaming:
            generation.close()  # a no-op once the answer is complete; otherwise it cancels it in the child


async def wait_for_llama_build(model: ModelRef) -> None:
    """Return once a model llama.cpp answers can be loaded: at once, unless `llama_cpp` is
    not installed yet while its build runs in the background; then when the build ends
    (or after LLAMA_BUILD_WAIT_SECONDS). A client that goes away ends the wait
    (`@request_scoped`). Without llama_cpp after that, the chat child says how to install it."""
    if model.get("backend") != "llama_cpp":
        return
    deadline = time.monotonic() + LLAMA_BUILD_WAIT_SECONDS
    build = llama_build.llama_cpp_wait()
    if build is not None:
        log.info("a chat with %s waits for llama.cpp's build (log: %s)", model["base"]["location"], build.log)
    while build is not None and time.monotonic() < deadline:
        await asyncio.sleep(LLAMA_BUILD_POLL_SECONDS)
        build = llama_build.llama_cpp_wait()


async def _collect(generation: Generation, model: str, created: int, started: dict[str, Any], logprobs: bool) -> ChatCompletion:
    parts: list[str] = []
    tokens: list[TokenLogprob] = []
    while True:
        message = await generation.next()
        kind = message.get("type")
        if kind == "delta":
            parts.append(answer_text(message))
            tokens += _logprobs(message)
        elif kind == "done":
            choice = Choice(message=AssistantMessage(content="".join(parts)), finish_reason=finish_reason(message),
                            logprobs=ChoiceLogprobs(content=tokens) if logprobs else None)
            return ChatCompletion(id=generation.id, created=created, model=model, choices=[choice],
                                  usage=usage_of(message, started))
        else:
            raise_if_failed(message)


async def _chunks(
    generation: Generation, model: str, created: int, prompt_tokens: int, include_usage: bool, logprobs: bool
) -> AsyncIterator[bytes]:
    def chunk(delta: Delta, finish: Optional[FinishReason] = None, tokens: Optional[list[TokenLogprob]] = None) -> bytes:
        choice = ChunkChoice(delta=delta, finish_reason=finish, logprobs=None if tokens is None else ChoiceLogprobs(content=tokens))
        return _sse(ChatCompletionChunk(id=generation.id, created=created, model=model, choices=[choice]))

    yield chunk(Delta(role="assistant", content=""))
    while True:
        message = await generation.next()
        kind = message.get("type")
        if kind == "delta":
            text = answer_text(message)
            tokens = _logprobs(message)
            if text or tokens:  # a token whose text is held back still has its logprob
                yield chunk(Delta(content=text), tokens=tokens if logprobs else None)
        elif kind == "done":
            yield chunk(Delta(), finish_reason(message))
            if include_usage:
                usage = usage_of(message, {"prompt_tokens": prompt_tokens})
                yield _sse(ChatCompletionChunk(id=generation.id, created=created, model=model, choices=[], usage=usage))
            yield DONE
            return
        elif kind in ("failed", "crashed"):
            yield error_line(message)
            return


def _sse(chunk: ChatCompletionChunk) -> bytes:
    data = chunk.model_dump(mode="json")
    for choice in data["choices"]:
        # A delta carries only what it adds, as OpenAI's do.
        choice["delta"] = {key: value for key, value in choice["delta"].items() if value is not None}
    if chunk.usage is None:
        del data["usage"]
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


def answer_text(delta: dict[str, Any]) -> str:
    # The child decodes with replacement characters; this holds whatever it sends (see text.py).
    return clean_text(str(delta.get("text") or ""))


def _logprobs(delta: dict[str, Any]) -> list[TokenLogprob]:
    """The tokens a delta carries (wire.TokenLogprob), in OpenAI's shape."""
    found = delta.get("logprobs")
    if not isinstance(found, list):
        return []
    return [TokenLogprob(token=clean_text(str(item.get("token", ""))), logprob=float(item.get("logprob") or 0.0),
                         bytes=item.get("bytes"),
                         top_logprobs=[TopLogprob(token=clean_text(str(top.get("token", ""))), logprob=float(top["logprob"]),
                                                  bytes=top.get("bytes")) for top in item.get("top_logprobs") or []])
            for item in found if isinstance(item, dict)]


def finish_reason(message: dict[str, Any]) -> FinishReason:
    return "length" if message.get("finish_reason") == "length" else "stop"


def usage_of(done: dict[str, Any], started: dict[str, Any]) -> Usage:
    usage = done.get("usage") or {}
    prompt = int(usage.get("prompt_tokens", started.get("prompt_tokens", 0)))
    completion = int(usage.get("completion_tokens", 0))
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def error_of(message: dict[str, Any]) -> OpenAIError:
    """The error a `failed` (from the child) or `crashed` (the child died) message stands for."""
    text = str(message.get("message") or "the inference process failed without saying why")
    if message.get("type") == "crashed":
        return InferenceUnavailable(text)
    code = message.get("code")
    param = message.get("param")
    param = str(param) if param is not None else None
    if code == "model_not_found":
        return ModelNotFound(text)
    if code == "context_length_exceeded":
        return InvalidChatRequest(text, param=param or "messages", code="context_length_exceeded")
    if code == "invalid_request":
        return InvalidChatRequest(text, param=param)
    return OpenAIError(text, param=param, code=str(code) if code else None)


def error_line(message: dict[str, Any]) -> bytes:
    """A `failed` or `crashed` message as the last line of a stream: its headers are sent, so
    the error goes in the stream, as OpenAI does (the SDK raises it)."""
    error = error_of(message)
    body = error_body(str(error), error.error_type, error.param, error.code)
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def raise_if_failed(message: dict[str, Any]) -> None:
    if message.get("type") in ("failed", "crashed"):
        raise error_of(message)
    if message.get("type") != "started":
        raise OpenAIError(f"the inference process answered {message.get('type')!r} where it should have started the request")
