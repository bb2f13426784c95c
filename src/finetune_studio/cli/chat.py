"""`finetune-studio chat JOB_ID`: talk to what a job trained, in the terminal.

Each line read is a user message. It goes, with the whole conversation so far, to
the server's OpenAI-compatible `POST /v1/chat/completions` as a streamed request,
and the answer is printed as its tokens arrive. `/reset` forgets the conversation
(the `--system` message stays); `/exit` or the end of input ends the command.
`--base` talks to the model the job was trained from instead (its `model_name`,
which `GET /v1/models` lists), for a before-and-after comparison.

At a terminal there is a prompt, Ctrl-C stops an answer (the server then stops
generating it), and an answer that fails is reported and left out of the
conversation, which goes on; only what no next question can mend (an unknown
model, a wrong token, no server) ends it. From a pipe (`echo hi | finetune-studio
chat JOB`) only the answers are printed, one after the other, each ending with a
newline, and the first failure ends the command.

Exit status: 0 at the end of input or `/exit`; 1 the server failed (a 5xx: the
chat process died, say) or the answer broke off; 2 the server refused the request
(a 4xx, whose message is printed), or no server answered; 130 Ctrl-C at the prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Optional

import httpx

from finetune_studio.cli.client import StudioClient, StudioError, error_text, parse_sse

CHAT_PATH = "/v1/chat/completions"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_REFUSED = 2
EXIT_INTERRUPTED = 130
PROMPT = "> "
# Loading a model happens before an answer's first byte: it may take minutes on a CPU.
_TIMEOUT = httpx.Timeout(30.0, read=None)


class ChatFailed(Exception):
    """An answer that did not come, in words; `exit_code` as in the module docstring.

    `final`: no later question can fare better (an unknown model, a wrong token, no
    server), so even a conversation at a terminal ends.
    """

    def __init__(self, message: str, exit_code: int, final: bool = False) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.final = final


@dataclass(frozen=True)
class Answer:
    text: str
    finish_reason: Optional[str]


@dataclass
class Conversation:
    """The messages so far, and how each request for the next answer is made."""

    model: str
    system: Optional[str] = None
    temperature: Optional[float] = None
    max_tokens: Optional[int] = None
    turns: list[dict[str, str]] = field(default_factory=list)

    def reset(self) -> None:
        self.turns.clear()

    def request(self, question: str) -> dict[str, Any]:
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + self.turns
        body: dict[str, Any] = {"model": self.model, "messages": [*messages, {"role": "user", "content": question}],
                                "stream": True}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body

    def ask(self, http: httpx.Client, question: str, on_text: Callable[[str], None]) -> Answer:
        """Stream the answer to `question` into on_text; the conversation keeps both
        only once the answer is whole (a failed or interrupted one leaves no trace)."""
        answer = stream_answer(http, self.request(question), on_text)
        self.turns += [{"role": "user", "content": question}, {"role": "assistant", "content": answer.text}]
        return answer


def stream_answer(http: httpx.Client, body: dict[str, Any], on_text: Callable[[str], None]) -> Answer:
    """POST a streamed chat request and hand each piece of text to on_text as it comes."""
    parts: list[str] = []
    finish: Optional[str] = None
    try:
        with http.stream("POST", CHAT_PATH, json=body, timeout=_TIMEOUT) as response:
            if response.status_code >= 400:
                response.read()
                raise refusal(response)
            for data in _data_lines(response.iter_lines()):
                if data == "[DONE]":
                    return Answer("".join(parts), finish)
                chunk = json.loads(data)
                if "error" in chunk:  # the server failed after the answer had begun
                    raise ChatFailed(f"the answer broke off: {_error_words(chunk)}", EXIT_FAILED)
                for choice in chunk.get("choices") or ():
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        parts.append(text)
                        on_text(text)
                    finish = choice.get("finish_reason") or finish
    except httpx.TransportError as exc:
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            raise ChatFailed(
                f"cannot reach the server at {http.base_url} ({exc or type(exc).__name__}); is `finetune-studio serve`"
                " running there?",
                EXIT_REFUSED,
                final=True,
            ) from None
        raise ChatFailed(f"the connection to the server broke off before the answer's end ({type(exc).__name__})",
                         EXIT_FAILED) from None
    raise ChatFailed("the server ended the answer without its last line (data: [DONE])", EXIT_FAILED)


def _data_lines(lines: Iterator[str]) -> Iterator[str]:
    for _event_id, _kind, data in parse_sse(lines):
        yield data


def refusal(response: httpx.Response) -> ChatFailed:
    """The error of a refused request, in words: OpenAI's shape, or any other the server used."""
    try:
        body = response.json()
    except ValueError:
        body = None
    words = _error_words(body) if isinstance(body, dict) and isinstance(body.get("error"), dict) else None
    words = words or error_text(body) or response.text.strip() or response.reason_phrase
    status = response.status_code
    if status >= 500:
        return ChatFailed(f"the server failed ({status}): {words}", EXIT_FAILED)
    return ChatFailed(f"refused ({status}): {words}", EXIT_REFUSED, final=status in (401, 403, 404))


