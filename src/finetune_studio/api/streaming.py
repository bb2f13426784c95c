"""Event streams that a client cannot use to hold the server's memory.

What a stream costs the server is what it has written and the client has not read.
uvicorn writes each chunk to the connection's transport at once, and waits for the
client only before the next one, while the transport's buffer is over its
high-water mark (64 KiB). So a client that stops reading holds the buffer and one
chunk (`jobs/feed.py` bounds a chunk to CHUNK_BYTES), and its stream then waits on
it forever: 100 such clients of a job with large events once held 1.8 GB.

`BoundedEventStream` watches the transport: when a chunk has waited
`stall_seconds` for the client to read, or the transport holds more than
`MAX_BUFFERED_BYTES`, it aborts the connection, which frees its buffer at once
(`close()` would wait for the client to read it first); so it does when a finished
stream's client does not read its end. A job's client reconnects with
`Last-Event-ID` and misses nothing; a streamed chat answer cannot be resumed, and
a dropped chat client's request is cancelled in the chat child, as when a client
leaves by itself. A client that reads keeps the buffer empty and pays for none of
this: a chunk goes straight to `send` while nothing waits. The socket's send
buffer in the kernel is capped too (`SEND_BUFFER_BYTES`), so a silent client costs
the machine little beyond the process.

The transport comes from the ASGI server, which does not hand it to the app:
uvicorn's `send` is a method of its request cycle, whose `transport` is the
connection. `StudioApp` (the FastAPI application) notes it in the scope's
extensions for stream paths, before any middleware wraps `send`. Under a server
without one (the test client), streams are not watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterable, Callable, Mapping
from typing import Optional

from fastapi import FastAPI
from fastapi.sse import EventSourceResponse
from starlette.types import Message, Receive, Scope, Send

# Every path that answers with a BoundedEventStream: a job's or an export's events, and a streamed chat or
# completions answer.
STREAM_PATHS = ("/train/stream/", "/export/stream/", "/v1/chat/completions", "/v1/completions")
TRANSPORT = "finetune_studio.transport"
# Only a server without flow control lets a buffer grow past its high-water mark
# plus one chunk; uvicorn never does.
MAX_BUFFERED_BYTES = 1024 * 1024
# A stream socket's send buffer in the kernel (Linux doubles it): 256 KiB a round
# trip is 2.5 MB/s at 100 ms, far above any job's event rate.
SEND_BUFFER_BYTES = 256 * 1024
# How often a finished stream looks whether its client has read the end.
_FLUSH_POLL_SECONDS = 0.05


def transport_of(send: Send) -> Optional[asyncio.WriteTransport]:
    """The connection's transport behind an ASGI server's `send`, if it shows it."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    needed = ("get_write_buffer_size", "abort", "is_closing")
    return transport if all(callable(getattr(transport, name, None)) for name in needed) else None


def limit_kernel_buffer(transport: asyncio.BaseTransport) -> None:
    """Cap the socket's send buffer in the kernel at SEND_BUFFER_BYTES. Linux grows
    it to 4 MiB for a client that does not read (tcp_wmem), memory that is the
    machine's if not the server process's; a stream's rate needs far less."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)


class StudioApp(FastAPI):
    """FastAPI, noting the transport of each stream request (see the module docstring)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(STREAM_PATHS):
            transport = transport_of(send)
            if transport is not None:
                limit_kernel_buffer(transport)
                scope = {**scope, "extensions": {**(scope.get("extensions") or {}), TRANSPORT: transport}}
        await super().__call__(scope, receive, send)


class BoundedEventStream(EventSourceResponse):
    """An SSE response of pre-encoded chunks that drops a client that stops reading.

    `on_close` runs once the response is over, however it ends (the route counts
    the job's open streams with it).
    """

    def __init__(
        self,
        content: AsyncIterable[bytes],
        *,
        stall_seconds: float,
        on_close: Callable[[], None],
        headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        super().__init__(content, headers=headers)
        self.stall_seconds = stall_seconds
        self.on_close = on_close
        self.dropped = False  # set when the client was dropped for not reading
        self._transport: Optional[asyncio.WriteTransport] = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._transport = (scope.get("extensions") or {}).get(TRANSPORT)
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in self.body_iterator:
            if not await self._deliver(send, {"type": "http.response.body", "body": chunk, "more_body": True}):
                return
        if await self._deliver(send, {"type": "http.response.body", "body": b"", "more_body": False}):
            await self._flushed()

    async def _deliver(self, send: Send, message: Message) -> bool:
        """Send `message`, unless the client has stopped reading: then drop it (False)."""
        transport = self._transport
        if transport is None or transport.get_write_buffer_size() == 0:
            await send(message)  # nothing waits to be read: this send does not block
            return True
        if transport.get_write_buffer_size() > MAX_BUFFERED_BYTES:
            self._drop(transport)
            return False
        # The send may wait for the client to read. A timer rather than wait_for: no
        # task per send, so a thousand readers that lag a little cost nothing more.
        timer = asyncio.get_running_loop().call_later(self.stall_seconds, self._drop, transport)
        try:
            await send(message)  # returns once the drop has closed the connection
        finally:
            timer.cancel()
        return not self.dropped

    async def _flushed(self) -> None:
        """Wait until the client has read the end of the stream, or drop it. A finished
        response is otherwise left to the server, whose `close()` would keep the
        connection and its buffer for as long as the client does not read."""
        transport = self._transport
        if transport is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.stall_seconds
        while transport.get_write_buffer_size():
            if loop.time() >= deadline:
                self._drop(transport)
                return
            await asyncio.sleep(_FLUSH_POLL_SECONDS)

    def _drop(self, transport: asyncio.WriteTransport) -> None:
        """Abort the connection: its buffer goes at once, and the server sees the
        client gone (the response ends as for any client that left)."""
        self.dropped = True
        transport.abort()
