"""`finetune-studio train`: a request from the flags, a server to send it to, and the job followed to its end.

    build_request(args, cpu=...)   the flags as a `POST /train/start` body (pure; unit-tested)
    request_for(args, ...)         that body for the server at hand: with --device auto, the fields
                                   the flags leave unset as its `GET /system` recommends (cli/machine.py)
    may_start_server(url)          whether this command may start a server at url itself
    run_train(args)                the command: find or start the server, queue, follow, exit status

When nothing answers at a loopback `--server`, the command starts `finetune-studio
serve` there (cli/local_server.LocalServer, in its own session so that Ctrl-C
reaches only this command) and stops it when the job ends; with `--detach`, or
when the user leaves the job running at Ctrl-C, the server keeps running and the
command says how to stop it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, Optional
from urllib.parse import urlsplit

from finetune_studio.cli.client import StudioClient, StudioError
from finetune_studio.cli.follow import (
    EXIT_FAILED,
    EXIT_LEFT_RUNNING,
    EXIT_REFUSED,
    Notes,
    ask_on_terminal,
    follow,
    report,
)
from finetune_studio.cli.local_server import LocalServer
from finetune_studio.cli.machine import fit_to_machine
from finetune_studio.cli.progress import make_view
from finetune_studio.cuda_features import CPU_SETTINGS

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# Where a started server can be reached: LocalServer binds 127.0.0.1.
STARTABLE_HOSTS = ("127.0.0.1", "localhost")
# A busy machine can take a while to import the server; its log says why it did not come up.
SERVER_START_SECONDS = 60.0
# flag (argparse dest) -> request field
FLAG_FIELDS = {
    "max_steps": "max_steps",
    "epochs": "num_epochs",
    "lr": "learning_rate",
    "batch_size": "batch_size",
    "lora_r": "lora_r",
    "max_seq_length": "max_seq_length",
}


def has_nvidia_gpu() -> bool:
    """Whether this machine has an NVIDIA driver; a guess at CUDA without importing torch (seconds)."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def is_loopback(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS


