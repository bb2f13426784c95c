"""A small synchronous client for the finetune-studio API, stream included.

    client = StudioClient("http://127.0.0.1:8000")
    job_id = client.start({"model_name": "...", "training_type": "LoRA/QLoRA", ...})
    for event in client.stream(job_id):
        print(event.id, event.kind, event.data)

`stream` reconnects by itself after a dropped connection, resuming from the last
event id it saw, so a caller sees every event exactly once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote

import httpx

from finetune_studio.atomic import write_atomically
from finetune_studio.jobs.phases import TERMINAL


@dataclass(frozen=True)
class StreamEvent:
    id: int
    kind: str  # "status" | "progress"
    data: dict[str, Any]

    @property
    def is_terminal(self) -> bool:
        return self.kind == "status" and self.data.get("phase") in TERMINAL


class StudioError(RuntimeError):
    """The server refused a request (the message is the server's), or could not be reached.

    `status_code` is the HTTP status of a refusal; None when no answer came.
    """

    def __init__(self, message: str, status_code: Optional[int] = None) -> None:
        super().__init__(message)
        self.status_code = status_code


def error_text(body: Any) -> Optional[str]:
    """The server's words in an error body: `error` (a refused start), or `detail` (a
    string, or FastAPI's list of schema errors, given as 'field: problem')."""
    if not isinstance(body, dict):
        return None
    if body.get("error"):
        return str(body["error"])
    detail = body.get("detail")
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict):
                where = ".".join(str(part) for part in item.get("loc", ()) if part != "body")
                parts.append(f"{where}: {item.get('msg')}" if where else str(item.get("msg")))
        return "; ".join(parts) or None
    return str(detail) if detail else None


def parse_sse(lines: Iterator[str]) -> Iterator[tuple[Optional[str], str, str]]:
    """(id, event, data) for each event in a text/event-stream; comments are skipped."""
    event_id: Optional[str] = None
    kind = "message"
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield event_id, kind, "\n".join(data)
            event_id, kind, data = None, "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            data.append(value)
        elif field == "event":
            kind = value
        elif field == "id":
            event_id = value


