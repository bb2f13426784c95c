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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional

import httpx

TERMINAL = ("completed", "error", "stopped")


@dataclass(frozen=True)
class StreamEvent:
    id: int
    kind: str  # "status" | "progress"
    data: dict[str, Any]

    @property
    def is_terminal(self) -> bool:
        return self.kind == "status" and self.data.get("phase") in TERMINAL


class StudioError(RuntimeError):
    """The server refused a request; the message is the server's."""


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
                body = response.json()
                text = body.get("error") or body.get("detail") or response.text
            except ValueError:
                text = response.text
            raise StudioError(f"{response.status_code}: {text}")
        return response.json() if response.status_code != 204 else None

    def health(self) -> dict[str, Any]:
        return self._json(self.http.get("/health"))  # type: ignore[no-any-return]

    def start(self, request: dict[str, Any]) -> str:
        return str(self._json(self.http.post("/train/start", json=request))["job_id"])

    def status(self, job_id: str) -> dict[str, Any]:
        return self._json(self.http.get(f"/train/status/{job_id}"))  # type: ignore[no-any-return]

    def progress(self, job_id: str) -> Optional[dict[str, Any]]:
        return self._json(self.http.get(f"/train/progress/{job_id}"))  # type: ignore[no-any-return]

    def stop(self, job_id: str) -> dict[str, Any]:
        return self._json(self.http.post(f"/train/stop/{job_id}"))  # type: ignore[no-any-return]

    def jobs(self) -> list[dict[str, Any]]:
        return self._json(self.http.get("/train/jobs"))["data"]  # type: ignore[no-any-return]

    def stream(self, job_id: str, last_event_id: int = 0, retries: int = 30) -> Iterator[StreamEvent]:
        """Every event after last_event_id, reconnecting after a dropped connection."""
        cursor = last_event_id
        failures = 0
        while True:
            try:
                headers = {"Last-Event-ID": str(cursor)} if cursor else {}
                with self.http.stream("GET", f"/train/stream/{job_id}", headers=headers, timeout=httpx.Timeout(30.0, read=None)) as response:
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
