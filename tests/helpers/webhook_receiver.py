"""A webhook receiver on 127.0.0.1 for the tests: a real HTTP server in a thread that checks
every delivery with Standard Webhooks' own library (`standardwebhooks.Webhook.verify`).

    with Receiver(secret) as receiver:        # answers 200 to each verified delivery
        receiver.mode = "fail"                # 503 | "redirect" (302 to `receiver.location`)
                                              #     | "hang" (holds each request until `release()`)
        receiver.received                     # every request: Received(headers, body, payload | error)

A request whose signature does not verify is answered 400 and recorded with its error.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

from standardwebhooks import Webhook, WebhookVerificationError

from finetune_studio.cli.local_server import free_port


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    payload: Optional[dict[str, Any]]  # the verified body; None when it did not verify
    error: Optional[str]


class Receiver:
    def __init__(self, secret: Optional[str] = None, port: Optional[int] = None) -> None:
        self.secret = secret
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/hooks"
        self.mode = "ok"
        self.location = "http://127.0.0.1:9/elsewhere"
        self.received: list[Received] = []
        self._release = threading.Event()
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    def release(self) -> None:
        self._release.set()

    def verified(self) -> list[dict[str, Any]]:
        return [r.payload for r in self.received if r.payload is not None]

    def __enter__(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {key.lower(): value for key, value in self.headers.items()}
                payload, error = None, None
                try:
                    assert receiver.secret is not None, "the receiver has no secret yet"
                    payload = Webhook(receiver.secret).verify(body, headers)
                except (WebhookVerificationError, AssertionError, json.JSONDecodeError) as exc:
                    error = str(exc)
                mode = receiver.mode
                if mode == "hang":
                    receiver.received.append(Received(headers, body, payload, error))
                    receiver._release.wait()
                    return  # no answer: the connection just closes
                receiver.received.append(Received(headers, body, payload, error))
                if error is not None:
                    self.send_response(400)
                elif mode == "fail":
                    self.send_response(503)
                elif mode == "redirect":
                    self.send_response(302)
                    self.send_header("location", receiver.location)
                else:
                    self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"receiver-{self.port}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
