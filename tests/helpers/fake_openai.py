"""An OpenAI-compatible stand-in, in this process: a tiny FastAPI app under uvicorn on
127.0.0.1 in a thread, whose answers the test controls.

    with FakeOpenAI(models={"a", "b"}, answer=lambda model, messages: "...") as api:
        api.url                 http://127.0.0.1:PORT (its routes are under /v1)
        api.chats, api.completions   every request and answer, for by-hand checks

- `GET /v1/models`; `POST /v1/chat/completions`: `answer(model, messages)` (a model not
  in `models` is OpenAI's 404 `model_not_found`); a judge is just another model whose
  `answer` reads the "[Answer A]" / "[Answer B]" the judge prompt holds.
- `POST /v1/completions` (unless `completions=False`: then a 404 with no code, as a server
  without the route answers): OpenAI's legacy completions with `echo` and `logprobs`. A text
  prompt is cut into tokens at each run of non-space (the space before a word belongs to it),
  a prompt of token ids keeps them; each token's log-probability is `logprob(model, token)`
  (default: a deterministic function of both), its top-1 alternative is that value or
  -0.5, whichever is higher (so a token "is greedy" when its log-probability is at least
  -0.5); with `max_tokens` >= 1 one token " z" (log-probability -0.1) is generated.
- `token`: when set, every request must carry `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable
from typing import Any, Optional

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from finetune_studio.cli.local_server import free_port
from tests.helpers.polling import wait_for

Answer = Callable[[str, list[dict[str, Any]]], str]
TOKEN = re.compile(r"\s*\S+|\s+$")


def default_logprob(model: str, token: str) -> float:
    digest = hashlib.sha256(f"{model}|{token}".encode()).digest()
    return -0.05 - (digest[0] % 40) / 20.0  # -0.05 .. -2.0


def tokenize(text: str) -> list[tuple[str, int]]:
    """(token, offset) of each token of a text prompt."""
    return [(match.group(0), match.start()) for match in TOKEN.finditer(text)]


class FakeOpenAI:
    def __init__(
        self,
        models: set[str],
        answer: Optional[Answer] = None,
        *,
        completions: bool = True,
        logprob: Callable[[str, str], float] = default_logprob,
        token: Optional[str] = None,
    ) -> None:
        self.models = set(models)
        self.answer: Answer = answer or (lambda model, messages: f"{model} says {messages[-1]['content']}")
        self.completions_route = completions
        self.logprob = logprob
        self.token = token
        self.chats: list[tuple[dict[str, Any], str]] = []
        self.completions: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.lock = threading.Lock()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = self._app()
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", ws="none"))
        self.thread = threading.Thread(target=self.server.run, name=f"fake-openai-{self.port}", daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        wait_for(lambda: self.server.started or not self.thread.is_alive(), timeout=30, what="the fake OpenAI server")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def _refused(self, request: Request) -> Optional[JSONResponse]:
        if self.token and request.headers.get("authorization") != f"Bearer {self.token}":
            return JSONResponse({"error": {"message": "wrong key", "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}, 401)
        return None

    def _unknown(self, model: str) -> JSONResponse:
        return JSONResponse(
            {"error": {"message": f"the model {model!r} does not exist", "type": "invalid_request_error", "param": "model",
                       "code": "model_not_found"}},
            404,
        )

    def _model(self, body: dict[str, Any], request: Request) -> tuple[str, Optional[JSONResponse]]:
        """The model a request names, and the answer to give instead where its key or model is wrong."""
        model = str(body.get("model"))
        refused = self._refused(request)
        if refused is None and model not in self.models:
            refused = self._unknown(model)
        return model, refused

    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models(request: Request) -> Any:
            refused = self._refused(request)
            if refused is not None:
                return refused
            return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in sorted(self.models)]}

        @app.post("/v1/chat/completions")
        def chat(body: dict[str, Any], request: Request) -> Any:
            model, refused = self._model(body, request)
            if refused is not None:
                return refused
            text = self.answer(model, list(body["messages"]))
            with self.lock:
                self.chats.append((body, text))
            return {
                "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop", "logprobs": None}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }

        @app.post("/v1/completions")
        def completions(body: dict[str, Any], request: Request) -> Any:
            if not self.completions_route:
                return JSONResponse({"error": {"message": "no route POST /v1/completions", "type": "invalid_request_error",
                                               "param": None, "code": None}}, 404)
            model, refused = self._model(body, request)
            if refused is not None:
                return refused
            prompts = body["prompt"]
            if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
                prompts = [prompts]
            choices = [self._choice(model, index, prompt, body) for index, prompt in enumerate(prompts)]
            answer = {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": model, "choices": choices}
            with self.lock:
                self.completions.append((body, answer))
            return answer

        return app

    def _choice(self, model: str, index: int, prompt: Any, body: dict[str, Any]) -> dict[str, Any]:
        if isinstance(prompt, str):
            pieces = tokenize(prompt)
            text = prompt
        else:
            pieces, text, at = [], "", 0
            for token_id in prompt:
                piece = f" t{token_id}"
                pieces.append((piece, at))
                at += len(piece)
                text += piece
        tokens = [piece for piece, _ in pieces]
        offsets = [offset for _, offset in pieces]
        logprobs: list[Optional[float]] = [None] + [self.logprob(model, piece) for piece in tokens[1:]]
        tops: list[Optional[dict[str, float]]] = [None] + [{piece: max(lp, -0.5)} for piece, lp in zip(tokens[1:], logprobs[1:], strict=True)]  # type: ignore[type-var]
        generated = ""
        if int(body.get("max_tokens") or 0) >= 1:
            generated = " z"
            tokens.append(generated)
            offsets.append(len(text) if body.get("echo") else 0)
            logprobs.append(-0.1)
            tops.append({generated: -0.1})
        if not body.get("echo"):
            return {"index": index, "text": generated, "finish_reason": "length", "logprobs": None}
        return {
            "index": index,
            "text": text + generated,
            "finish_reason": "length",
            "logprobs": {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets},
        }
