"""Work that lives only for its request goes when its client goes.

Starlette cancels nothing when a client disconnects while a handler awaits its
work: no one listens for the ASGI `http.disconnect` then. Two dataset inspections
of a 205 MB file whose clients left after 1.5 s kept their children (and the
inspection slots: every other inspection got 429) for over a minute.

A route whose work lives only for its request (a dataset inspection, a chat
answer; never a training job or an export, which outlive their request) has its
endpoint marked `@request_scoped`, on a router whose `route_class` is
`RequestScopedRoute`. `request_scoped_routes` is the registry: the marked routes
of the API's routers (`create_app` refuses a marked route of another class, and a
test walks the registry, so a new route of this kind is tested without being named
there). While a marked route's handler runs, a watcher listens for the client's
disconnect; when it comes, the handler's task is cancelled, so the work's own
`finally` ends what it started (an inspection's child is killed and reaped, a chat
answer is cancelled in the shared chat child by `Generation.close`) and frees its
slot at once; the request is answered 499 (nginx's "client closed request", which
no one reads). The handler keeps its own task: nothing moves to another.

The receive channel. Reading the body consumes its `http.request` messages, so
the watcher listens only once FastAPI has read the whole body (the handler reads
it through a receive that notes the last `http.request` go by), or at once for a
route without one. After the body an HTTP connection has nothing to receive but
the disconnect, so the watcher takes nothing the handler needs; it stops when the
handler returns. A streamed response (a chat answer's `BoundedEventStream`) is
sent after that, and Starlette's `StreamingResponse` listens for the disconnect
itself (under ASGI 2.3, which uvicorn speaks): it ends the stream, whose
`on_close` cancels the answer in the chat child.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.routing import APIRoute, APIRouter
from starlette.types import Message

from finetune_studio.api.accounts import AuthorizedRoute

# nginx's code for "the client closed the request".
CLIENT_GONE = 499
Handler = Callable[[Request], Coroutine[Any, Any, Response]]
_Endpoint = TypeVar("_Endpoint", bound=Callable[..., Any])
_MARK = "__finetune_studio_request_scoped__"


def request_scoped(endpoint: _Endpoint) -> _Endpoint:
    """Mark a route's endpoint: its work is cancelled when its client goes away (see the module docstring)."""
    setattr(endpoint, _MARK, True)
    return endpoint


def is_request_scoped(route: APIRoute) -> bool:
    return bool(getattr(route.endpoint, _MARK, False))


def request_scoped_routes(routers: Iterable[APIRouter]) -> list[APIRoute]:
    """The registry: every marked route of `routers` (the API's)."""
    return [route for router in routers for route in router.routes if isinstance(route, APIRoute) and is_request_scoped(route)]


def check_request_scoped(routers: Iterable[APIRouter]) -> None:
    """Refuse a marked route that nothing would watch (its router's `route_class` is not RequestScopedRoute)."""
    for route in request_scoped_routes(routers):
        if not isinstance(route, RequestScopedRoute):
            raise TypeError(
                f"{sorted(route.methods or ())} {route.path} is @request_scoped, but its router's route_class is"
                f" {type(route).__name__}: give the router route_class=RequestScopedRoute"
            )


class RequestScopedRoute(AuthorizedRoute):
    """A route whose marked endpoint's handler is cancelled when its client goes away; other endpoints as
    every API route (AuthorizedRoute)."""

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()
        if not is_request_scoped(self):
            return handler
        return until_disconnected(handler, reads_body=self.body_field is not None)


def until_disconnected(handler: Handler, *, reads_body: bool) -> Handler:
    """`handler`, whose task is cancelled when the client disconnects before it returns (499 then)."""

    async def scoped(request: Request) -> Response:
        task = asyncio.current_task()
        if task is None:  # never: a handler runs in a task
            return await handler(request)
        body_read = asyncio.Event()
        if not reads_body:
            body_read.set()
        finished = gone = False

        async def receive_body() -> Message:
            message = await request.receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read.set()  # the last of the body (or the client gone while it came)
            return message

        async def watch() -> None:
            nonlocal gone
            await body_read.wait()
            while (await request.receive())["type"] != "http.disconnect":
                pass
            if not finished:
                gone = True
                task.cancel()  # the client is gone: its work goes with it

        watcher = asyncio.ensure_future(watch())
        try:
            return await handler(Request(request.scope, receive_body))
        except asyncio.CancelledError:
            # Cancelled by the watcher alone (not also by the server stopping): the work is over.
            if not gone or (sys.version_info >= (3, 11) and task.uncancel() > 0):
                raise
            return Response(status_code=CLIENT_GONE)
        finally:
            finished = True
            watcher.cancel()

    return scoped
