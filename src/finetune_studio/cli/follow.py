"""Following a job's stream to its end, with Ctrl-C turned into a question.

`follow` shows every event of a job in a view until the job ends. On Ctrl-C it
takes the view down and asks "Stop job X? [y/N]": yes sends the stop and keeps
following until the job ends `stopped`; no keeps following; a second Ctrl-C at
the question (or a Ctrl-C with no terminal to ask on) leaves the job running and
returns at once. After a question the stream resumes from the last event shown,
so no event is lost or shown twice.

`report` then says how the job ended and gives the exit status that `train` and
`watch` share (the EXIT_ constants).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, Literal, Optional

from finetune_studio.cli.client import StudioClient, StudioError
from finetune_studio.cli.progress import AnyView, JsonLinesView

Answer = Literal["stop", "follow", "leave"]
Ask = Callable[[str], Answer]

# The exit statuses of the commands that follow a job (documented in their --help).
EXIT_COMPLETED = 0
EXIT_FAILED = 1  # the job ended in error or stopped; or the stream was lost
EXIT_REFUSED = 2  # bad usage, the server refused the request, or no server answered
EXIT_LEFT_RUNNING = 130  # Ctrl-C: the job was left running (128 + SIGINT, as shells report it)

# Where a job saved what it trained: a LoRA adapter, or the full model.
SAVED_KEYS = ("adapter_dir", "model_dir")


@dataclass
class Outcome:
    """How following a job ended: its terminal status, or None when the user left it running."""

    job_id: str
    status: Optional[dict[str, Any]] = None
    progress: Optional[dict[str, Any]] = field(default=None, repr=False)

    @property
    def left_running(self) -> bool:
        return self.status is None

    @property
    def phase(self) -> Optional[str]:
        return None if self.status is None else str(self.status["phase"])

    @property
    def details(self) -> dict[str, Any]:
        return dict((self.status or {}).get("details") or {})

    @property
    def saved_to(self) -> Optional[str]:
        return next((str(self.details[key]) for key in SAVED_KEYS if self.details.get(key)), None)

    @property
    def exit_code(self) -> int:
        if self.status is None:
            return EXIT_LEFT_RUNNING
        return EXIT_COMPLETED if self.phase == "completed" else EXIT_FAILED

    def summary(self) -> dict[str, Any]:
        """The last JSON line of --output-json: what a script wants to know about the job."""
        details = self.details
        status = self.status or {}
        progress = self.progress or {}
        return {
            "event": "summary",
            "job_id": self.job_id,
            "phase": self.phase,
            "left_running": self.left_running,
            "message": status.get("message"),
            "error": status.get("error"),
            "error_code": details.get("error_code"),
            "steps": details.get("steps", progress.get("step")),
            "total_steps": details.get("total_steps", progress.get("total_steps")),
            "loss": progress.get("loss"),
            "train_loss": details.get("train_loss"),
            "saved_to": self.saved_to,
            "exit_code": self.exit_code,
        }


def follow(client: StudioClient, job_id: str, view: AnyView, ask: Ask, notify: Callable[[str], None]) -> Outcome:
    """Show the job's events until it ends (or the user leaves it); `notify` gets the notes for the user."""
    outcome = Outcome(job_id)
    cursor = 0
    while True:
        try:
            resumed = False
            for event in client.stream(job_id, last_event_id=cursor):
                view.show(event)
                cursor = event.id
                if event.kind == "progress":
                    outcome.progress = event.data
                if event.is_terminal:
                    if _resumed_since(client, job_id, event.data):
                        resumed = True  # a pause its events go on from: follow them
                        break
                    outcome.status = event.data
                    view.close()
                    return outcome
            if not resumed:
                raise StudioError(f"the stream of job {job_id} ended before the job did")
        except KeyboardInterrupt:
            # The bar stays down while the user answers and reads what came of it.
            with view.paused():
                answer = ask(f"Stop job {job_id}? [y/N] ")
                if answer == "stop":
                    try:
                        status = client.stop(job_id)
                        notify(f"asked job {job_id} to stop: {status['message']}")
                    except StudioError as exc:  # it ended meanwhile (409): the stream shows how
                        notify(f"could not stop job {job_id}: {exc}")
            if answer == "leave":
                view.close()
                notify(f"left job {job_id} running; `finetune-studio stop {job_id}` stops it")
                return outcome


