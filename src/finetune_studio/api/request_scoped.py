"""Work that lives only for its request goes when its client goes.

Starlette cancels nothing when a client disconnects while a handler awaits its
work: no one listens for the ASGI `http.disconnect` then. Two dataset inspections
of a 205 MB file whose clients left after 1.5 s kept their children (and the
inspection slots: every other inspection got 429) for over a minute.

A route whose work lives only for its request (a dataset inspection, a chat
answer; never a training job or an export, which outlive their request) is marked
with `@request_scoped`. `request_scoped_routes` is the registry: the marked routes
of an app, which `create_app` hands to `cancel_on_disconnect` (and a test walks,
so a new route of this kind is tested for it without being named there). Each
marked route's ASGI app, the handler and the response it returns, runs in a task
raced against the client's disconnect; when the client goes first, the task is
cancelled, so the work's own `finally` ends what it started (an inspection's
child is killed and reaped; a chat answer is cancelled in the shared chat child
by `Generation.close`, also when it was streaming) and frees its slot at once.

The receive channel. Reading the body consumes the `http.request` messages, so
the watcher starts only once FastAPI has read the whole body (it sees the last
`http.request` go by), or at once for a route without one; after the body, an
HTTP connection has nothing to receive but the disconnect, so the watcher takes
nothing the route or its response needs. (A streamed response may listen for the
disconnect too, as Starlette's does under ASGI 2.3: uvicorn tells every listener,
and whichever hears it first ends the stream.) Once the response has been sent
whole, a disconnect cancels nothing: what runs after it (a dependency's cleanup)
runs to its end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from fastapi.routing import APIRoute
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# nginx's code for "the client closed the request": what a server that logs it logs.
CLIENT_GONE = 499
_Endpoint = TypeVar("_Endpoint", bound=Callable[..., Any])
_MARK = "__finetune_studio_request_scoped__"


def request_scoped(endpoint: _Endpoint) -> _Endpoint:
    """Mark a route's endpoint: its work is cancelled when its client goes away (see the module docstring)."""
    setattr(endpoint, _MARK, True)
    return endpoint


def is_request_scoped(route: BaseRoute) -> bool:
    return isinstance(route, APIRoute) and bool(getattr(route.endpoint, _MARK, False))


def request_scoped_routes(routes: Iterable[BaseRoute]) -> list[APIRoute]:
    """The registry: every marked route among `routes` (an app's)."""
    return [route for route in routes if isinstance(route, APIRoute) and is_request_scoped(route)]


def cancel_on_disconnect(routes: Iterable[APIRoute]) -> None:
    """Make each route's work go when its client goes (done once, by `create_app`)."""
    for route in routes:
        route.app = until_disconnected(route.app, reads_body=route.body_field is not None)


def until_disconnected(app: ASGIApp, *, reads_body: bool) -> ASGIApp:
    """`app`, cancelled when the client disconnects before its response is sent whole."""

    async def scoped(scope: Scope, receive: Receive, send: Send) -> None:
        body_read = asyncio.Event()
        if not reads_body:
            body_read.set()
        response_started = False
        response_sent = False

        async def receive_body() -> Message:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read.set()  # the last of the body (or the client gone while it came)
            return message

        async def send_noting(message: Message) -> None:
            nonlocal response_started, response_sent
            if message["type"] == "http.response.start":
                response_started = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                response_sent = True
            await send(message)

        work = asyncio.ensure_future(app(scope, receive_body, send_noting))
        watcher = asyncio.ensure_future(_disconnected(receive, body_read))
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if watcher.done() and not watcher.cancelled():
                watcher.exception()  # a receive that failed: the connection is as good as gone
            if not work.done() and not response_sent:
                work.cancel()  # the client is gone: its work goes with it
                await asyncio.wait({work})
                if not work.cancelled():
                    work.exception()  # whatever it ended with, no one is there to read it
                if not response_started:
                    with contextlib.suppress(OSError):
                        await send({"type": "http.response.start", "status": CLIENT_GONE, "headers": []})
                        await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await work  # its answer, or its exception
        finally:
            for task in (watcher, work):
                if not task.done():  # this request's own task was cancelled (the server stopping)
                    task.cancel()

    return scoped


async def _disconnected(receive: Receive, body_read: asyncio.Event) -> None:
    """Returns when the client has gone (listening only once the body is read)."""
    await body_read.wait()
    while (await receive())["type"] != "http.disconnect":
        pass
