"""The `finetune-studio` command: serve, train, watch, jobs, status, stop, chat, inspect, export, eval, demo, make-tiny-model."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

# Each command imports what it needs when it runs: `serve` must start fast, and the
# client's httpx and the progress view's rich would cost it a quarter of a second.
if TYPE_CHECKING:
    from finetune_studio.cli.client import StudioClient

DEFAULT_SERVER = "http://127.0.0.1:8000"
# The request's literals (schemas.TrainingType and FormatType), written out so that
# building the parser imports no pydantic; a unit test checks they agree.
TRAINING_TYPES = ("LoRA/QLoRA", "Full Finetuning", "Continued Pretraining")
FORMAT_TYPES = ("auto", "alpaca", "chatml", "sharegpt", "raw")
# llama.cpp's names (schemas.GgufQuantization and LoraGgufType), written out likewise.
GGUF_QUANTIZATIONS = ("f16", "bf16", "q8_0", "q4_k_m", "q5_k_m", "q6_k")
LORA_GGUF_TYPES = ("f16", "bf16", "q8_0")


def _serve(args: argparse.Namespace) -> int:
    # Start-up builds many thousands of objects (FastAPI's and pydantic's models),
    # none of them garbage: with the cyclic collector off until the app is built,
    # the server answers about 10% sooner (docs/BENCHMARKS.md), and freezing them
    # keeps them out of every later collection.
    gc.disable()
    try:
        import uvicorn
        from pydantic import ValidationError

        from finetune_studio.api.app import create_app
        from finetune_studio.config import get_settings
        from finetune_studio.errors import DataDirInUse, UnsafeSettings
        from finetune_studio.jobs.lock import DataDirLock

        try:
            settings = get_settings(
                host=args.host, port=args.port, data_dir=args.data_dir, max_concurrent_jobs=args.max_concurrent_jobs,
                ray_address=args.ray_address, max_concurrent_exports=args.max_concurrent_exports,
                max_concurrent_evals=args.max_concurrent_evals, accounts=True if args.accounts else None,
            )
        except UnsafeSettings as exc:  # a token that cannot protect anything, say
            print(f"error: refusing to start: {exc}", file=sys.stderr)
            return 2
        except ValidationError as exc:
            # Each setting and what is wrong with it; never the value (it may be a secret).
            for error in exc.errors():
                where = ".".join(str(part) for part in error["loc"]) or "settings"
                print(f"error: setting {where} (FINETUNE_STUDIO_{where.upper()}): {error['msg']}", file=sys.stderr)
            return 2
        if not settings.is_loopback() and settings.token is None and not settings.accounts:
            print(
                f"error: refusing to bind {settings.host}: anyone on the network could start jobs and read your files.\n"
                "Set FINETUNE_STUDIO_TOKEN to a long random secret (clients send it as 'Authorization: Bearer ...'),"
                " turn accounts on (--accounts), or bind 127.0.0.1.",
                file=sys.stderr,
            )
            return 2
        try:
            # Before anything binds or recovers: the data dir's one owner (jobs/lock.py).
            lock = DataDirLock.acquire(settings.data_dir, settings.url)
        except DataDirInUse as exc:
            print(f"error: refusing to start: {exc}", file=sys.stderr)
            return 2
        app = create_app(settings, data_dir_lock=lock)
        gc.freeze()
    finally:
        gc.enable()
    print(f"finetune-studio: data in {settings.data_dir}; UI and API on http://{settings.host}:{settings.port}/", flush=True)
    try:
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            log_level=args.log_level,
            # Streams of queued jobs never end by themselves; give them a moment, then
            # let the supervisor stop the running jobs cleanly.
            timeout_graceful_shutdown=3,
        )
    finally:
        lock.release()
    return 0


def _make_tiny_model(args: argparse.Namespace) -> int:
    from finetune_studio.child.tiny_model import build_tiny_model

    path = build_tiny_model(Path(args.directory).expanduser().resolve())
    print(f"wrote a tiny random Llama to {path}")
    return 0


def _export(args: argparse.Namespace) -> int:
    if args.gguf or args.lora_gguf:
        if args.merged:
            print("error: --merged writes a folder here, in this process; run it apart from --gguf/--lora-gguf,"
                  " which the server exports", file=sys.stderr)
            return 2
        from finetune_studio.cli.export_job import run_export_job

        return run_export_job(args, sys.stdout, sys.stderr)  # as _train: the streams of now
    if not args.merged:
        print("error: name what to export: --gguf QUANTIZATIONS (q4_k_m,q8_0), --lora-gguf, or --merged DIR", file=sys.stderr)
        return 2
    from finetune_studio.cli.export import ExportError, export_merged, find_job_dir
    from finetune_studio.config import get_settings

    data_dir = Path(args.data_dir).expanduser() if args.data_dir else get_settings().data_dir
    try:
        job_dir = find_job_dir(args.job_id, data_dir)
        print(f"merging {job_dir} into a {args.dtype} model ...", flush=True)
        out = export_merged(job_dir, Path(args.merged), args.dtype)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out} (load it with AutoModelForCausalLM.from_pretrained({str(out)!r}))")
    return 0


def _train(args: argparse.Namespace) -> int:
    from finetune_studio.cli.train import run_train

    # The streams of now, not the defaults bound when train.py was imported (a caller may have swapped them).
    return run_train(args, sys.stdout, sys.stderr)


def _watch(args: argparse.Namespace) -> int:
    from finetune_studio.cli.client import StudioClient, StudioError
    from finetune_studio.cli.follow import EXIT_FAILED, EXIT_REFUSED, Notes, ask_on_terminal, follow, report
    from finetune_studio.cli.progress import make_view

    notes = Notes(sys.stdout, sys.stderr, stdout_for_scripts=args.output_json)
    view = make_view(sys.stdout, output_json=args.output_json)
    with StudioClient(args.server, token=args.token) as client:
        try:
            outcome = follow(client, args.job_id, view, ask_on_terminal, notes.say)
        except StudioError as exc:
            notes.error(str(exc))
            return EXIT_REFUSED if exc.status_code is not None else EXIT_FAILED
    return report(outcome, view, notes)


def _client_command(run: Callable[[StudioClient, argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """jobs, status, stop: a client for --server, and 2 with the server's words when it refuses."""

    def command(args: argparse.Namespace) -> int:
        from finetune_studio.cli.client import StudioClient, StudioError
        from finetune_studio.cli.follow import EXIT_REFUSED

        with StudioClient(args.server, token=args.token) as client:
            try:
                return run(client, args)
            except StudioError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return EXIT_REFUSED

    return command


