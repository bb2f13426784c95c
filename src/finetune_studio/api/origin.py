"""Guards against web pages of other sites: DNS rebinding and cross-site writes.

Both run in front of everything else, as ASGI middleware, on every path (`/health`
and the web UI's files included).

`LoopbackHostGuard` (on a loopback server only): a page on a site whose name its
owner points at 127.0.0.1 once the page has loaded (DNS rebinding) is, for the
browser, same-origin with this server, so it could read every answer, the files
`POST /datasets/inspect` reads included. Such a request still says the attacker's
name in its `Host` header, so a loopback server answers only requests addressed to
a loopback name (`127.0.0.1` or another loopback address, `[::1]`, `localhost`,
`*.localhost`, any port) or to a name the operator lists in
`FINETUNE_STUDIO_SERVER_NAMES`; any other gets 421 Misdirected Request. A request
without a `Host` header (HTTP/1.0) names no site and passes: browsers always send
one. An exposed server (which always wants the token) does not check `Host`.

`CrossSiteGuard` (on every server): a page on another site can send a form, an
upload or a body-less POST without the server's consent (no CORS preflight), and
the browser would act on a loopback server's files on its behalf. So a request
that may change something (any method but GET, HEAD and OPTIONS) is refused with
403 when its `Origin` is not `http://` or `https://` followed by its own `Host`
(`Origin: null`, from sandboxed frames and some redirects, counts as foreign), or
when its `Sec-Fetch-Site` is `cross-site`. Browsers send `Origin` with every such
request, the page's own included; curl, the SDKs and the CLI send neither header
and pass.

Under the OpenAI-compatible paths the answers come in OpenAI's error shape.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Any, Optional

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from finetune_studio.api.openai_errors import is_openai_path
from finetune_studio.openai_wire import error_body
from finetune_studio.text import clean_text

SERVER_NAMES_SETTING = "FINETUNE_STUDIO_SERVER_NAMES"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# A Host header: a bracketed IPv6 address or a name (no colon), then an optional port.
_HOST = re.compile(r"(?:\[(?P<ipv6>[0-9a-f:.]+)\]|(?P<name>[^:\[\]]+))(?::[0-9]*)?")
_QUOTED_CHARS = 200  # the most of a header or path an answer quotes


def host_name(host: str) -> Optional[str]:
    """The name a Host header value addresses (lower case, an IPv6 address without its
    brackets, the port dropped), or None when the value is no host[:port]."""
    match = _HOST.fullmatch(host.strip().lower())
    if match is None:
        return None
    return match["ipv6"] or match["name"]


def is_loopback_name(name: str) -> bool:
    """Whether `name` (from `host_name`) can only mean this machine: a loopback address,
    `localhost` or a name under it (which browsers never look up in DNS)."""
    if name == "localhost" or (name.endswith(".localhost") and len(name) > len(".localhost")):
        return True
    try:
        address = ipaddress.IPv6Address(name) if ":" in name else ipaddress.IPv4Address(name)
    except ValueError:
        return False
    return address.is_loopback


def _quote(text: str) -> str:
    text = clean_text(text)
    return repr(text if len(text) <= _QUOTED_CHARS else text[:_QUOTED_CHARS] + "...")


def _refusal(scope: Scope, status: int, message: str, code: str) -> JSONResponse:
    body: dict[str, Any]
    if is_openai_path(scope["path"]):
        body = error_body(message, "invalid_request_error", None, code)
    else:
        body = {"detail": message}
    # A refused request's body is never read: the connection is not kept for another.
    return JSONResponse(body, status_code=status, headers={"Connection": "close"})


class LoopbackHostGuard:
    """On a loopback server: 421 for a request whose Host is not a loopback name or one of `server_names`."""

    def __init__(self, app: ASGIApp, server_names: Iterable[str] = ()) -> None:
        self.app = app
        self.server_names = frozenset(name.lower() for name in server_names)

    def accepts(self, host: str) -> bool:
        name = host_name(host)
        return name is not None and (is_loopback_name(name) or name in self.server_names)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            hosts = [value.decode("latin-1") for key, value in scope["headers"] if key == b"host"]
            refused = next((host for host in hosts if not self.accepts(host)), None)
            if refused is not None:
                message = (
                    f"this server listens on loopback and answers only requests addressed to 127.0.0.1, [::1],"
                    f" localhost or a name under .localhost; this one was addressed to {_quote(refused)}. A web page of"
                    " another site may have pointed its name at this machine (DNS rebinding) to read what this server"
                    " answers. To reach the server under another name (a reverse proxy's, say), the operator lists it"
                    f" in {SERVER_NAMES_SETTING} (names separated by commas)"
                )
                response = _refusal(scope, 421, message, "misdirected_request")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def cross_site_reason(headers: Iterable[tuple[bytes, bytes]]) -> Optional[str]:
    """Why a request's headers say a page of another site sent it, or None when they do not."""
    pairs = list(headers)
    host = next((value.decode("latin-1").strip() for key, value in pairs if key == b"host"), None)
    own = () if host is None else (f"http://{host}".lower(), f"https://{host}".lower())
    for key, value in pairs:
        if key == b"origin":
            origin = value.decode("latin-1").strip()
            if origin.lower() not in own:
                where = f"http://{host}" if host is not None else "a request without a Host header has none"
                return f"its Origin header, {_quote(origin)}, is not this server's own address ({where})"
        elif key == b"sec-fetch-site" and value.strip().lower() == b"cross-site":
            return "its Sec-Fetch-Site header says a page of another site sent it (cross-site)"
    return None


class CrossSiteGuard:
    """403 for a request that may change something (any method but GET, HEAD, OPTIONS) sent by a page of another site."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and str(scope["method"]).upper() not in SAFE_METHODS:
            reason = cross_site_reason(scope["headers"])
            if reason is not None:
                message = (
                    f"refused {clean_text(str(scope['method']))} {_quote(scope['path'])}: {reason}. A web page of another"
                    " site may not start, stop, upload, change or delete anything on this server; use this server's own"
                    " page, or a client that is not a browser (curl, the SDKs and the CLI send no Origin)"
                )
                response = _refusal(scope, 403, message, "cross_site_request")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
