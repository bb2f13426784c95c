"""The chat view in a real Chromium: a real server, a job trained on the tiny model,
the real inference child answering over POST /v1/chat/completions.

One trained job serves the module (the machine has two cores). Answers are kept
short (a few tokens) except where a test needs one still streaming: the random
base model, greedy, says "\\n" over and over and never ends a turn by itself, so a
greedy answer of thousands of tokens is one that is still running when the test
stops it (or kills the inference process under it).

What the page exposes: `data-testid` attributes and `window.__studio.chat()`, the
conversation shown, with each answer's model, state, text, and how many deltas
and frames it arrived in.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.helpers.browser import LAPTOP, PHONE, SECOND, expect, open_page, wait_js
from tests.helpers.jobs import collect, job_request
from tests.helpers.servers import ServerProcess

pytestmark = [pytest.mark.browser, pytest.mark.train]

CHAT = "window.__studio.chat()"
LONG = 3000  # max tokens of an answer that must still be streaming when the test acts on it


@pytest.fixture(scope="module")
def job(shared_server: ServerProcess, tiny_model: Path) -> str:
    """A completed LoRA job on the tiny model: a model to chat with, and its base."""
    with shared_server.client() as client:
        job_id = client.start(job_request(tiny_model, max_steps=4, load_in_4bit=False, optim="adamw_torch"))
        final = collect(client, job_id)[-1].data
    assert final["phase"] == "completed", final
    return job_id


@pytest.fixture
def requests(page: Any) -> Iterator[list[dict[str, Any]]]:
    """The bodies the page POSTs to /v1/chat/completions, in order."""
    sent: list[dict[str, Any]] = []

    def record(request: Any) -> None:
        if request.method == "POST" and request.url.endswith("/v1/chat/completions"):
            sent.append(request.post_data_json)

    page.on("request", record)
    yield sent


def open_chat(page: Any, url: str, model: str, compare: bool = False) -> None:
    open_page(page, url, f"#chat={model}" + ("&compare=1" if compare else ""))
    wait_js(page, f"{CHAT} && {CHAT}.loaded && {CHAT}.mode === '{'compare' if compare else 'chat'}'", 20)


def chat(page: Any) -> dict[str, Any]:
    return page.evaluate(CHAT)  # type: ignore[no-any-return]


def settings(
    page: Any,
    *,
    temperature: Optional[str] = None,
    max_tokens: Optional[str] = None,
    seed: Optional[str] = None,
    system: Optional[str] = None,
) -> None:
    """Fill the settings (the panel is folded by default)."""
    page.evaluate("document.getElementById('chat-settings').open = true")
    for name, value in (("temperature", temperature), ("max-tokens", max_tokens), ("seed", seed), ("system", system)):
        if value is not None:
            page.get_by_test_id(f"chat-{name}").fill(value)


def send(page: Any, text: str) -> None:
    box = page.get_by_test_id("chat-input")
    box.fill(text)
    box.press("Enter")


def wait_idle(page: Any, turns: int, timeout_s: float = 120) -> dict[str, Any]:
    """Wait until the conversation has `turns` turns, no answer is streaming, and the page shows it so."""
    drawn = (
        f"document.querySelectorAll('[data-testid=turn]').length === {turns}"
        " && document.getElementById('chat-view').dataset.busy === 'false'"
        " && !document.querySelector('#chat-log [data-state=streaming]')"
    )
    wait_js(page, f"{CHAT}.turns.length === {turns} && !{CHAT}.busy && {drawn}", timeout_s)
    return chat(page)


def no_horizontal_overflow(page: Any) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")  # type: ignore[no-any-return]


def test_chat_from_the_runs_page_streams_answers_and_keeps_them_over_a_reload(
    shared_server: ServerProcess, job: str, page: Any, requests: list[dict[str, Any]]
) -> None:
    page.goto(f"{shared_server.url}/#job={job}")
    link = page.get_by_test_id("chat-link")
    link.wait_for(state="visible", timeout=20 * SECOND)
    link.click()
    wait_js(page, f"{CHAT} && {CHAT}.loaded && {CHAT}.jobId === '{job}'", 20)
    assert page.url.endswith(f"#chat={job}")

    settings(page, temperature="1", max_tokens="12", seed="7", system="Answer briefly.")
    box = page.get_by_test_id("chat-input")
    box.fill("first line")
    box.press("Shift+Enter")  # a new line, not a send
    box.type("second line")
    assert box.input_value() == "first line\nsecond line"
    assert chat(page)["turns"] == []
    box.press("Enter")

    state = wait_idle(page, 1)
    first = state["turns"][0]
    answer = first["answers"]["tuned"]
    assert first["user"] == "first line\nsecond line"
    assert answer["model"] == job
    assert answer["state"] == "done"
    assert answer["finish_reason"] in ("stop", "length")
    assert 1 <= answer["usage"]["completion_tokens"] <= 12
    assert answer["content"], "the answer arrived empty"
    assert answer["deltas"] >= 1 and answer["frames"] >= 1  # drawn while it streamed, not only at the end
    cell = page.get_by_test_id("answer-tuned")
    assert cell.get_attribute("data-state") == "done"
    assert cell.get_by_test_id("answer-text").text_content() == answer["content"]
    assert "tokens" in cell.get_by_test_id("answer-meta").inner_text()
    assert requests[0]["model"] == job and requests[0]["stream"] is True
    assert requests[0]["max_tokens"] == 12 and requests[0]["temperature"] == 1 and requests[0]["seed"] == 7
    assert requests[0]["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "first line\nsecond line"},
    ]

    # The second turn carries the first: multi-turn.
    send(page, "and then?")
    state = wait_idle(page, 2)
    assert requests[1]["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "first line\nsecond line"},
        {"role": "assistant", "content": answer["content"]},
        {"role": "user", "content": "and then?"},
    ]
    assert state["turns"][1]["answers"]["tuned"]["state"] == "done"

    # A reload finds the conversation in IndexedDB, settings included.
    page.reload()
    page.wait_for_selector("body[data-ready=true]", state="attached", timeout=20 * SECOND)
    wait_js(page, f"{CHAT} && {CHAT}.loaded", 20)
    again = chat(page)
    assert again["conversationId"] == state["conversationId"]
    assert [t["user"] for t in again["turns"]] == ["first line\nsecond line", "and then?"]
    assert [t["answers"]["tuned"]["content"] for t in again["turns"]] == [
        t["answers"]["tuned"]["content"] for t in state["turns"]
    ]
    # `loaded` is the state; the page draws it on a later animation frame.
    expect(page.get_by_test_id("turn")).to_have_count(2)
    expect(page.get_by_test_id("chat-max-tokens")).to_have_value("12")
    expect(page.get_by_test_id("chat-system")).to_have_value("Answer briefly.")
    assert no_horizontal_overflow(page)


def test_compare_streams_base_and_fine_tuned_at_once_each_with_its_own_stop(
    shared_server: ServerProcess, job: str, tiny_model: Path, page: Any, requests: list[dict[str, Any]]
) -> None:
    open_chat(page, shared_server.url, job)
    page.get_by_test_id("chat-mode-compare").click()
    wait_js(page, f"{CHAT}.mode === 'compare' && {CHAT}.loaded", 20)
    assert chat(page)["baseModel"] == str(tiny_model)

    settings(page, temperature="0.8", max_tokens="10", seed="3")
    send(page, "Who are you?")
    state = wait_idle(page, 1)
    answers = state["turns"][0]["answers"]
    assert answers["base"]["model"] == str(tiny_model)  # the base's id in GET /v1/models
    assert answers["tuned"]["model"] == job
    for side in ("base", "tuned"):
        assert answers[side]["state"] == "done", answers[side]
        assert answers[side]["content"], f"the {side} answer arrived empty"
    assert sorted(r["model"] for r in requests) == sorted([str(tiny_model), job])
    # Both streams ran at once: each started before the other ended.
    assert answers["base"]["started_at"] <= answers["tuned"]["ended_at"]
    assert answers["tuned"]["started_at"] <= answers["base"]["ended_at"]
    # Side by side on a laptop; one above the other on a phone, without horizontal scrolling.
    base, tuned = page.get_by_test_id("answer-base"), page.get_by_test_id("answer-tuned")
    left, right = base.bounding_box(), tuned.bounding_box()
    assert left["x"] + left["width"] <= right["x"] and left["y"] == right["y"]
    assert no_horizontal_overflow(page)
    page.set_viewport_size(PHONE)
    left, right = base.bounding_box(), tuned.bounding_box()
    assert left["y"] + left["height"] <= right["y"]
    assert no_horizontal_overflow(page)
    page.set_viewport_size(LAPTOP)

    # Two long answers at once; stopping one leaves the other streaming.
    settings(page, temperature="0", max_tokens=str(LONG))
    send(page, "Go on.")
    wait_js(
        page,
        f"{CHAT}.turns.length === 2 && ['base', 'tuned'].every((s) => {CHAT}.turns[1].answers[s].content.length >= 20)",
        120,
    )
    page.get_by_test_id("stop-base").click()
    wait_js(page, f"{CHAT}.turns[1].answers.base.state === 'stopped'", 20)
    assert chat(page)["turns"][1]["answers"]["tuned"]["state"] == "streaming"
    page.get_by_test_id("stop-tuned").click()
    state = wait_idle(page, 2, 20)
    for side in ("base", "tuned"):
        stopped = state["turns"][1]["answers"][side]
        assert stopped["state"] == "stopped"
        assert 20 <= len(stopped["content"]) < LONG
        assert stopped["frames"] >= 2  # the text grew over several frames
    assert "stopped" in page.get_by_test_id("answer-base").nth(1).inner_text()

    # A reload keeps both histories; the chat mode has conversations of its own.
    page.reload()
    page.wait_for_selector("body[data-ready=true]", state="attached", timeout=20 * SECOND)
    wait_js(page, f"{CHAT} && {CHAT}.loaded", 20)
    again = chat(page)
    assert again["conversationId"] == state["conversationId"]
    for index in (0, 1):
        for side in ("base", "tuned"):
            assert (
                again["turns"][index]["answers"][side]["content"] == state["turns"][index]["answers"][side]["content"]
            )
    page.get_by_test_id("chat-mode-chat").click()
    wait_js(page, f"{CHAT}.mode === 'chat' && {CHAT}.loaded", 20)
    assert chat(page)["conversationId"] != state["conversationId"]


def test_a_model_the_server_does_not_serve_and_bad_settings_are_said_in_words(
    shared_server: ServerProcess, job: str, page: Any, requests: list[dict[str, Any]]
) -> None:
    open_chat(page, shared_server.url, "no-such-model")
    settings(page, max_tokens="8")
    send(page, "hello?")
    state = wait_idle(page, 1, 30)
    answer = state["turns"][0]["answers"]["tuned"]
    assert answer["state"] == "error"
    assert answer["error"]["status"] == 404 and answer["error"]["code"] == "model_not_found"
    error = page.get_by_test_id("answer-error")
    text = error.inner_text()
    assert "Model not found" in text
    assert "'no-such-model' does not exist" in text  # the server's own words
    assert page.get_by_test_id("retry-tuned").count() == 0  # sending it again cannot help

    # Settings out of range are refused before anything is sent.
    sent = len(requests)
    settings(page, temperature="3")
    send(page, "again")
    problem = page.get_by_test_id("chat-settings-error")
    problem.wait_for(state="visible", timeout=5 * SECOND)
    expect(problem).to_contain_text("Temperature is a number from 0", use_inner_text=True)
    expect(page.get_by_test_id("chat-temperature")).to_have_attribute("aria-invalid", "true")
    assert len(chat(page)["turns"]) == 1 and len(requests) == sent
    assert page.get_by_test_id("chat-input").input_value() == "again"  # nothing typed is lost


def test_a_crashed_chat_process_shows_its_reason_and_retry_answers(
    shared_server: ServerProcess, job: str, page: Any
) -> None:
    open_chat(page, shared_server.url, job)
    page.get_by_test_id("chat-new").click()
    settings(page, temperature="0", max_tokens=str(LONG))
    send(page, "Keep talking.")
    wait_js(page, f"{CHAT}.turns.length === 1 && {CHAT}.turns[0].answers.tuned.content.length >= 10", 120)
    pid = shared_server.inference_child()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)

    state = wait_idle(page, 1, 60)
    answer = state["turns"][0]["answers"]["tuned"]
    assert answer["state"] == "error"
    error = page.get_by_test_id("answer-error").inner_text()
    assert "The chat process stopped" in error
    assert "SIGKILL" in error  # the reason, as the server gives it

    settings(page, max_tokens="6")
    page.get_by_test_id("retry-tuned").click()
    state = wait_idle(page, 1, 120)
    retried = state["turns"][0]["answers"]["tuned"]
    assert retried["state"] == "done" and retried["error"] is None
    assert retried["usage"]["completion_tokens"] <= 6
    assert shared_server.inference_child() not in (None, pid)