def _jobs(client: StudioClient, args: argparse.Namespace) -> int:
    from finetune_studio.cli.jobs import run_jobs

    return run_jobs(client, sys.stdout, args.output_json)


def _status(client: StudioClient, args: argparse.Namespace) -> int:
    from finetune_studio.cli.jobs import run_status

    return run_status(client, args.job_id, sys.stdout, args.output_json)


def _stop(client: StudioClient, args: argparse.Namespace) -> int:
    from finetune_studio.cli.jobs import run_stop

    return run_stop(client, args.job_id, sys.stdout, args.output_json)


def _webhooks(client: StudioClient, args: argparse.Namespace) -> int:
    from finetune_studio.cli import webhooks

    if args.action == "add":
        events = [name.strip() for text in args.events for name in text.split(",") if name.strip()]
        return webhooks.run_add(client, args.url, events, args.secret, sys.stdout, args.output_json)
    if args.action == "remove":
        return webhooks.run_remove(client, args.webhook_id, sys.stdout, args.output_json)
    return webhooks.run_list(client, sys.stdout, args.output_json)


def _sweep(client: StudioClient, args: argparse.Namespace) -> int:
    from finetune_studio.cli.sweep import run_sweep

    return run_sweep(client, Path(args.file), sys.stdout, detach=args.detach, as_json=args.output_json)


def _users(args: argparse.Namespace) -> int:
    from finetune_studio.cli import users
    from finetune_studio.config import get_settings

    password = sys.stdin.readline().rstrip("\n") if getattr(args, "password_stdin", False) else None
    return users.run(args.action, get_settings(data_dir=args.data_dir).data_dir, getattr(args, "name", None), password)


