"""`finetune-studio export JOB_ID --gguf q4_k_m,q8_0 [--lora-gguf] [--out DIR]`: exports run by the server.

    export_requests(args)   the flags as `POST /export/start` bodies (pure; unit-tested)
    ExportLiveView          a terminal: stage lines above a rich bar per stage
    ExportLinesView         a pipe or a log: the stage lines and a progress line now and then
    run_export_job(args)    the command: find or start the server, queue, follow, download

Each export is queued on the server (a GGUF export and a LoRA-GGUF one are two
exports, one after the other), followed through its stream until it ends, and its
files (the server's `details.files`) are then downloaded into --out, each by way
of a `.partial` file that a second run resumes with HTTP Range. The merge into a
local folder (`--merged DIR`) is cli/export.py, in this process, as before.

A server is found or started exactly as `finetune-studio train` does (cli/train.py).
Ctrl-C stops the export (an export is cheap to start again; its partial files are
removed by the server); a second Ctrl-C leaves it running.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import IO, Any, Optional, Union

from rich.progress import ProgressColumn

from finetune_studio.cli.client import StudioClient, StudioError
from finetune_studio.cli.follow import (
    EXIT_COMPLETED,
    EXIT_FAILED,
    EXIT_LEFT_RUNNING,
    Notes,
    follow_until_done,
    how_it_ended,
)
from finetune_studio.cli.progress import AnyView, BarView, JsonLinesView, LinesView, format_seconds, make_view
from finetune_studio.cli.train import Reached


def export_requests(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The `POST /export/start` bodies the flags ask for, in the order they run."""
    requests: list[dict[str, Any]] = []
    if args.gguf:
        requests.append({"job_id": args.job_id, "format": "gguf", "quantization": args.gguf})
    if args.lora_gguf:
        requests.append({"job_id": args.job_id, "format": "lora_gguf", "quantization": [args.lora_gguf]})
    return requests


class ExportLinesView(LinesView):
    """Plain lines: every status, and a progress line every `every_seconds` and at each file's end."""

    def line(self, progress: dict[str, Any]) -> str:
        """'converting model-f16.gguf 120/272 tensors  44.1%  eta 00:12' (the percent is the whole export's)."""
        unit = "layers" if progress.get("stage") == "merging" else "tensors"
        where = f" {progress['file']}" if progress.get("file") else ""
        return f"{progress['stage']}{where} {progress['done']}/{progress['total']} {unit}{self.percent_and_eta(progress)}"

    def is_last(self, progress: dict[str, Any]) -> bool:
        return bool(progress["done"] >= progress["total"])


class ExportLiveView(BarView):
    """A terminal: stage lines scroll above one bar per stage and file (tensors done of total)."""

    def columns(self) -> tuple[Union[str, ProgressColumn], ...]:
        return self.bar("{task.fields[percent]} of the export, eta {task.fields[eta]}", percent=False)

    def update(self, progress: dict[str, Any]) -> None:
        key = (str(progress["stage"]), str(progress.get("file") or ""))
        self.move(key, " ".join(part for part in key if part), progress["done"], progress["total"],
                  percent=f"{float(progress['progress_percent']):.1f}%", eta=format_seconds(progress.get("eta_seconds")))


def follow_export(client: StudioClient, job_id: str, view: AnyView, notify: Callable[[str], None]) -> Optional[dict[str, Any]]:
    """Show the export's events until it ends (see `follow_until_done`)."""
    return follow_until_done(client, job_id, view, notify, what="export", prefix="/export", stop=client.stop_export)


def safe_target(out_dir: Path, name: str) -> Path:
    """Where a file the server names goes under out_dir; a name that would leave it is refused."""
    parts = PurePosixPath(name).parts
    if not parts or name.startswith("/") or ".." in parts or "\\" in name:
        raise StudioError(f"the server named a file {name!r} that would land outside {out_dir}; not downloading it")
    return out_dir.joinpath(*parts)


def download_files(client: StudioClient, export_id: str, files: list[dict[str, Any]], out_dir: Path, notes: Notes) -> list[Path]:
    written = []
    for entry in files:
        target = safe_target(out_dir, str(entry["name"]))
        notes.say(f"downloading {entry['name']} ({entry['bytes']:,} bytes) to {target} ...")
        client.download(export_id, str(entry["name"]), target)
        size = target.stat().st_size
        if size != entry["bytes"]:
            raise StudioError(f"{target} has {size:,} bytes, the server listed {entry['bytes']:,}; run the command again")
        written.append(target)
    return written


def ollama_line(job_id: str, files: list[Path]) -> Optional[str]:
    """The `ollama create` command for a downloaded Modelfile, or None when there is none."""
    modelfile = next((path for path in files if path.name == "Modelfile"), None)
    if modelfile is None:
        return None
    return f"ollama create finetune-{job_id} -f {modelfile}"


def run_export_job(args: argparse.Namespace, stdout: IO[str] = sys.stdout, stderr: IO[str] = sys.stderr) -> int:
    notes = Notes(stdout, stderr, stdout_for_scripts=args.output_json)
    requests = export_requests(args)
    out_dir = Path(args.out).expanduser().resolve()
    downloaded: list[Path] = []
    code = Reached().run(args, notes, lambda client: _run(client, requests, out_dir, args, notes, stdout, downloaded))
    if args.output_json:  # the last line for a script: what came of it
        JsonLinesView(stdout).write({"event": "summary", "exit_code": code, "files": [str(path) for path in downloaded]})
    return code


def _run(
    client: StudioClient, requests: list[dict[str, Any]], out_dir: Path, args: argparse.Namespace, notes: Notes,
    stdout: IO[str], downloaded: list[Path],
) -> int:
    """Each export in turn: queued, followed, its files downloaded (to `downloaded`). The exit status."""
    for request in requests:
        export_id = client.start_export(request)
        notes.say(f"queued export {export_id} of job {args.job_id} as {request['format']} ({', '.join(request['quantization'])})")
        view = make_view(stdout, output_json=args.output_json, live=ExportLiveView, lines=ExportLinesView)
        status = follow_export(client, export_id, view, notes.say)
        if status is None:
            return EXIT_LEFT_RUNNING
        if status["phase"] != "completed":
            notes.error(how_it_ended("export", export_id, status))
            return EXIT_FAILED
        files = list((status.get("details") or {}).get("files") or [])
        downloaded += download_files(client, export_id, files, out_dir, notes)
    for path in downloaded:
        notes.say(f"wrote {path}")
    line = ollama_line(args.job_id, downloaded)
    if line:
        notes.say(f"to run it in Ollama: {line}")
    return EXIT_COMPLETED