def may_start_server(url: str) -> bool:
    """Only a plain-http URL of 127.0.0.1 (or localhost) with a port names a server this command can start."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in STARTABLE_HOSTS or parts.path not in ("", "/"):
        return False
    try:
        return parts.port is not None
    except ValueError:  # a port that is not a number
        return False


def runs_on_cpu(device: str, url: str) -> bool:
    """cpu and cuda say so; auto guesses from this machine, and only for a server on it."""
    if device != "auto":
        return device == "cpu"
    return is_loopback(url) and not has_nvidia_gpu()


def local_path_or_name(name: str) -> str:
    """A path that exists here, made absolute (the server may run in another folder); else as given (a hub id)."""
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def build_request(args: argparse.Namespace, *, cpu: bool) -> dict[str, Any]:
    """The `POST /train/start` body for the flags: only what they set, then every --set."""
    request: dict[str, Any] = {
        "model_name": local_path_or_name(args.model),
        "training_type": args.training_type,
        "format_type": args.format,
        "local_datasets": [str(Path(path).expanduser().resolve()) for path in args.data],
    }
    for flag, name in FLAG_FIELDS.items():
        value = getattr(args, flag)
        if value is not None:
            request[name] = value
    if cpu:
        request.update(CPU_SETTINGS)
    for key, value in args.set or ():  # (key, value) pairs, parsed by main._setting
        request[key] = value
    return request


def request_for(args: argparse.Namespace, client: StudioClient, notes: Notes) -> dict[str, Any]:
    """The request for the server at hand. --device cpu adds CPU_SETTINGS and --device cuda
    nothing (the user said which); auto fills the fields the flags leave unset as the
    server's `GET /system` recommends, as the page does, and from a server that cannot
    say (an older one) sends what it always did: CPU_SETTINGS for a server on this
    machine when it has no NVIDIA driver."""
    if args.device != "auto":
        return build_request(args, cpu=args.device == "cpu")
    fitted = fit_to_machine(build_request(args, cpu=False), client, notes.say)
    return fitted if fitted is not None else build_request(args, cpu=runs_on_cpu(args.device, args.server))


def _data_dir(args: argparse.Namespace) -> Path:
    if args.data_dir:
        return Path(args.data_dir).expanduser().resolve()
    from finetune_studio.config import get_settings

    return get_settings().data_dir


def _start_server(args: argparse.Namespace, client: StudioClient, notes: Notes) -> Optional[LocalServer]:
    """Start a server at --server (a URL `may_start_server` allows), or None when one answered there meanwhile."""
    server = LocalServer(_data_dir(args), port=urlsplit(args.server).port, log_level="info", detached=True)
    notes.say(f"nothing answers at {args.server}; starting a server there (data in {server.data_dir}) ...")
    try:
        server.start(timeout=SERVER_START_SECONDS)
    except RuntimeError as exc:
        if client.answers():
            return None
        raise StudioError(f"could not start a server at {args.server}: {exc}") from None
    return server


@dataclass
class Reached:
    """What a command set up to reach its server: the server it started (None where one
    answered) and the signal handlers it replaced meanwhile; `release` undoes both."""

    server: Optional[LocalServer] = None
    previous_handlers: dict[int, Any] = field(default_factory=dict)

    def reach(self, args: argparse.Namespace, client: StudioClient, notes: Notes) -> bool:
        """Whether a server answers at --server, starting one there where nothing does and the
        flags allow it (`may_start_server`); False, said in `notes`, where it may not."""
        if client.answers():
            return True
        if args.no_start_server or not may_start_server(args.server):
            why = "--no-start-server was given" if args.no_start_server else "it is not a loopback http URL with a port"
            notes.error(
                f"nothing answers at {args.server}; start a server there (`finetune-studio serve`) or name"
                f" another with --server (this command starts one itself only at a loopback address; {why})"
            )
            return False
        self.previous_handlers = {sig: signal.signal(sig, _exit_on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
        self.server = _start_server(args, client, notes)
        return True

    def run(self, args: argparse.Namespace, notes: Notes, work: Callable[[StudioClient], int]) -> int:
        """`work`'s exit status with a client of the server at --server (reached or started as
        `reach` says, and released after); a refusal or a failure of the server's, said in `notes`,
        is EXIT_REFUSED (the server answered no) or EXIT_FAILED."""
        with StudioClient(args.server, token=args.token) as client:
            try:
                if not self.reach(args, client, notes):
                    return EXIT_REFUSED
                return work(client)
            except StudioError as exc:
                notes.error(str(exc))
                return EXIT_REFUSED if exc.status_code is not None else EXIT_FAILED
            finally:
                self.release()

    def release(self, keep: bool = False) -> None:
        """Stop the server this command started (unless it is to keep running), and restore the signal handlers."""
        _release(self.server, keep=keep, previous_handlers=self.previous_handlers)


def _describe_kept(server: LocalServer) -> str:
    return (
        f"the server at {server.url} keeps running (pid {server.pid}, log {server.log_path});"
        f" stop it with `kill {server.pid}`"
    )


def _exit_on_signal(signum: int, frame: Optional[FrameType]) -> None:
    # SIGTERM or a closed terminal: unwind, so that a server this command started is stopped.
    raise SystemExit(128 + signum)


def run_train(args: argparse.Namespace, stdout: IO[str] = sys.stdout, stderr: IO[str] = sys.stderr) -> int:
    notes = Notes(stdout, stderr, stdout_for_scripts=args.output_json or args.detach)
    reached = Reached()
    keep_server = bool(args.detach)
    with StudioClient(args.server, token=args.token) as client:
        try:
            if not reached.reach(args, client, notes):
                return EXIT_REFUSED
            server = reached.server
            if server is not None and not keep_server:
                notes.say(f"server up at {server.url} (pid {server.pid}); it stops when the job ends")
            job_id = client.start(request_for(args, client, notes))
        except StudioError as exc:
            notes.error(f"the job was not queued: {exc}")
            reached.release()
            return EXIT_REFUSED
        except KeyboardInterrupt:
            notes.error("interrupted; no job was queued")
            reached.release()
            return EXIT_LEFT_RUNNING
        try:
            if args.detach:
                _say_detached(job_id, server, args, stdout, stderr)
                return 0
            notes.say(f"queued job {job_id} at {args.server}; Ctrl-C asks whether to stop it")
            view = make_view(stdout, output_json=args.output_json)
            try:
                outcome = follow(client, job_id, view, ask_on_terminal, notes.say)
            except StudioError as exc:
                notes.error(f"{exc}; the job may still be running: `finetune-studio status {job_id}`")
                return EXIT_FAILED
            if outcome.left_running and server is not None:
                keep_server = True
                notes.say(_describe_kept(server))
            return report(outcome, view, notes)
        finally:
            reached.release(keep=keep_server)


def _say_detached(job_id: str, server: Optional[LocalServer], args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> None:
    """--detach: stdout gets the job id alone (or one JSON object), for `JOB=$(finetune-studio train ... --detach)`."""
    if args.output_json:
        record = {"event": "queued", "job_id": job_id, "server": args.server,
                  "server_pid": None if server is None else server.pid}
        stdout.write(json.dumps(record) + "\n")
    else:
        stdout.write(job_id + "\n")
    stdout.flush()
    stderr.write(
        f"queued job {job_id} at {args.server}; follow it with `finetune-studio watch {job_id}`,"
        f" stop it with `finetune-studio stop {job_id}`\n"
    )
    if server is not None:
        stderr.write(_describe_kept(server) + "\n")
    stderr.flush()


def _release(server: Optional[LocalServer], *, keep: bool, previous_handlers: dict[int, Any]) -> None:
    """Stop the server this command started (unless it is to keep running), and restore the signal handlers."""
    try:
        if server is not None and not keep:
            server.stop()
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
