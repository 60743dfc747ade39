"""Where an MCP server may be: a URL checked against the tenant's allow-list, then every address
its host resolves to checked against the addresses no request may reach unless an operator lists
them (loopback, link-local and cloud metadata, private, unspecified, multicast and reserved ranges,
IPv4-mapped forms included). A listed host name is no licence for a private address it resolves
to (DNS rebinding): only an IP or network entry (or a URL prefix whose host is that IP) covers one.
The addresses checked are the ones connected to (pinning.py): nothing resolves the name twice."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from gateway.kernel.allow_list import DEFAULT_PORTS, AllowEntry, EntryKind, parse_entry

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Refused(Exception):
    """A URL or address a request may not reach; the message says why, without the URL."""


@dataclass(frozen=True, slots=True)
class Target:
    """A URL that passed the allow-list: its parts, and which entries admitted it."""

    scheme: str
    host: str
    port: int
    entries: tuple[AllowEntry, ...] | None  # the allow-list, for the address check (None: the operator's)


def parse_allow(values: list[str]) -> tuple[AllowEntry, ...]:
    return tuple(parse_entry(v) for v in values)


def check_url(url: str, entries: tuple[AllowEntry, ...] | None) -> Target:
    """The URL's target, when an entry admits it (``entries`` None: an operator's own server, any
    http(s) URL); Refused otherwise."""
    parts, scheme, host, port = _parse(url)
    if entries is None:
        return Target(scheme, host, port, None)
    literal = _literal(host)
    for entry in entries:
        if _admits(entry, parts, scheme, host, port, literal):
            return Target(scheme, host, port, entries)
    raise Refused("the server URL is not on this tenant's MCP allow-list")


def _parse(url: str) -> tuple[SplitResult, str, str, int]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise Refused("the server URL is not a valid URL") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise Refused("the server URL must be http or https")
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        raise Refused("the server URL has no host")
    if parts.username or parts.password:
        raise Refused("the server URL may not carry credentials: send them in headers or authorization")
    return parts, scheme, host, port or DEFAULT_PORTS[scheme]


def _admits(
    entry: AllowEntry, parts: SplitResult, scheme: str, host: str, port: int, literal: Address | None
) -> bool:
    if entry.kind is EntryKind.HOST:
        return host == entry.host
    if entry.kind is EntryKind.NETWORK:
        # an IP literal URL by its address; a host name is admitted by the addresses it resolves to
        return literal is None or (entry.network is not None and literal in entry.network)
    path = parts.path or "/"
    return (
        scheme == entry.scheme
        and host == entry.host
        and port == entry.port
        and (
            path == entry.path
            or path.startswith(entry.path if entry.path.endswith("/") else entry.path + "/")
        )
    )


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def restricted(address: Address) -> bool:
    """An address no request may reach unless an IP entry lists it."""
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        address = mapped
    return (
        address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_unspecified
        or address.is_multicast
        or address.is_reserved
        or not address.is_global
    )


def admitted_address(address: Address, target: Target) -> bool:
    """Whether the URL may connect to ``address``: a restricted one only when an IP entry (or a
    URL prefix with that IP as its host) covers it; a network entry admits only its addresses."""
    if target.entries is None:  # an operator-declared server: wherever the operator put it
        return True
    networks = [e.network for e in target.entries if e.network is not None]
    covered = any(address in n for n in networks if n.version == address.version)
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        covered = covered or any(mapped in n for n in networks if n.version == 4)
    if restricted(address):
        return covered
    # a public address: admitted by a host or prefix entry of the URL, or by a network entry
    by_name = any(e.kind is not EntryKind.NETWORK and e.host == target.host for e in target.entries)
    return by_name or covered


async def resolve(target: Target) -> list[str]:
    """The addresses to connect to: every address the host resolves to, each admitted (one that
    is not refuses the URL: a name that also resolves to a private address is not safe to use)."""
    literal = _literal(target.host)
    if literal is not None:
        found = [literal]
    else:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except OSError:
            raise Refused("the server's host name does not resolve") from None
        found = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))
    if not found:
        raise Refused("the server's host name does not resolve")
    for address in found:
        if not admitted_address(address, target):
            raise Refused(
                "the server resolves to an address this tenant may not reach (loopback, link-local and "
                "private addresses need an IP entry on the MCP allow-list)"
            )
    return [str(a) for a in found]
