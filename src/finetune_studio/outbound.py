"""The one rule for where the server may send a request of its own (webhooks; an evaluation's
external judge): against server-side request forgery.

A loopback server may reach anything: only its own user can make it. An exposed server
(bound beyond loopback) may reach only the hosts its operator lists, and never a loopback,
private, link-local or otherwise special address unless that address (or a network that
holds it, `10.0.0.0/8`) is listed too: a listed name that resolves to such an address is
refused, so a name cannot be pointed at the server's own neighbourhood later. The name is
checked when a target is registered (`name_problem`); its addresses each time it is reached
(`address_problem`, on the addresses the connection then uses).

Plain Python (the standard library).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Optional, Union
from urllib.parse import urlsplit

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]


def allowed_entry(entry: str, setting: str) -> str:
    """An entry of a list of allowed hosts as it is compared: lower case, an IPv6 address
    without brackets; a host name, an address or a network (`10.0.0.0/8`). A scheme, port
    or path is refused, saying so."""
    name = entry.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if "/" in name:
        try:
            return str(ipaddress.ip_network(name, strict=False))
        except ValueError:
            pass
    elif name and name.count(":") != 1 and not any(char in name for char in "[]@ \t\r\n"):
        return name
    raise ValueError(
        f"{setting}: {entry!r} is not a host name, an address or a network; list names, addresses or networks only,"
        " without a scheme, port or path (hooks.example.com, 192.168.1.5, 10.0.0.0/8), separated by commas"
    )


def _networks(allowed: Iterable[str]) -> list[Network]:
    nets = []
    for entry in allowed:
        try:
            nets.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            continue  # a name
    return nets


def _listed(host: str, allowed: Iterable[str]) -> bool:
    allowed = list(allowed)
    if host in allowed:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(address in net for net in _networks(allowed))


def name_problem(url: str, *, allowed: list[str], exposed: bool, what: str, setting: str) -> Optional[str]:
    """Why the server may not send `what` to `url` (None: it may, as far as its name says)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is no number raises here)
    except ValueError as exc:
        return f"{url!r} is not a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http:// or https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return f"{url!r} carries a user name or password; put credentials in the path or leave them out"
    host = parts.hostname.lower()
    if exposed and not _listed(host, allowed):
        return (
            f"{host} is not a host this server lets {what} reach ({', '.join(allowed) or 'none is listed'}). The server"
            f" is reachable from the network; the operator lists the hosts in {setting}"
        )
    return None


def is_special(address: Address) -> bool:
    """Loopback, private, link-local, or any address no public host has."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return bool(
        address.is_loopback or address.is_private or address.is_link_local or address.is_reserved
        or address.is_multicast or address.is_unspecified or not address.is_global
    )


def address_problem(host: str, address: str, *, allowed: list[str], exposed: bool, setting: str) -> Optional[str]:
    """Why the server may not connect to `address` (one that `host` resolved to), or None."""
    if not exposed:
        return None
    parsed = ipaddress.ip_address(address.split("%", 1)[0])
    if is_special(parsed) and not any(parsed in net for net in _networks(allowed)):
        return (
            f"{host} resolves to {parsed}, a loopback, private or link-local address, which an exposed server reaches"
            f" only when the address (or its network) is listed in {setting} too"
        )
    return None