def _add_users_parser(commands: Any) -> None:
    users = commands.add_parser("users", help="accounts: make the first admin, add, remove or list users (on the data dir)")
    actions = users.add_subparsers(dest="action", required=True)
    for action, text in (("create-admin", "make an admin; prints a key with every scope, once"),
                         ("add", "add a user; prints a key (read, train, chat, files), once"),
                         ("remove", "remove a user and revoke their keys"), ("list", "list the users")):
        parser = actions.add_parser(action, help=text)
        if action != "list":
            parser.add_argument("name")
        if action in ("create-admin", "add"):
            parser.add_argument("--password-stdin", action="store_true", help="read a password for the page's sign-in from stdin")
        parser.add_argument("--data-dir", default=None, help="the server's data dir (default ~/.finetune-studio)")
        parser.set_defaults(func=_users)


def _add_webhooks_parser(commands: Any) -> None:
    sweep = commands.add_parser(
        "sweep", help="run a hyperparameter sweep (POST /sweeps) from a JSON file; a live table of its trials",
    )
    sweep.add_argument("file", metavar="FILE.json", help="the sweep: {request, space, objective, trials, ...} (docs/API.md, Sweeps)")
    sweep.add_argument("--detach", action="store_true", help="create the sweep and print its id, without following it")
    _client_options(sweep, "print the sweep's id, then its final state, as JSON")
    sweep.set_defaults(func=_client_command(_sweep))
    hooks = commands.add_parser("webhooks", help="add, list or remove the server's webhooks")
    actions = hooks.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="register a webhook; its secret is printed once")
    add.add_argument("url", help="where each delivery is POSTed")
    add.add_argument(
        "--events", nargs="+", required=True,
        help="event types, separated by spaces or commas (fine_tuning.job.succeeded, studio.job.phase, ...; docs/API.md, Webhooks)",
    )
    add.add_argument("--secret", help="the signing secret (whsec_ + base64); the server makes one when left out")
    listing = actions.add_parser("list", help="list the webhooks")
    remove = actions.add_parser("remove", help="remove a webhook and its deliveries")
    remove.add_argument("webhook_id")
    for parser in (add, listing, remove):
        _client_options(parser, "print the server's JSON answer")
        parser.set_defaults(func=_client_command(_webhooks))


def _setting(text: str) -> tuple[str, Any]:
    """--set key=value: the value parsed as JSON, else kept as a string."""
    import json

    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected key=value (a request field, '=', then its value), not {text!r}")
    try:
        return key, json.loads(raw)
    except ValueError:
        return key, raw


_STARTED_DATA_DIR = "data directory of a server this command starts (default ~/.finetune-studio, or FINETUNE_STUDIO_DATA_DIR)"


def _client_options(parser: argparse.ArgumentParser, output_json_help: Optional[str]) -> None:
    parser.add_argument(
        "--server", "--url", dest="server", default=os.environ.get("FINETUNE_STUDIO_URL", DEFAULT_SERVER),
        help=f"the server's URL (default {DEFAULT_SERVER}, or FINETUNE_STUDIO_URL)",
    )
    parser.add_argument(
        "--token", default=os.environ.get("FINETUNE_STUDIO_TOKEN"),
        help="the server's API token or your API key (default FINETUNE_STUDIO_TOKEN, else the key"
             " `finetune-studio login` kept for the server)",
    )
    if output_json_help is not None:
        parser.add_argument("--output-json", action="store_true", help=output_json_help)

def _starting_client_options(parser: argparse.ArgumentParser, output_json_help: str,
                             data_dir_help: str = _STARTED_DATA_DIR) -> None:
    """The options of a command that may start a server where none answers (cli/train.py's
    `Reached`): its data dir and --no-start-server, then the client's own."""
    parser.add_argument("--data-dir", default=None, help=data_dir_help)
    parser.add_argument("--no-start-server", action="store_true", help="never start a server; fail when none answers")
    _client_options(parser, output_json_help)



TRAIN_DESCRIPTION = """Queue a training job and follow it with a progress bar until it ends.

If nothing answers at --server and it is a loopback address (127.0.0.1 or
localhost with a port; the default is), this command starts `finetune-studio
serve` there on --data-dir for as long as the job runs, and stops it after.

Ctrl-C asks "Stop job X? [y/N]": y stops the job (it saves what it trained) and
keeps following until it has stopped; n keeps following; a second Ctrl-C leaves
the job running. When stdin is not a terminal, Ctrl-C leaves the job running
without asking. A server this command started keeps running when the job does,
and the command says how to stop it.
"""

