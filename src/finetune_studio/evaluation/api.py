"""The evaluation child's side of OpenAI's API: the server's `/v1` (every model it evaluates),
or an external OpenAI-compatible endpoint (a judge).

    api = OpenAIEndpoint("http://127.0.0.1:8000/v1", token)
    api.chat(model, messages, max_tokens=128)             the greedy answer (temperature 0)
    api.prompt_logprobs(model, texts)                     each prompt token's log-probability, for every
                                                          text (one /v1/completions request, a prompt
                                                          per text: echo, logprobs 1, max_tokens 0)
    api.has_completions(model)                            whether the route exists here

Every failure is a `JobFailure` that says which model or endpoint, what happened and what
to do: an unknown model (404 `model_not_found`: deleted since the evaluation was queued?),
a route the server lacks, an endpoint that cannot be reached, a refusal. A request still
under way when a stop arrives is finished (its time is bounded by `timeout`); the caller
checks the stop between requests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

import httpx

from finetune_studio.child.channel import JobFailure
from finetune_studio.schemas import ErrorCode

# A greedy answer of a few hundred tokens on a CPU takes minutes; a judge's too.
REQUEST_TIMEOUT = httpx.Timeout(connect=10.0, read=1800.0, write=60.0, pool=1800.0)
EVALUATION_FAILED: ErrorCode = "evaluation_failed"


@dataclass(frozen=True)
class PromptLogprobs:
    """OpenAI's `choices[0].logprobs` of an echoed prompt, and the text its offsets index."""

    text: str
    tokens: list[str]
    token_logprobs: list[Optional[float]]
    top_logprobs: list[Optional[dict[str, float]]]
    text_offset: list[int]


class OpenAIEndpoint:
    """One OpenAI-compatible API. `name` says what it is in messages ("this server", "the judge at ...")."""

    def __init__(self, base_url: str, api_key: Optional[str] = None, *, name: str = "the server", timeout: Any = REQUEST_TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = name
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, body: dict[str, Any], model: str) -> dict[str, Any]:
        try:
            response = self._http.post(path, json=body)
        except httpx.TransportError as exc:
            raise JobFailure(
                EVALUATION_FAILED,
                f"{self.name} cannot be reached at {self.base_url} ({exc or type(exc).__name__}); check that it runs and"
                " that its address is right",
            ) from None
        if response.status_code >= 400:
            raise self._refusal(response, path, model)
        try:
            answer = response.json()
        except ValueError:
            raise JobFailure(EVALUATION_FAILED, f"{self.name} answered {path} with something that is not JSON") from None
        if not isinstance(answer, dict):
            raise JobFailure(EVALUATION_FAILED, f"{self.name} answered {path} with JSON that is not an object")
        return answer

    def _refusal(self, response: httpx.Response, path: str, model: str) -> JobFailure:
        error: dict[str, Any] = {}
        try:
            body = response.json()
            error = body.get("error") or {} if isinstance(body, dict) else {}
            if not isinstance(error, dict):
                error = {"message": str(error)}
        except ValueError:
            error = {"message": response.text[:500]}
        text = str(error.get("message") or response.reason_phrase)
        code = error.get("code")
        if response.status_code == 404 and code == "model_not_found":
            return JobFailure(
                "model_not_found",
                f"{self.name} does not serve the model {model!r} ({text}); was it deleted since the evaluation was"
                " queued? GET /v1/models lists what it serves",
            )
        if response.status_code == 404:
            return JobFailure(EVALUATION_FAILED, f"{self.name} has no POST {self.base_url}{path} ({text})")
        if response.status_code in (401, 403):
            return JobFailure(EVALUATION_FAILED, f"{self.name} refused the evaluation's credentials ({response.status_code}: {text})")
        return JobFailure(EVALUATION_FAILED, f"{self.name} answered {response.status_code} for model {model!r}: {text}")

    def chat(self, model: str, messages: list[dict[str, Any]], *, max_tokens: int, temperature: float = 0.0) -> str:
        """The model's answer to `messages` (temperature 0: greedy)."""
        body = {
            "model": model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        answer = self._post("/chat/completions", body, model)
        try:
            content = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise JobFailure(EVALUATION_FAILED, f"{self.name}'s chat answer for {model!r} has no choices[0].message.content") from None
        return str(content or "")

    def prompt_logprobs(self, model: str, texts: list[str]) -> list[PromptLogprobs]:
        """Each token of each of `texts` and its log-probability under the model (OpenAI's
        completions with echo: `logprobs{tokens, token_logprobs, top_logprobs, text_offset}`), in
        one request whose prompts are the texts, so that the server prefills them together."""
        body = {"model": model, "prompt": texts, "echo": True, "logprobs": 1, "max_tokens": 0, "temperature": 0}
        answer = self._post("/completions", body, model)
        try:
            choices = sorted(answer["choices"], key=lambda choice: int(choice["index"]))
            if [int(choice["index"]) for choice in choices] != list(range(len(texts))):
                raise ValueError(f"{len(texts)} prompts, choices {[choice['index'] for choice in choices]}")
            return [
                PromptLogprobs(
                    text=str(choice.get("text", text)),
                    tokens=[str(token) for token in choice["logprobs"]["tokens"]],
                    token_logprobs=[None if value is None else float(value) for value in choice["logprobs"]["token_logprobs"]],
                    top_logprobs=[None if top is None else {str(k): float(v) for k, v in top.items()}
                                  for top in choice["logprobs"]["top_logprobs"]],
                    text_offset=[int(offset) for offset in choice["logprobs"]["text_offset"]],
                )
                for choice, text in zip(choices, texts, strict=True)
            ]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise JobFailure(
                EVALUATION_FAILED,
                f"{self.name}'s /v1/completions answer for {model!r} has no usable choices[].logprobs ({type(exc).__name__}: {exc})",
            ) from None

    def has_completions(self, model: str) -> bool:
        """Whether POST /v1/completions exists here (a 404 that names no model: the route is missing)."""
        try:
            response = self._http.post("/completions", json={"model": model, "prompt": "a", "max_tokens": 1, "echo": True, "logprobs": 1})
        except httpx.TransportError:
            return False
        if response.status_code != 404:
            return True
        try:
            code = (json.loads(response.text).get("error") or {}).get("code")
        except (ValueError, AttributeError):
            code = None
        return bool(code == "model_not_found")

    def accepts_token_prompts(self, model: str, token_ids: list[int]) -> bool:
        """Whether /v1/completions takes a prompt given as token ids (OpenAI's array of integers)."""
        try:
            response = self._http.post(
                "/completions", json={"model": model, "prompt": [token_ids], "max_tokens": 1, "echo": True, "logprobs": 1}
            )
        except httpx.TransportError:
            return False
        return response.status_code < 400