def _error_words(body: dict[str, Any]) -> str:
    """OpenAI's `{"error": {message, type, param, code}}` as one line."""
    error = body.get("error") or {}
    text = str(error.get("message") or "the server gave no reason")
    named = [f"{key} {error[key]}" for key in ("param", "code") if error.get(key)]
    return f"{text} ({', '.join(named)})" if named else text


def base_model_of(client: StudioClient, job_id: str) -> str:
    """The model a job was trained from: its `model_name`, the id /v1/models lists for it."""
    try:
        details = client.status(job_id).get("details") or {}
    except StudioError as exc:
        raise ChatFailed(f"cannot find job {job_id}'s base model: {exc}", EXIT_REFUSED, final=True) from None
    name = details.get("model_name")
    if not isinstance(name, str) or not name:
        raise ChatFailed(
            f"job {job_id} has not loaded its base model yet (its status names no details.model_name); chat with"
            " the base once the job has started, or name the model itself: finetune-studio chat MODEL_NAME",
            EXIT_REFUSED,
            final=True,
        )
    return name


class Terminal:
    """Where the conversation happens: lines in, text out, notes to the side.

    `interactive`: a person at a terminal (a prompt, Ctrl-C stops one answer, a
    failed answer does not end the conversation); otherwise a script's pipe.
    """

    def __init__(self, stdin: IO[str], stdout: IO[str], stderr: IO[str], interactive: bool) -> None:
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.interactive = interactive
        self._line_open = False  # text was written since the last newline

    def read(self) -> Optional[str]:
        """The next line without its newline; None at the end of input."""
        if self.interactive and self.stdin.isatty():
            try:
                return input(PROMPT)  # with line editing, where readline is loaded
            except EOFError:
                return None
        if self.interactive:
            self.write(PROMPT)
        line = self.stdin.readline()
        return line.rstrip("\n") if line else None

    def write(self, text: str) -> None:
        if text:
            self.stdout.write(text)
            self.stdout.flush()
            self._line_open = not text.endswith("\n")

    def end_line(self) -> None:
        if self._line_open:
            self.write("\n")

    def note(self, text: str) -> None:
        self.stderr.write(text + "\n")
        self.stderr.flush()


def converse(http: httpx.Client, conversation: Conversation, terminal: Terminal) -> int:
    """Answer line after line until the input ends; the exit status."""
    while True:
        try:
            line = terminal.read()
        except KeyboardInterrupt:
            terminal.note("")
            return EXIT_INTERRUPTED
        if line is None:
            if terminal.interactive:
                terminal.note("")
            return EXIT_OK
        question = line.strip()
        if not question:
            continue
        if question == "/exit":
            return EXIT_OK
        if question == "/reset":
            conversation.reset()
            if terminal.interactive:
                terminal.note("(the conversation is cleared)")
            continue
        try:
            answer = conversation.ask(http, question, terminal.write)
        except ChatFailed as exc:
            terminal.end_line()
            terminal.note(f"error: {exc}")
            if exc.final or not terminal.interactive:
                return exc.exit_code
            continue
        except KeyboardInterrupt:
            if not terminal.interactive:
                raise
            # Leaving the stream closed the connection: the server stops generating.
            terminal.write("\n")  # past the terminal's echo of ^C
            terminal.note("(stopped; this question and its answer are left out of the conversation)")
            continue
        if not terminal.interactive:
            terminal.write("\n")  # one newline after each answer, whatever it ends with: easy to split
            continue
        terminal.end_line()
        if answer.finish_reason == "length":
            terminal.note("(the answer reached --max-tokens)")
        terminal.write("\n")


def run_chat(
    client: StudioClient,
    model: str,
    *,
    base: bool = False,
    system: Optional[str] = None,
    temperature: Optional[float] = None,
    max_tokens: Optional[int] = None,
    terminal: Terminal,
) -> int:
    """The `chat` command: `model` is a job id (or any model id /v1/models lists)."""
    try:
        shown = model
        if base:
            job_id, model = model, base_model_of(client, model)
            shown = f"{model}, the base model of job {job_id}"
        conversation = Conversation(model, system, temperature, max_tokens)
        if terminal.interactive:
            terminal.note(f"chatting with {shown}; /reset clears the conversation, /exit or Ctrl-D ends it")
        return converse(client.http, conversation, terminal)
    except ChatFailed as exc:
        terminal.note(f"error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        terminal.note("")
        return EXIT_INTERRUPTED
