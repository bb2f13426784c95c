"""The OpenAI-compatible routes with a stand-in inference child (tests/helpers/stand_in_chat_child.py)
and in-process stand-in training jobs (tests/helpers/chat.py): every route's shape and
error, through the official `openai` SDK where it can be, against the app under a real uvicorn."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from tests.helpers.chat import BASE, ChatServer, chat_module_fixtures, kill_the_child_once_it_holds
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for

# One server for the module (its child starts once, and again where a test kills it); each test
# leaves no request behind in the child.
server, nothing_left_in_the_child = chat_module_fixtures("chat")


@pytest.fixture(scope="module")
def jobs(server: ChatServer) -> dict[str, str]:
    found = {mode: server.job(mode, phase) for mode, phase in
             [("lora", "completed"), ("full", "completed"), ("fail", "error"), ("hold", "training"),
              ("hold-save", "training")]}
    server.http.post(f"/train/stop/{found['hold-save']}")
    wait_for(lambda: server.http.get(f"/train/status/{found['hold-save']}").json()["phase"] == "stopped", timeout=30,
             what="the stopped job")
    found["stopped-unsaved"] = server.job("hold", "training")
    server.http.post(f"/train/stop/{found['stopped-unsaved']}")
    wait_for(lambda: server.http.get(f"/train/status/{found['stopped-unsaved']}").json()["phase"] == "stopped",
             timeout=30, what="the stopped job")
    return found


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


# -- models ---------------------------------------------------------------------


def test_models_lists_every_job_with_something_to_serve_and_their_base(server: ChatServer, jobs: dict[str, str]) -> None:
    models = server.sdk().models.list().data
    ids = [model.id for model in models]
    # Newest job first, then the bases; not the failed, running or unsaved stopped ones.
    assert [i for i in ids if i in jobs.values()] == [jobs["hold-save"], jobs["full"], jobs["lora"]]
    assert ids[-1] == BASE and ids.count(BASE) == 1
    for model in models:
        assert model.object == "model" and model.owned_by == "finetune-studio" and model.created > 1_600_000_000
    raw = server.http.get("/v1/models").json()
    assert raw["object"] == "list" and set(raw["data"][0]) == {"id", "object", "created", "owned_by"}


def test_each_model_id_loads_what_the_job_saved(server: ChatServer, jobs: dict[str, str]) -> None:
    def loaded(model: str) -> dict[str, Any]:
        answer = server.sdk().chat.completions.create(model=model, messages=user("__model__"))
        return json.loads(answer.choices[0].message.content or "")

    folder = server.settings.jobs_dir
    assert loaded(jobs["lora"]) == {"base": {"kind": "hub", "location": BASE},
                                     "adapter": str(folder / jobs["lora"] / "adapter"), "trust_remote_code": False}
    assert loaded(jobs["hold-save"])["adapter"] == str(folder / jobs["hold-save"] / "adapter")  # stopped, saved: served
    assert loaded(jobs["full"]) == {"base": {"kind": "folder", "location": str(folder / jobs["full"] / "model")},
                                     "adapter": None, "trust_remote_code": False}
    assert loaded(BASE) == {"base": {"kind": "hub", "location": BASE}, "adapter": None, "trust_remote_code": False}


# -- completions ----------------------------------------------------------------


def test_a_completion_has_openais_shape(server: ChatServer, jobs: dict[str, str]) -> None:
    answer = server.sdk().chat.completions.create(model=jobs["lora"], messages=user("hello there world"))
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-") and answer.model == jobs["lora"]
    (choice,) = answer.choices
    assert choice.index == 0 and choice.message.role == "assistant" and choice.message.content == "hello there world"
    assert choice.finish_reason == "stop"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (4, 3, 7)


def test_the_sampling_parameters_reach_the_child(server: ChatServer, jobs: dict[str, str]) -> None:
    def params(**given: Any) -> dict[str, Any]:
        answer = server.sdk().chat.completions.create(model=jobs["lora"], messages=user("__params__"), **given)
        return json.loads(answer.choices[0].message.content or "")

    assert params() == {"temperature": 1.0, "top_p": 1.0, "max_tokens": None, "stop": [], "seed": None}
    assert params(temperature=0, top_p=0.5, max_tokens=7, stop="END", seed=42) == {
        "temperature": 0.0, "top_p": 0.5, "max_tokens": 7, "stop": ["END"], "seed": 42}
    # max_completion_tokens is OpenAI's newer name, and wins; developer is the newer system.
    assert params(max_tokens=7, max_completion_tokens=9, stop=["a", "b"])["max_tokens"] == 9
    answer = server.sdk().chat.completions.create(
        model=jobs["lora"], messages=[{"role": "developer", "content": "be brief"},
                                      {"role": "user", "content": [{"type": "text", "text": "two "}, {"type": "text", "text": "parts"}]}])
    assert answer.choices[0].message.content == "two parts"


def test_logprobs_reach_the_child_and_come_back_in_openais_shape(server: ChatServer, jobs: dict[str, str]) -> None:
    sdk = server.sdk()
    plain = sdk.chat.completions.create(model=jobs["lora"], messages=user("__params__"))
    assert "logprobs" not in json.loads(plain.choices[0].message.content or "") and plain.choices[0].logprobs is None
    asked = sdk.chat.completions.create(model=jobs["lora"], messages=user("__params__"), logprobs=True, top_logprobs=2)
    assert {key: value for key, value in json.loads(asked.choices[0].message.content or "").items()
            if "logprobs" in key} == {"logprobs": True, "top_logprobs": 2}

    answer = sdk.chat.completions.create(model=jobs["lora"], messages=user("one two three"), logprobs=True, top_logprobs=2)
    content = answer.choices[0].logprobs.content if answer.choices[0].logprobs else None
    assert content is not None and [token.token for token in content] == ["one ", "two ", "three"]
    assert all(token.logprob == -0.5 and token.bytes == list(token.token.encode()) for token in content)
    assert [[(top.token, top.logprob) for top in token.top_logprobs] for token in content] == [[("alt1", -1.0), ("alt2", -1.5)]] * 3
    # Streamed: each chunk carries the logprobs of its tokens.
    chunks = list(sdk.chat.completions.create(model=jobs["lora"], messages=user("one two three"), logprobs=True, stream=True))
    streamed = [token for chunk in chunks if chunk.choices and chunk.choices[0].logprobs
                for token in chunk.choices[0].logprobs.content or []]
    assert [token.token for token in streamed] == ["one ", "two ", "three"] and all(not t.top_logprobs for t in streamed)


def test_stop_and_max_tokens_end_the_answer(server: ChatServer, jobs: dict[str, str]) -> None:
    sdk = server.sdk()
    stopped = sdk.chat.completions.create(model=jobs["lora"], messages=user("one two three four"), stop=["three"])
    assert stopped.choices[0].message.content == "one two " and stopped.choices[0].finish_reason == "stop"
    cut = sdk.chat.completions.create(model=jobs["lora"], messages=user("one two three four"), max_tokens=2)
    assert cut.choices[0].message.content == "one two " and cut.choices[0].finish_reason == "length"
    assert cut.usage is not None and cut.usage.completion_tokens == 2


def test_a_streamed_completion(server: ChatServer, jobs: dict[str, str]) -> None:
    stream = server.sdk().chat.completions.create(
        model=jobs["lora"], messages=user("one two three"), stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"} and len({chunk.id for chunk in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].delta.content for c in chunks[1:4]] == ["one ", "two ", "three"]
    assert chunks[4].choices[0].finish_reason == "stop" and chunks[4].choices[0].delta.content is None
    assert chunks[5].choices == [] and chunks[5].usage is not None and chunks[5].usage.total_tokens == 4 + 3
    assert len(chunks) == 6

    raw = server.http.post("/v1/chat/completions", json={"model": jobs["lora"], "messages": user("a b"), "stream": True})
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.endswith("data: [DONE]\n\n") and '"usage"' not in raw.text  # no usage unless asked for
    assert raw.text.count("data: ") == 1 + 2 + 1 + 1


def test_two_streams_at_once_both_advance(server: ChatServer, jobs: dict[str, str]) -> None:
    sdk = server.sdk()
    endless = sdk.chat.completions.create(model=jobs["lora"], messages=user("forever"), stream=True)
    chunks = iter(endless)
    for _ in range(2):  # the role, then the first tick: it is being generated
        next(chunks)
    other = sdk.chat.completions.create(model=BASE, messages=user("while the other runs"), stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in other)
    assert text == "while the other runs"
    # The first stream went on all along, and goes on after the second ended.
    assert all(next(chunks).choices[0].delta.content == "tick " for _ in range(3))
    endless.close()


def test_a_client_that_leaves_mid_stream_is_cancelled_in_the_child(server: ChatServer, jobs: dict[str, str]) -> None:
    stream = server.sdk().chat.completions.create(model=jobs["lora"], messages=user("forever"), stream=True)
    first = next(iter(stream))
    stream.close()
    wait_for(lambda: f"cancelled {first.id}" in server.log, timeout=30, what="the child to be told to cancel")
    wait_for(lambda: server.studio.inference.active == 0, timeout=30, what="the request to be forgotten")


def test_a_client_that_leaves_while_waiting_is_cancelled_in_the_child(server: ChatServer, jobs: dict[str, str]) -> None:
    cancelled = server.log.count("cancelled ")
    with pytest.raises(httpx.ReadTimeout):  # the client gives up on an answer that never comes
        server.http.post("/v1/chat/completions", json={"model": jobs["lora"], "messages": user("hang")}, timeout=1)
    wait_for(lambda: server.log.count("cancelled ") == cancelled + 1, timeout=30, what="the child to be told to cancel")
    wait_for(lambda: server.studio.inference.active == 0, timeout=30, what="the request to be forgotten")


# -- errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "says"),
    [("hold", "is still running (phase training)"), ("fail", "failed (the data was bad) and saved no model to serve"),
     ("stopped-unsaved", "was stopped before it saved a model")],
)
def test_a_job_with_nothing_to_serve_is_404_saying_why(server: ChatServer, jobs: dict[str, str], job: str, says: str) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        server.sdk().chat.completions.create(model=jobs[job], messages=user("hi"))
    assert caught.value.code == "model_not_found" and caught.value.param == "model"
    assert f"job {jobs[job]} {says}" in caught.value.message


def test_a_queued_job_and_an_unknown_model_are_404(server: ChatServer, jobs: dict[str, str]) -> None:
    holders = [server.job("hold", "training") for _ in range(4 - 1)]  # with the held job of `jobs`: all 4 slots
    queued = server.job("hold")
    assert server.http.get(f"/train/status/{queued}").json()["phase"] == "idle"
    try:
        with pytest.raises(openai.NotFoundError) as caught:
            server.sdk().chat.completions.create(model=queued, messages=user("hi"))
        assert f"job {queued} is queued and has no model to serve yet" in caught.value.message
    finally:
        for job_id in [queued, *holders]:
            server.http.post(f"/train/stop/{job_id}")
    with pytest.raises(openai.NotFoundError) as unknown:
        server.sdk().chat.completions.create(model="no-such-model", messages=user("hi"))
    assert unknown.value.code == "model_not_found" and "'no-such-model' does not exist" in unknown.value.message
    assert "GET /v1/models" in unknown.value.message


@pytest.mark.parametrize(
    ("given", "param"),
    [({"n": 2}, "n"), ({"max_tokens": -1}, "max_tokens"), ({"max_completion_tokens": 0}, "max_completion_tokens"),
     ({"temperature": 3}, "temperature"), ({"temperature": -0.1}, "temperature"), ({"top_p": 0}, "top_p"),
     ({"top_p": 1.5}, "top_p"), ({"stop": [""]}, "stop"), ({"messages": []}, "messages"),
     ({"logprobs": True, "top_logprobs": 6}, "top_logprobs"), ({"top_logprobs": 2}, "top_logprobs"),
     ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
     ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages[0].content")],
)
def test_bad_parameters_are_400_naming_the_parameter(server: ChatServer, jobs: dict[str, str], given: dict[str, Any], param: str) -> None:
    body = {"model": jobs["lora"], "messages": user("hi"), **given}
    with pytest.raises(openai.BadRequestError) as caught:
        server.sdk().chat.completions.create(**body)
    assert caught.value.status_code == 400 and caught.value.param == param
    assert caught.value.type == "invalid_request_error"
    assert isinstance(caught.value.body, dict) and caught.value.body["message"].startswith(f"{param}: ")


def test_n_above_one_says_what_to_do(server: ChatServer, jobs: dict[str, str]) -> None:
    response = server.http.post("/v1/chat/completions", json={"model": jobs["lora"], "messages": user("hi"), "n": 3})
    assert response.status_code == 400
    assert response.json() == {"error": {
        "message": "n: this server returns one choice per request: send n=1 (or leave n out), and send 3 requests for 3 answers",
        "type": "invalid_request_error", "param": "n", "code": "invalid_request_error"}}


def test_a_prompt_over_the_context_is_400(server: ChatServer, jobs: dict[str, str]) -> None:
    sdk = server.sdk()
    with pytest.raises(openai.BadRequestError) as long_prompt:
        sdk.chat.completions.create(model=jobs["lora"], messages=user("word " * 80))
    assert long_prompt.value.code == "context_length_exceeded" and long_prompt.value.param == "messages"
    assert "exceed the context of 64" in long_prompt.value.message
    with pytest.raises(openai.BadRequestError) as too_many:
        sdk.chat.completions.create(model=jobs["lora"], messages=user("hi"), max_tokens=100)
    assert too_many.value.code == "context_length_exceeded" and too_many.value.param == "max_tokens"


def test_a_wrong_token_is_openais_401(server: ChatServer) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        server.sdk(api_key="wrong-token-wrong-token").models.list()
    assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"
    assert "FINETUNE_STUDIO_TOKEN" in caught.value.message
    bare = httpx.post(f"{server.url}/v1/chat/completions", json={})
    assert bare.status_code == 401 and set(bare.json()["error"]) == {"message", "type", "param", "code"}


def test_other_errors_under_v1_are_in_openais_shape(server: ChatServer) -> None:
    unknown = server.http.post("/v1/embeddings", json={})
    assert unknown.status_code == 404 and "POST /v1/chat/completions" in unknown.json()["error"]["message"]
    wrong_method = server.http.delete("/v1/models")
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["type"] == "invalid_request_error"
    not_json = server.http.post("/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert not_json.status_code == 400 and set(not_json.json()["error"]) == {"message", "type", "param", "code"}
    surrogate = server.http.post("/v1/chat/completions", content=b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
                                 headers={"Content-Type": "application/json"})
    assert surrogate.status_code == 400 and surrogate.json()["error"]["param"] == "messages[0].content"
    assert "not valid Unicode" in surrogate.json()["error"]["message"]
    # The training routes keep FastAPI's shape.
    assert "detail" in server.http.get("/train/status/nope").json()


def test_a_failure_in_the_child_is_a_500_in_openais_shape(server: ChatServer, jobs: dict[str, str]) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        server.sdk().chat.completions.create(model=jobs["lora"], messages=user("fail internal"))
    assert caught.value.status_code == 500 and caught.value.message.endswith("the fake child failed on purpose")


# -- the child's life -----------------------------------------------------------


def test_a_killed_child_answers_503_with_the_reason_and_the_next_request_starts_a_new_one(
    server: ChatServer, jobs: dict[str, str]
) -> None:
    sdk = server.sdk()
    caught: list[BaseException] = []

    def ask() -> None:
        try:
            sdk.chat.completions.create(model=jobs["lora"], messages=user("hang"))
        except openai.APIStatusError as exc:
            caught.append(exc)

    asking = threading.Thread(target=ask)
    asking.start()
    killed = kill_the_child_once_it_holds(server, 1)
    asking.join(timeout=60)
    (error,) = caught
    assert isinstance(error, openai.InternalServerError) and error.status_code == 503
    assert "The inference process was killed by SIGKILL" in error.message and "the next request starts a new one" in error.message
    assert error.code == "inference_unavailable"

    answer = sdk.chat.completions.create(model=jobs["lora"], messages=user("back again"))
    assert answer.choices[0].message.content == "back again"
    assert server.studio.inference.pid not in (None, killed)


def test_a_child_killed_mid_stream_ends_the_stream_with_the_reason(server: ChatServer, jobs: dict[str, str]) -> None:
    stream = server.sdk().chat.completions.create(model=jobs["lora"], messages=user("hang"), stream=True)
    chunks = iter(stream)
    assert next(chunks).choices[0].delta.role == "assistant"
    kill_the_child_once_it_holds(server, 1)
    with pytest.raises(openai.APIError, match="killed by SIGKILL"):
        next(chunks)
    assert server.sdk().chat.completions.create(model=BASE, messages=user("fine")).choices[0].message.content == "fine"


def test_a_training_job_that_starts_unloads_the_childs_models(server: ChatServer, jobs: dict[str, str]) -> None:
    server.sdk().chat.completions.create(model=BASE, messages=user("warm"))  # a child is running
    unloads = server.log.count("unloaded")
    server.job("lora", "completed")
    wait_for(lambda: server.log.count("unloaded") == unloads + 1, timeout=30, what="the child to be told to unload")
    assert f"args --max-loaded 1 --idle-seconds {server.settings.inference_idle_seconds}" in server.log
    assert f"--max-batch-size {server.settings.max_batch_size}" in server.log


def test_the_child_stops_with_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    with ChatServer(tmp_path / "data") as alone:
        job_id = alone.job("lora", "completed")
        assert alone.sdk().chat.completions.create(model=job_id, messages=user("hi")).choices[0].message.content == "hi"
        pid = alone.studio.inference.pid
        assert pid is not None and psutil.pid_exists(pid)
    assert not psutil.pid_exists(pid)