TRAIN_EPILOG = """--detach: queue the job and return at once, printing only its id on stdout (one
JSON object with --output-json), so that `JOB=$(finetune-studio train ... --detach)`
works; follow it later with `finetune-studio watch JOB`. A server this command
started keeps running: its URL, pid and log are printed, and `kill PID` stops it.

Output: a live progress bar on a terminal; plain lines otherwise; with
--output-json, one JSON object per event ({"event": "status"|"progress", "id",
"data"}) and a last {"event": "summary", ...} line, with notes on stderr.

Exit status: 0 the job completed; 1 it ended in error or stopped (the error and
its error_code are printed), or the stream was lost; 2 bad usage, the server
refused the job (its reason is printed), or no server could be reached or
started; 130 Ctrl-C left the job running (and --detach: 0 once queued).
"""


def _add_train_parser(commands: Any) -> None:
    train = commands.add_parser(
        "train", help="queue a training job and follow it to its end", description=TRAIN_DESCRIPTION,
        epilog=TRAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("--model", required=True, help="a local model folder, a .gguf file, or a hub id")
    train.add_argument("--data", required=True, action="append", metavar="FILE",
                       help="a dataset file (.jsonl, .json, .csv, .parquet, .txt); repeat for more")
    train.add_argument("--format", default="auto", choices=FORMAT_TYPES, help="the data's shape (default: auto, detected)")
    train.add_argument("--training-type", default="LoRA/QLoRA", choices=TRAINING_TYPES, help="default: LoRA/QLoRA")
    train.add_argument("--max-steps", type=int, default=None, metavar="N", help="optimizer steps (overrides --epochs)")
    train.add_argument("--epochs", type=int, default=None, metavar="N", help="passes over the data (server default 1)")
    train.add_argument("--lr", type=float, default=None, metavar="X", help="peak learning rate (server default 2e-4)")
    train.add_argument("--batch-size", type=int, default=None, metavar="N")
    train.add_argument("--lora-r", type=int, default=None, metavar="N", help="LoRA rank")
    train.add_argument("--max-seq-length", type=int, default=None, metavar="N", help="longer rows are truncated")
    train.add_argument("--set", action="append", type=_setting, metavar="KEY=VALUE",
                       help="any request field, the value as JSON (lora_alpha=32, packing=true,"
                            ' target_modules=\'["q_proj","v_proj"]\'); repeatable; applied last')
    train.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                       help="where the server trains: cpu sends load_in_4bit=false and optim=adamw_torch (what works"
                            " without CUDA); cuda sends the request's own defaults (4-bit loading, an 8-bit optimizer);"
                            " auto sets the fields no flag sets as the server's GET /system recommends, as the page"
                            " does (a server without it: cpu's for a server on this machine with no NVIDIA driver)")
    train.add_argument("--detach", action="store_true", help="return once the job is queued (see below)")
    _starting_client_options(train, "print JSON lines (one per event, then a summary) instead of the progress bar")
    train.set_defaults(func=_train)

def _chat(args: argparse.Namespace) -> int:
    from finetune_studio.cli.chat import Terminal, run_chat
    from finetune_studio.cli.client import StudioClient

    interactive = sys.stdin.isatty()
    if interactive:
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401 - line editing and history for input()
    terminal = Terminal(sys.stdin, sys.stdout, sys.stderr, interactive=interactive)
    with StudioClient(args.server, token=args.token) as client:
        return run_chat(client, args.job_id, base=args.base, system=args.system, temperature=args.temperature,
                        max_tokens=args.max_tokens, terminal=terminal)


