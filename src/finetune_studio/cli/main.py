"""The `finetune-studio` command: serve, demo, watch, make-tiny-model."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Optional

# Each command imports what it needs when it runs: `serve` must start fast, and the
# client's httpx and the progress view's rich would cost it a quarter of a second.
if TYPE_CHECKING:
    from finetune_studio.cli.client import StudioClient
    from finetune_studio.cli.progress import ProgressView


def _serve(args: argparse.Namespace) -> int:
    # Start-up builds many thousands of objects (FastAPI's and pydantic's models),
    # none of them garbage: with the cyclic collector off until the app is built,
    # the server answers about 10% sooner (docs/BENCHMARKS.md), and freezing them
    # keeps them out of every later collection.
    gc.disable()
    try:
        import uvicorn

        from finetune_studio.api.app import create_app
        from finetune_studio.config import get_settings

        settings = get_settings(
            host=args.host, port=args.port, data_dir=args.data_dir, max_concurrent_jobs=args.max_concurrent_jobs
        )
        if not settings.is_loopback() and settings.token is None:
            print(
                f"error: refusing to bind {settings.host}: anyone on the network could start jobs and read your files.\n"
                "Set FINETUNE_STUDIO_TOKEN to a long random secret (clients send it as 'Authorization: Bearer ...'),"
                " or bind 127.0.0.1.",
                file=sys.stderr,
            )
            return 2
        app = create_app(settings)
        gc.freeze()
    finally:
        gc.enable()
    print(f"finetune-studio: data in {settings.data_dir}; UI and API on http://{settings.host}:{settings.port}/", flush=True)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        # Streams of queued jobs never end by themselves; give them a moment, then
        # let the supervisor stop the running jobs cleanly.
        timeout_graceful_shutdown=3,
    )
    return 0


def _make_tiny_model(args: argparse.Namespace) -> int:
    from finetune_studio.training.tiny_model import build_tiny_model

    path = build_tiny_model(Path(args.directory).expanduser().resolve())
    print(f"wrote a tiny random Llama to {path}")
    return 0


def _export(args: argparse.Namespace) -> int:
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


def _watch(client: StudioClient, job_id: str, view: ProgressView) -> dict:
    final: dict = {}
    for event in client.stream(job_id):
        view.show(event)
        if event.is_terminal:
            final = event.data
    return final


def _watch_command(args: argparse.Namespace) -> int:
    from finetune_studio.cli.client import StudioClient, StudioError
    from finetune_studio.cli.progress import ProgressView

    view = ProgressView(sys.stdout, interactive=sys.stdout.isatty(), width=shutil.get_terminal_size().columns - 1)
    with StudioClient(args.url, token=args.token) as client:
        try:
            final = _watch(client, args.job_id, view)
        except StudioError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0 if final.get("phase") == "completed" else 1


@contextlib.contextmanager
def running_server(data_dir: Path, port: int) -> Iterator[str]:
    """A `finetune-studio serve` child on 127.0.0.1:port, stopped on exit."""
    from finetune_studio.cli.local_server import LocalServer

    with LocalServer(data_dir, port=port, log_level="info") as server:
        yield server.url


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
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(func=_serve)

    tiny = commands.add_parser("make-tiny-model", help="write a tiny random Llama (for tests and trials)")
    tiny.add_argument("directory")
    tiny.set_defaults(func=_make_tiny_model)

    export = commands.add_parser("export", help="write a job's result as a merged 16-bit model")
    export.add_argument("job_id", help="a job id (or a job folder)")
    export.add_argument("--merged", required=True, metavar="DIR", help="the new folder to write")
    export.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    export.add_argument("--data-dir", default=None, help="the server's data directory (default as for serve)")
    export.set_defaults(func=_export)

    watch = commands.add_parser("watch", help="follow a job's progress in the terminal")
    watch.add_argument("job_id")
    watch.add_argument("--url", default=os.environ.get("FINETUNE_STUDIO_URL", "http://127.0.0.1:8000"))
    watch.add_argument("--token", default=os.environ.get("FINETUNE_STUDIO_TOKEN"))
    watch.set_defaults(func=_watch_command)

    demo = commands.add_parser("demo", help="start a server, train a job end to end, and show its progress")
    demo.add_argument("--data-dir", default=None, help="the demo server's data (default ~/.finetune-studio/demo)")
    demo.add_argument("--port", type=int, default=None)
    demo.add_argument("--steps", type=int, default=None, help="training steps (default 40; 60 with --tiny)")
    demo.add_argument("--tiny", action="store_true", help="train the tiny random model instead of SmolLM2-135M")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