def _resumed_since(client: StudioClient, job_id: str, status: dict[str, Any]) -> bool:
    """Whether a paused job (`stopped` with details.paused) has been resumed since this status."""
    if not (status.get("details") or {}).get("paused"):
        return False
    return client.status(job_id).get("phase") != "stopped"


class Notes:
    """Notes for the user: on stdout, except where stdout is for a script (JSON lines, or --detach's job id)."""

    def __init__(self, stdout: IO[str], stderr: IO[str], stdout_for_scripts: bool) -> None:
        self.out = stderr if stdout_for_scripts else stdout
        self.err = stderr

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def error(self, text: str) -> None:
        self.err.write(f"error: {text}\n")
        self.err.flush()


def how_it_ended(what: str, object_id: str, status: dict[str, Any]) -> str:
    """'export e1 ended error (export_failed): why': an export's or evaluation's end that is not `completed`."""
    code = (status.get("details") or {}).get("error_code")
    why = status.get("error") or status["message"]
    return f"{what} {object_id} ended {status['phase']}{f' ({code})' if code else ''}: {why}"


def follow_until_done(
    client: StudioClient,
    job_id: str,
    view: AnyView,
    notify: Callable[[str], None],
    *,
    what: str,
    prefix: str,
    stop: Callable[[str], dict[str, Any]],
) -> Optional[dict[str, Any]]:
    """Show the events of an export or an evaluation (`what`, under the routes `prefix`)
    until it ends: its terminal status. Ctrl-C stops it (`stop`) and keeps following; a
    second Ctrl-C leaves it running (None)."""
    cursor, stopping = 0, False
    while True:
        try:
            for event in client.stream(job_id, last_event_id=cursor, prefix=prefix):
                view.show(event)
                cursor = event.id
                if event.is_terminal:
                    view.close()
                    return event.data
            raise StudioError(f"the stream of {what} {job_id} ended before the {what} did")
        except KeyboardInterrupt:
            if stopping:
                view.close()
                notify(f"left {what} {job_id} running; `curl -X POST ...{prefix}/stop/{job_id}` stops it")
                return None
            stopping = True
            try:
                notify(f"stopping {what} {job_id} (Ctrl-C again leaves it running): {stop(job_id)['message']}")
            except StudioError as exc:  # it ended meanwhile (409): the stream shows how
                notify(f"could not stop {what} {job_id}: {exc}")


def report(outcome: Outcome, view: AnyView, notes: Notes) -> int:
    """The last word on a followed job (the summary line under --output-json), and the exit status."""
    if isinstance(view, JsonLinesView):
        view.write(outcome.summary())
    if outcome.left_running:
        return outcome.exit_code
    if outcome.phase == "completed":
        saved = f"; saved in {outcome.saved_to}" if outcome.saved_to else ""
        notes.say(f"job {outcome.job_id} completed{saved}")
    elif outcome.phase == "stopped" and outcome.details.get("paused"):
        notes.err.write(
            f"job {outcome.job_id} paused: {(outcome.status or {}).get('message')}; resume it with"
            f" POST /v1/fine_tuning/jobs/{outcome.job_id}/resume\n"
        )
    elif outcome.phase == "stopped":
        notes.err.write(f"job {outcome.job_id} stopped: {(outcome.status or {}).get('message')}\n")
    else:
        status = outcome.status or {}
        code = outcome.details.get("error_code")
        notes.error(f"job {outcome.job_id} ended in error{f' ({code})' if code else ''}: {status.get('error') or status.get('message')}")
    return outcome.exit_code


def ask_on_terminal(question: str, stdin: IO[str] = sys.stdin, out: IO[str] = sys.stderr) -> Answer:
    """Ask on the terminal; with no terminal (a pipe, a script), leave the job running without asking."""
    if not stdin.isatty():
        out.write("Ctrl-C: stdin is not a terminal, so not asking whether to stop the job\n")
        out.flush()
        return "leave"
    out.write(question)
    out.flush()
    try:
        reply = stdin.readline()
    except KeyboardInterrupt:
        out.write("\n")
        return "leave"
    if not reply:  # end of input (Ctrl-D): the default, no
        out.write("\n")
        return "follow"
    return "stop" if reply.strip().lower() in ("y", "yes") else "follow"