def _number_in(low: float, high: float, kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is outside {low:g} to {high:g}")
        return value

    return parse


CHAT_DESCRIPTION = """Talk to what a job trained: each line you type is a message, and the answer
streams in as the model writes it, with the whole conversation so far as its
context. /reset clears the conversation, /exit (or Ctrl-D) ends it, and Ctrl-C
stops an answer. --base talks to the model the job was trained from instead.

From a pipe it answers each line, printing only the answers, each followed by a
newline:
  echo "What is the capital of Portugal?" | finetune-studio chat JOB_ID --temperature 0
"""

CHAT_EPILOG = """JOB_ID may also be any model id that GET /v1/models lists (a base model's name).

Exit status: 0 at the end of input or /exit; 1 the server failed (the chat
process died, say) or the answer broke off; 2 the server refused the request (an
unknown model or a job with nothing to serve yet, a bad parameter, a wrong token:
its message is printed) or no server answered; 130 Ctrl-C at the prompt. At a
terminal, a failed answer is reported and the conversation goes on, unless no
later question can fare better (an unknown model, a wrong token, no server).
"""


def _add_chat_parser(commands: Any) -> None:
    chat = commands.add_parser(
        "chat", help="talk to a trained job's model (or its base) in the terminal", description=CHAT_DESCRIPTION,
        epilog=CHAT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    chat.add_argument("job_id", metavar="JOB_ID", help="a job that completed (or stopped after saving)")
    chat.add_argument("--base", action="store_true", help="talk to the job's base model (the model it was trained from)")
    chat.add_argument("--system", metavar="TEXT", help="a system message that starts the conversation")
    chat.add_argument("--temperature", type=_number_in(0, 2, float), default=None, metavar="T",
                      help="0 (greedy: the same answer every time) to 2 (server default 1)")
    chat.add_argument("--max-tokens", type=_number_in(1, 2**31 - 1, int), default=None, metavar="N",
                      help="the longest answer, in tokens (default: the rest of the model's context)")
    _client_options(chat, None)
    chat.set_defaults(func=_chat)


@contextlib.contextmanager
def running_server(data_dir: Path, port: int) -> Iterator[str]:
    """A `finetune-studio serve` child on 127.0.0.1:port, stopped on exit."""
    from finetune_studio.cli.local_server import LocalServer

    with LocalServer(data_dir, port=port, log_level="info") as server:
        yield server.url


def _inspect(args: argparse.Namespace) -> int:
    from finetune_studio.cli.inspect import run_inspect

    return run_inspect(args, sys.stdout, sys.stderr)


INSPECT_DESCRIPTION = """Read and check dataset files as a training job would, without starting one.

Prints the shape, the rows, the first rows as the model will see them (with --model:
through its chat template; the part the loss covers is marked), tokens per row
(with --model: min, mean, percentiles, max) and how many rows --max-seq-length would
cut, and every problem with its file and line, in the words a job would use. When
the columns are no known shape, it suggests a custom_format_mapping. It runs here,
in this process: no server is needed, and only the model's tokenizer is loaded.
"""

INSPECT_EPILOG = """Exit status: 0 a job would train on the data as it is; 1 the data has problems
(or bad rows a job would skip); 2 bad usage.
"""


def _add_inspect_parser(commands: Any) -> None:
    inspect = commands.add_parser(
        "inspect", help="check dataset files and preview them as a job would read them (no server needed)",
        description=INSPECT_DESCRIPTION, epilog=INSPECT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inspect.add_argument("files", nargs="+", metavar="FILE", help="dataset files (.jsonl, .json, .csv, .parquet, .txt)")
    inspect.add_argument("--model", default=None, help="a model folder, .gguf file or hub id: its tokenizer and chat template")
    inspect.add_argument("--format", default="auto", choices=FORMAT_TYPES, help="the data's shape (default: auto, detected)")
    inspect.add_argument("--max-seq-length", type=_number_in(8, 1_048_576, int), default=2048, metavar="N",
                         help="rows longer than this many tokens are counted as cut (default 2048)")
    inspect.add_argument("--mapping", action="append", metavar="COLUMN=ROLE",
                         help="custom_format_mapping, one column each (question=user, answer=assistant); repeatable")
    inspect.add_argument("--train-on-completions", action="store_true", help="the loss covers the answers only")
    inspect.add_argument("--bad-rows", default="error", choices=("error", "skip"), help="what a bad row does (default: error)")
    inspect.add_argument("--rows", type=_number_in(0, 20, int), default=3, metavar="N", help="rows to show (default 3)")
    inspect.add_argument("--trust-remote-code", action="store_true", help="run code shipped with the model's tokenizer")
    inspect.add_argument("--output-json", action="store_true", help="print the report as JSON (the API's answer)")
    inspect.set_defaults(func=_inspect)


EXPORT_DESCRIPTION = """Export what a job trained, to run it elsewhere.

--gguf and --lora-gguf ask the server for an export (llama.cpp's own converter and
quantizer, in the server's export process; the server needs the [gguf] extra),
follow it with a progress bar per stage, and download its files into --out: one
GGUF file per quantization and an Ollama Modelfile beside them, or the adapter as
GGUF for llama.cpp's --lora. A server is found or started as `train` does.

--merged DIR merges a LoRA adapter into its base model here, in this process, and
writes a 16-bit safetensors folder that AutoModelForCausalLM.from_pretrained loads.
"""

EXPORT_EPILOG = """Examples:
  finetune-studio export JOB_ID --gguf q4_k_m,q8_0 --out ./gguf
  finetune-studio export JOB_ID --lora-gguf --out ./adapter
  finetune-studio export JOB_ID --lora-gguf q8_0     (or --lora-gguf=q8_0 anywhere)
  finetune-studio export JOB_ID --merged ./merged

A download that broke off resumes when the command runs again (HTTP Range).
Ctrl-C stops the export (its unfinished files are removed); a second Ctrl-C leaves it running.

Exit status: 0 every export completed and its files were downloaded; 1 an export
ended in error or stopped (its error and error_code are printed), or a download
failed; 2 bad usage, the server refused the export (its reason is printed), or no
server answered; 130 the export was left running.
"""


def _quantization_list(text: str) -> list[str]:
    """--gguf q4_k_m,q8_0: the names, checked here so a typo costs no round trip."""
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in GGUF_QUANTIZATIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or 'nothing'}: not a quantization llama.cpp makes here; choose among"
            f" {', '.join(GGUF_QUANTIZATIONS)} (several separated by commas)"
        )
    return list(dict.fromkeys(names))


def _lora_gguf_type(text: str) -> str:
    """--lora-gguf's optional TYPE. A value after it that is no type is most likely the job id
    (`export --lora-gguf JOB`): say how to write that, rather than argparse's bare "invalid choice"."""
    name = text.strip().lower()
    if name not in LORA_GGUF_TYPES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a LoRA GGUF type ({', '.join(LORA_GGUF_TYPES)}). A value right after --lora-gguf is"
            f" read as its type: put the job id first (finetune-studio export {text} --lora-gguf), or write the"
            " type as --lora-gguf=TYPE"
        )
    return name