class StudioClient:
    def __init__(self, base_url: str, token: Optional[str] = None, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> StudioClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _json(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            try:
                text = error_text(response.json()) or response.text
            except ValueError:
                text = response.text
            raise StudioError(f"{response.status_code}: {text}", response.status_code)
        return response.json() if response.status_code != 204 else None

    def answers(self, timeout: float = 2.0) -> bool:
        """Whether anything answers HTTP at the base URL (a refused connection or a timeout: no)."""
        try:
            self.http.get("/health", timeout=timeout)
        except httpx.TransportError:
            return False
        return True

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise StudioError(
                f"cannot reach the server at {self.http.base_url} ({exc or type(exc).__name__});"
                " is `finetune-studio serve` running there?"
            ) from None
        return self._json(response)

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/health")  # type: ignore[no-any-return]

    def system(self) -> dict[str, Any]:
        """GET /system: the server's machine (CPUs, memory, CUDA) and the request defaults that suit it."""
        return self._request("GET", "/system")  # type: ignore[no-any-return]

    def start(self, request: dict[str, Any]) -> str:
        return str(self._request("POST", "/train/start", json=request)["job_id"])

    def start_sweep(self, body: dict[str, Any]) -> str:
        """POST /sweeps: the sweep's id."""
        return str(self._request("POST", "/sweeps", json=body)["sweep_id"])

    def sweep(self, sweep_id: str) -> dict[str, Any]:
        return self._request("GET", f"/sweeps/{sweep_id}")  # type: ignore[no-any-return]

    def status(self, job_id: str) -> dict[str, Any]:
        return self._request("GET", f"/train/status/{job_id}")  # type: ignore[no-any-return]

    def progress(self, job_id: str) -> Optional[dict[str, Any]]:
        return self._request("GET", f"/train/progress/{job_id}")  # type: ignore[no-any-return]

    def stop(self, job_id: str) -> dict[str, Any]:
        return self._request("POST", f"/train/stop/{job_id}")  # type: ignore[no-any-return]

    def jobs(self) -> list[dict[str, Any]]:
        return self._request("GET", "/train/jobs")["data"]  # type: ignore[no-any-return]

    def add_webhook(self, url: str, events: list[str], secret: Optional[str] = None) -> dict[str, Any]:
        """POST /webhooks: the registration, with its secret (answered this once)."""
        body: dict[str, Any] = {"url": url, "events": events, **({"secret": secret} if secret else {})}
        return self._request("POST", "/webhooks", json=body)  # type: ignore[no-any-return]

    def webhooks(self) -> list[dict[str, Any]]:
        return self._request("GET", "/webhooks")["data"]  # type: ignore[no-any-return]

    def remove_webhook(self, webhook_id: str) -> dict[str, Any]:
        return self._request("DELETE", f"/webhooks/{quote(webhook_id, safe='')}")  # type: ignore[no-any-return]

    def stream(
        self, job_id: str, last_event_id: int = 0, retries: int = 30, prefix: str = "/train"
    ) -> Iterator[StreamEvent]:
        """Every event after last_event_id, reconnecting after a dropped connection
        (an export's with prefix "/export", an evaluation's with "/eval")."""
        cursor = last_event_id
        failures = 0
        while True:
            try:
                headers = {"Last-Event-ID": str(cursor)} if cursor else {}
                timeout = httpx.Timeout(30.0, read=None)
                with self.http.stream("GET", f"{prefix}/stream/{job_id}", headers=headers, timeout=timeout) as response:
                    if response.status_code >= 400:
                        response.read()
                        self._json(response)
                    for event_id, kind, data in parse_sse(response.iter_lines()):
                        event = StreamEvent(int(event_id or 0), kind, json.loads(data))
                        cursor = max(cursor, event.id)
                        failures = 0
                        yield event
                        if event.is_terminal:
                            return
                # The server closed the stream without a terminal event: reconnect.
            except (httpx.TransportError, httpx.RemoteProtocolError):
                pass
            failures += 1
            if failures > retries:
                raise StudioError(f"lost the stream of job {job_id} and could not reconnect")
            time.sleep(min(0.2 * failures, 2.0))

    # -- evaluations (docs/API.md, Evaluation) ---------------------------------

    def start_eval(self, request: dict[str, Any]) -> str:
        return str(self._request("POST", "/eval/start", json=request)["eval_id"])

    def eval_status(self, eval_id: str) -> dict[str, Any]:
        return self._request("GET", f"/eval/status/{eval_id}")  # type: ignore[no-any-return]

    def stop_eval(self, eval_id: str) -> dict[str, Any]:
        return self._request("POST", f"/eval/stop/{eval_id}")  # type: ignore[no-any-return]

    def evals(self) -> list[dict[str, Any]]:
        return self._request("GET", "/eval/jobs")["data"]  # type: ignore[no-any-return]

    def eval_results(self, eval_id: str) -> dict[str, Any]:
        return self._request("GET", f"/eval/results/{eval_id}")  # type: ignore[no-any-return]

    def eval_samples(self, eval_id: str, suite: Optional[str] = None, offset: int = 0, limit: int = 100) -> dict[str, Any]:
        params: dict[str, Any] = {"offset": offset, "limit": limit}
        if suite:
            params["suite"] = suite
        return self._request("GET", f"/eval/results/{eval_id}/samples", params=params)  # type: ignore[no-any-return]

    # -- exports (docs/API.md, Export) ----------------------------------------

    def start_export(self, request: dict[str, Any]) -> str:
        return str(self._request("POST", "/export/start", json=request)["export_id"])

    def export_status(self, export_id: str) -> dict[str, Any]:
        return self._request("GET", f"/export/status/{export_id}")  # type: ignore[no-any-return]

    def stop_export(self, export_id: str) -> dict[str, Any]:
        return self._request("POST", f"/export/stop/{export_id}")  # type: ignore[no-any-return]

    def exports(self, job_id: Optional[str] = None) -> list[dict[str, Any]]:
        params = {"job_id": job_id} if job_id else {}
        return self._request("GET", "/export/jobs", params=params)["data"]  # type: ignore[no-any-return]

    def download(self, export_id: str, name: str, target: Path, on_bytes: Optional[Callable[[int], None]] = None) -> Path:
        """Fetch one file of a completed export into `target`, by way of its partial file
        (`atomic.partial_path`): one left by an earlier try is resumed (HTTP Range), not
        fetched again."""
        url = f"/export/download/{export_id}/{quote(name)}"
        with write_atomically(target, resume=True) as partial:
            if not self._fetch_rest(url, name, partial, on_bytes):
                partial.unlink(missing_ok=True)  # longer than the file: not a start of it; fetch it whole
                if not self._fetch_rest(url, name, partial, on_bytes):
                    raise StudioError(f"the server refused every range of {name}; run the command again")
        return target

    def _fetch_rest(self, url: str, name: str, partial: Path, on_bytes: Optional[Callable[[int], None]]) -> bool:
        """Append to partial what it lacks of the file at url; False when partial is no start of it."""
        have = partial.stat().st_size if partial.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:
            with self.http.stream("GET", url, headers=headers, timeout=httpx.Timeout(30.0, read=300.0)) as response:
                if response.status_code == 416:  # whole already, or longer than the file
                    return partial.exists() and response.headers.get("content-range") == f"bytes */{have}"
                if response.status_code >= 400:
                    response.read()
                    self._json(response)
                mode = "ab" if response.status_code == 206 else "wb"
                with open(partial, mode) as handle:
                    for chunk in response.iter_bytes():
                        handle.write(chunk)
                        if on_bytes is not None:
                            on_bytes(len(chunk))
        except httpx.TransportError as exc:
            raise StudioError(f"the download of {name} broke off ({exc}); run the command again to resume it") from None
        return True
