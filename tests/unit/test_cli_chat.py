"""`finetune-studio chat`: the requests a conversation makes (against a stand-in
transport), and the command against the chat routes of a real app with the stand-in
inference child (tests/helpers/stand_in_chat_child.py, which echoes the last user
message word by word), called in-process and run as a real subprocess."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from finetune_studio.cli.chat import Conversation, Terminal, converse, run_chat
from finetune_studio.cli.client import StudioClient
from finetune_studio.cli.local_server import free_port
from finetune_studio.cli.main import main
from tests.helpers.chat import BASE, TOKEN, ChatServer, chat_module_fixtures, kill_the_child_once_it_holds
from tests.helpers.polling import wait_for

# One server for the module (its child starts once, and again where a test kills it); each test
# leaves no request behind in the child.
server, nothing_left_in_the_child = chat_module_fixtures("cli-chat")


@pytest.fixture(scope="module")
def jobs(server: ChatServer) -> dict[str, str]:
    return {"lora": server.job("lora", "completed"), "hold": server.job("hold", "training")}


def chat(server_url: str, *argv: str, stdin: str, token: str = TOKEN, monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`finetune-studio chat ...` in this process, from a pipe: (exit status, stdout, stderr)."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main(["chat", *argv, "--server", server_url, "--token", token])
    out, err = capsys.readouterr()
    return code, out, err


class Recorded(Terminal):
    """A terminal that keeps each piece written to it, as it came."""

    def __init__(self, lines: str, interactive: bool) -> None:
        self.written, self.noted = io.StringIO(), io.StringIO()
        super().__init__(io.StringIO(lines), self.written, self.noted, interactive=interactive)
        self.pieces: list[str] = []

    def write(self, text: str) -> None:
        self.pieces.append(text)
        super().write(text)

    @property
    def out(self) -> str:
        return self.written.getvalue()

    @property
    def err(self) -> str:
        return self.noted.getvalue()


# -- the requests, against a stand-in transport -----------------------------------


def sse(*texts: str) -> bytes:
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    chunks += [{"choices": [{"index": 0, "delta": {"content": text}}]} for text in texts]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"


def test_each_request_carries_the_conversation_so_far_and_reset_forgets_it() -> None:
    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, content=sse("answer ", str(len(sent))), headers={"content-type": "text/event-stream"})

    http = httpx.Client(base_url="http://studio.test", transport=httpx.MockTransport(answer))
    terminal = Recorded("one\n\n  two  \n/reset\nthree\n", interactive=False)
    conversation = Conversation("job1", system="be brief", temperature=0.0, max_tokens=5)
    assert converse(http, conversation, terminal) == 0

    system = {"role": "system", "content": "be brief"}
    assert [body["messages"] for body in sent] == [
        [system, {"role": "user", "content": "one"}],
        [system, {"role": "user", "content": "one"}, {"role": "assistant", "content": "answer 1"},
         {"role": "user", "content": "two"}],
        [system, {"role": "user", "content": "three"}],  # after /reset: the system message stays
    ]
    assert {key: value for key, value in sent[0].items() if key != "messages"} == {
        "model": "job1", "stream": True, "temperature": 0.0, "max_tokens": 5}
    assert terminal.out == "answer 1\nanswer 2\nanswer 3\n" and terminal.err == ""

    # Left out, the server's defaults apply: nothing is sent for them.
    Conversation("job1").ask(http, "four", lambda text: None)
    assert set(sent[-1]) == {"model", "messages", "stream"} and sent[-1]["messages"] == [{"role": "user", "content": "four"}]


def test_a_failed_answer_leaves_no_trace_in_the_conversation() -> None:
    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(json.loads(request.content)["messages"])
        if len(calls) == 1:  # the first answer breaks off half-way, as after a crash of the chat process
            broken = b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "half"}}]}).encode() + b"\n\n"
            broken += b'data: {"error": {"message": "the chat process died", "type": "server_error"}}\n\n'
            return httpx.Response(200, content=broken)
        return httpx.Response(200, content=sse("fine"))

    http = httpx.Client(base_url="http://studio.test", transport=httpx.MockTransport(answer))
    terminal = Recorded("first\nsecond\n", interactive=True)
    assert converse(http, Conversation("job1"), terminal) == 0
    assert calls[1] == [{"role": "user", "content": "second"}]  # not the first question, nor half an answer
    assert "error: the answer broke off: the chat process died" in terminal.err
    assert terminal.out == "> half\n> fine\n\n> "


# -- the command, against the chat routes ------------------------------------------


def test_piped_lines_are_each_answered_and_only_the_answers_printed(
    server: ChatServer, jobs: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = chat(server.url, jobs["lora"], stdin="hello there world\n\nsecond line\n/exit\nnever asked\n",
                          monkeypatch=monkeypatch, capsys=capsys)
    assert (code, out, err) == (0, "hello there world\nsecond line\n", "")


def test_the_answer_is_printed_as_it_streams(server: ChatServer, jobs: dict[str, str]) -> None:
    terminal = Recorded("one two three four\n", interactive=False)
    with StudioClient(server.url, token=TOKEN) as client:
        assert run_chat(client, jobs["lora"], terminal=terminal) == 0
    # Each word is its own delta in the stand-in child: written as it came, then the newline.
    assert terminal.pieces == ["one ", "two ", "three ", "four", "\n"]


def test_the_options_reach_the_model(
    server: ChatServer, jobs: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = chat(server.url, jobs["lora"], "--temperature", "0", "--max-tokens", "7", stdin="__params__\n",
                        monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0
    assert json.loads(out) == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 7, "stop": [], "seed": None}


def test_base_talks_to_the_model_the_job_was_trained_from(
    server: ChatServer, jobs: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, tuned, _ = chat(server.url, jobs["lora"], stdin="__model__\n", monkeypatch=monkeypatch, capsys=capsys)
    code, base, _ = chat(server.url, jobs["lora"], "--base", stdin="__model__\n", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0
    assert json.loads(tuned)["adapter"] == str(server.settings.jobs_dir / jobs["lora"] / "adapter")
    assert json.loads(base) == {"base": {"kind": "hub", "location": BASE}, "adapter": None, "trust_remote_code": False}


@pytest.mark.parametrize(
    ("model", "args", "token", "says"),
    [
        ("no-such-model", [], TOKEN, "refused (404): the model 'no-such-model' does not exist"),
        ("hold", [], TOKEN, "is still running (phase training) and has no model to serve yet"),
        ("lora", [], "wrong-token-wrong-token", "refused (401): missing or wrong API key"),
        ("lora", ["--max-tokens", "100"], TOKEN, "(param max_tokens, code context_length_exceeded)"),
        ("no-such-job", ["--base"], TOKEN, "cannot find job no-such-job's base model: 404"),
    ],
)
def test_a_refused_request_is_printed_in_words_and_exits_2(
    server: ChatServer, jobs: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    model: str, args: list[str], token: str, says: str,
) -> None:
    code, out, err = chat(server.url, jobs.get(model, model), *args, stdin="hi\nagain\n", token=token,
                          monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and says in err and err.count("error: ") == 1  # the first failure ends it


def test_no_server_exits_2_saying_where_it_looked(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    code, out, err = chat(url, "job1", stdin="hi\n", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and out == ""
    assert f"error: cannot reach the server at {url}" in err and "finetune-studio serve" in err


def test_a_failure_of_the_server_exits_1(
    server: ChatServer, jobs: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = chat(server.url, jobs["lora"], stdin="fail internal\nhi\n", monkeypatch=monkeypatch, capsys=capsys)
    assert (code, out) == (1, "")
    assert "error: the server failed (500): the fake child failed on purpose (code internal_error)" in err


def test_a_child_killed_while_answering_ends_the_answer_and_the_next_question_is_answered(
    server: ChatServer, jobs: dict[str, str]
) -> None:
    # Killed before its `started`, the answer is a 503; after it, the stream's last line is the error
    # (the stand-in transport's test above): which one comes is a race here, and both say why.
    piped = Recorded("hang\n", interactive=False)
    at_terminal = Recorded("hang\nback again\n", interactive=True)
    for terminal in (piped, at_terminal):
        codes: list[int] = []
        with StudioClient(server.url, token=TOKEN) as client:
            asking = threading.Thread(target=lambda into=codes, to=terminal, by=client: into.append(
                run_chat(by, jobs["lora"], terminal=to)))
            asking.start()
            kill_the_child_once_it_holds(server, 1)
            asking.join(timeout=60)
        assert not asking.is_alive()
        assert "The inference process was killed by SIGKILL" in terminal.err and terminal.err.count("error: ") == 1
        assert codes == ([1] if terminal is piped else [0])
    # At a terminal the conversation went on, and the next question started a new child.
    assert at_terminal.out.endswith("> back again\n\n> ")


def test_at_a_terminal_ctrl_c_stops_one_answer_and_the_conversation_goes_on(server: ChatServer, jobs: dict[str, str]) -> None:
    class CtrlC(Recorded):
        def write(self, text: str) -> None:
            if text == "tick ":  # an answer that would go on until max_tokens
                raise KeyboardInterrupt
            super().write(text)

    terminal = CtrlC("forever\n/reset\nstill here\n", interactive=True)
    cancelled = server.log.count("cancelled ")
    with StudioClient(server.url, token=TOKEN) as client:
        assert run_chat(client, jobs["lora"], terminal=terminal) == 0
    wait_for(lambda: server.log.count("cancelled ") == cancelled + 1, timeout=30, what="the child to be told to cancel")
    assert "(stopped; this question and its answer are left out of the conversation)" in terminal.err
    assert "(the conversation is cleared)" in terminal.err
    assert terminal.out.endswith("> still here\n\n> ")
    assert terminal.err.startswith(f"chatting with {jobs['lora']}; /reset clears the conversation")


def test_at_a_terminal_an_unknown_model_still_ends_the_command(server: ChatServer) -> None:
    terminal = Recorded("hi\nagain\n", interactive=True)
    with StudioClient(server.url, token=TOKEN) as client:
        assert run_chat(client, "no-such-model", terminal=terminal) == 2
    assert terminal.err.count("error: refused (404)") == 1


def test_the_real_command_from_a_pipe(server: ChatServer, jobs: dict[str, str], tmp_path: Path) -> None:
    command = [sys.executable, "-m", "finetune_studio.cli.main", "chat", jobs["lora"], "--server", server.url]
    env = {"PATH": "/usr/bin:/bin", "FINETUNE_STUDIO_TOKEN": TOKEN, "HOME": str(tmp_path)}
    answered = subprocess.run(command, input="hi there\nhow are you\n", capture_output=True, text=True, env=env,
                              timeout=120, check=False)
    assert (answered.returncode, answered.stdout, answered.stderr) == (0, "hi there\nhow are you\n", "")
    refused = subprocess.run([*command[:4], "no-such-model", *command[5:]], input="hi\n", capture_output=True,
                             text=True, env=env, timeout=120, check=False)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "error: refused (404): the model 'no-such-model' does not exist" in refused.stderr