def _add_export_parser(commands: Any) -> None:
    export = commands.add_parser(
        "export", help="export a job's result: GGUF (k-quants), LoRA-GGUF, or a merged 16-bit model",
        description=EXPORT_DESCRIPTION, epilog=EXPORT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export.add_argument("job_id", help="a job id (or, with --merged, a job folder)")
    export.add_argument("--gguf", type=_quantization_list, default=None, metavar="QUANTS",
                        help=f"GGUF files, one per quantization, comma-separated: {', '.join(GGUF_QUANTIZATIONS)}")
    export.add_argument("--lora-gguf", nargs="?", const="f16", default=None, type=_lora_gguf_type, metavar="TYPE",
                        help=f"the LoRA adapter as GGUF, for llama.cpp's --lora ({', '.join(LORA_GGUF_TYPES)}; default f16);"
                             " a value right after it is its type, so name the job first")
    export.add_argument("--out", default=".", metavar="DIR", help="where the exported files are downloaded (default: here)")
    export.add_argument("--merged", default=None, metavar="DIR", help="merge here, in this process, into this new folder")
    export.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"], help="--merged's dtype")
    _starting_client_options(export, "print JSON lines (one per event, then a summary) instead of the progress bars", "the data directory: where --merged finds the job, and of a server this command starts")
    export.set_defaults(func=_export)


def _eval(args: argparse.Namespace) -> int:
    from finetune_studio.cli.eval_job import run_eval_job

    return run_eval_job(args, sys.stdout, sys.stderr)  # as _train: the streams of now


EVAL_DESCRIPTION = """Evaluate what a job trained against its base (or other models), on the server.

JOB is the first model: a job id (its adapter or model), base:<job id> (that job's base
model), or any id GET /v1/models lists. --against adds a model to compare with it (default:
base, the job's base model; repeatable; none: JOB alone). Every difference is against JOB.

Suites (at least one):
  --data FILE         held-out data in any shape and file type training reads: loss,
                      perplexity and token accuracy over the answers, and greedy answers
                      scored by exact match, ROUGE-L, BLEU and chrF
  --task NAME         an lm-evaluation-harness task (repeatable), from lm-eval's own or from
                      --tasks-dir DIR (task YAML with local data); --num-fewshot, --limit
  --judge MODEL --judge-prompts FILE
                      every model answers every prompt; MODEL (one this server serves, or
                      one at --judge-url with its key in the server's --judge-key-env
                      variable) compares each answer with JOB's, twice, positions swapped

The server runs the evaluation (its own slot), this command shows a live progress bar,
then the results table: each value with its 95% interval, each difference from JOB with
its own. A server is found or started as `train` does.
"""

EVAL_EPILOG = """Examples:
  finetune-studio eval JOB --data heldout.jsonl
  finetune-studio eval JOB --against base --against OTHER_JOB --data heldout.jsonl
  finetune-studio eval JOB --task arc_easy --limit 100
  finetune-studio eval JOB --task my_task --tasks-dir ./tasks
  finetune-studio eval JOB --judge JUDGE_MODEL --judge-prompts prompts.jsonl

Ctrl-C stops the evaluation; a second Ctrl-C leaves it running.
Output: with --output-json, one JSON object per event, then {"event": "results", "data"}
(GET /eval/results/ID) and a last {"event": "summary", ...} line.

Exit status: 0 the evaluation completed; 1 it ended in error or stopped (its error and
error_code are printed), or the stream was lost; 2 bad usage, the server refused it (an
unknown model, a missing file: its reason is printed), or no server answered; 130 it was
left running.
"""


def _add_eval_parser(commands: Any) -> None:
    evaluate = commands.add_parser(
        "eval", help="evaluate a job against its base (held-out data, lm-eval tasks, an LLM judge)",
        description=EVAL_DESCRIPTION, epilog=EVAL_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    evaluate.add_argument("job_id", metavar="JOB", help="the first model: a job id, base:<job id>, or a /v1/models id")
    evaluate.add_argument("--against", action="append", metavar="MODEL",
                          help="a model to compare with JOB: base (JOB's base model), a job id, or a /v1/models id;"
                               " repeatable (default: base; none: JOB alone)")
    evaluate.add_argument("--data", action="append", metavar="FILE", help="held-out data (.jsonl, .json, .csv, .parquet, .txt)")
    evaluate.add_argument("--format", default="auto", choices=FORMAT_TYPES, help="the held-out data's shape (default: auto)")
    evaluate.add_argument("--task", action="append", metavar="NAME", help="an lm-evaluation-harness task; repeatable")
    evaluate.add_argument("--tasks-dir", default=None, metavar="DIR", help="a folder of lm-eval task YAML files (local data)")
    evaluate.add_argument("--num-fewshot", type=_number_in(0, 64, int), default=None, metavar="N", help="lm-eval's few-shot examples")
    evaluate.add_argument("--limit", type=_number_in(1e-9, 2**31, float), default=None, metavar="N",
                          help="rows (held-out, judge) or documents per task (lm-eval; below 1 a fraction) to evaluate")
    evaluate.add_argument("--judge", default=None, metavar="MODEL", help="the judge model")
    evaluate.add_argument("--judge-prompts", default=None, metavar="FILE", help="the prompts every model answers")
    evaluate.add_argument("--judge-url", default=None, metavar="URL", help="an external OpenAI-compatible judge (https://host/v1)")
    evaluate.add_argument("--judge-key-env", default=None, metavar="NAME",
                          help="the server's environment variable holding the external judge's API key")
    evaluate.add_argument("--max-new-tokens", type=_number_in(1, 4096, int), default=None, metavar="N",
                          help="the longest answer a model gives, in tokens")
    evaluate.add_argument("--label", default=None, help="a label shown with the evaluation")
    _starting_client_options(evaluate, "print JSON lines (one per event, the results, then a summary) instead of the bar and table")
    evaluate.set_defaults(func=_eval)


def _demo(args: argparse.Namespace) -> int:
    from finetune_studio.cli.demo import run_demo
    from finetune_studio.cli.local_server import free_port

    data_dir = Path(args.data_dir).expanduser().resolve() if args.data_dir else Path.home() / ".finetune-studio" / "demo"
    port = args.port or free_port()
    return run_demo(data_dir, lambda: running_server(data_dir, port), tiny=args.tiny, steps=args.steps)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="finetune-studio", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the API server and web UI")
    serve.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8000)")
    serve.add_argument("--data-dir", default=None, help="where jobs live (default ~/.finetune-studio, or FINETUNE_STUDIO_DATA_DIR)")
    serve.add_argument("--max-concurrent-jobs", type=int, default=None, help="jobs that train at once (default 1)")
    serve.add_argument("--max-concurrent-exports", type=int, default=None,
                       help="exports that run at once, beside training (default 1)")
    serve.add_argument("--max-concurrent-evals", type=int, default=None,
                       help="evaluations that run at once, beside training and exports (default 1)")
    serve.add_argument(
        "--ray-address", default=None, metavar="ADDR",
        help="train on this Ray cluster (auto: the one this machine belongs to; HOST:PORT or ray://HOST:PORT);"
             " needs finetune-studio[ray]; default FINETUNE_STUDIO_RAY_ADDRESS, or local training (docs/SCALE-OUT.md)",
    )
    serve.add_argument("--accounts", action="store_true",
                       help="users, API keys with scopes and owners (default FINETUNE_STUDIO_ACCOUNTS; docs/API.md, Accounts)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(func=_serve)

    tiny = commands.add_parser("make-tiny-model", help="write a tiny random Llama (for tests and trials)")
    tiny.add_argument("directory")
    tiny.set_defaults(func=_make_tiny_model)

    _add_export_parser(commands)

    _add_train_parser(commands)

    watch = commands.add_parser(
        "watch", help="follow a job's progress in the terminal",
        description="Follow a job until it ends; Ctrl-C asks whether to stop it. Exit status as for train.",
    )
    watch.add_argument("job_id")
    _client_options(watch, "print JSON lines (one per event, then a summary) instead of the progress bar")
    watch.set_defaults(func=_watch)

    jobs = commands.add_parser("jobs", help="list the server's jobs, newest first")
    _client_options(jobs, "print the server's JSON list of statuses")
    jobs.set_defaults(func=_client_command(_jobs))

    status = commands.add_parser("status", help="print a job's status")
    status.add_argument("job_id")
    _client_options(status, "print the server's JSON status")
    status.set_defaults(func=_client_command(_status))

    stop = commands.add_parser("stop", help="stop a job (it saves what it trained)")
    stop.add_argument("job_id")
    _client_options(stop, "print the server's JSON answer")
    stop.set_defaults(func=_client_command(_stop))

    login = commands.add_parser(
        "login", help="check an API key and keep it in your config file (mode 0600) for every client command",
        description="Check an API key against the server (GET /auth/me) and keep it for that server in"
                    " ~/.config/finetune-studio/config.json (or $FINETUNE_STUDIO_CONFIG), mode 0600. The key comes"
                    " from --token, else stdin (a prompt that does not echo, on a terminal).",
    )
    _client_options(login, None)
    login.set_defaults(func=_login)
    logout = commands.add_parser("logout", help="forget the key kept for the server")
    _client_options(logout, None)
    logout.set_defaults(func=_logout)

    _add_chat_parser(commands)
    _add_webhooks_parser(commands)
    _add_users_parser(commands)
    _add_inspect_parser(commands)
    _add_eval_parser(commands)

    demo = commands.add_parser("demo", help="start a server, train a job end to end, and show its progress")
    demo.add_argument("--data-dir", default=None, help="the demo server's data (default ~/.finetune-studio/demo)")
    demo.add_argument("--port", type=int, default=None)
    demo.add_argument("--steps", type=int, default=None, help="training steps (default 40; 60 with --tiny)")
    demo.add_argument("--tiny", action="store_true", help="train the tiny random model instead of SmolLM2-135M")
    demo.set_defaults(func=_demo)
    return parser


def _login(args: argparse.Namespace) -> int:
    from finetune_studio.cli.login import login

    return login(args.server, args.token)


def _logout(args: argparse.Namespace) -> int:
    from finetune_studio.cli.login import logout

    return logout(args.server)


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "token", "") is None and getattr(args, "server", None) and args.func is not _login:
        from finetune_studio.cli.login import stored_key

        args.token = stored_key(args.server)  # `finetune-studio login`'s key for this server, if any
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
