"""The entries of an MCP allow-list (``mcp.allow``, ``tenants.<t>.mcp.allow``), parsed once: a host
name (``mcp.example.com``), an IP address or network (``10.0.0.0/8``, ``::1``), or a URL prefix
(``https://mcp.example.com/tools/``). The settings validate entries with ``parse_entry``; the MCP
client (adapters/mcp/policy.py) matches URLs and addresses against them."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from enum import Enum
from urllib.parse import urlsplit

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_HOST = re.compile(
    r"^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$"
)
DEFAULT_PORTS = {"http": 80, "https": 443}


class EntryKind(Enum):
    HOST = "host"  # the URL's host, exactly (any scheme, any port)
    NETWORK = "network"  # the addresses the URL's host resolves to (and an IP literal URL's)
    PREFIX = "prefix"  # scheme, host and port exactly, and the path starting with the entry's


@dataclass(frozen=True, slots=True)
class AllowEntry:
    kind: EntryKind
    host: str = ""  # HOST, PREFIX: lower case, IPv6 without brackets
    network: Network | None = None  # NETWORK; PREFIX whose host is an IP literal: that address
    scheme: str = ""  # PREFIX
    port: int = 0  # PREFIX
    path: str = ""  # PREFIX


def parse_entry(value: str) -> AllowEntry:
    """One entry, or ValueError saying what is wrong with it."""
    text = value.strip()
    if "://" in text:
        parts = urlsplit(text)
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS:
            raise ValueError(f"a URL prefix must be http or https, not {scheme!r}")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ValueError("a URL prefix has no credentials, query or fragment")
        host = (parts.hostname or "").lower()
        if not host:
            raise ValueError("a URL prefix needs a host")
        try:
            port = parts.port or DEFAULT_PORTS[scheme]
        except ValueError as exc:
            raise ValueError(f"a URL prefix's port is invalid: {exc}") from None
        network = _network(host)
        if network is None and not _HOST.match(host):
            raise ValueError(f"{host!r} is not a host name")
        return AllowEntry(
            EntryKind.PREFIX, host=host, network=network, scheme=scheme, port=port, path=parts.path or "/"
        )
    network = _network(text)
    if network is not None:
        return AllowEntry(EntryKind.NETWORK, network=network)
    host = text.lower().rstrip(".")
    if not _HOST.match(host):
        raise ValueError(
            f"{value!r} is neither a host name, an IP address or network, nor an http(s) URL prefix"
        )
    return AllowEntry(EntryKind.HOST, host=host)


def _network(text: str) -> Network | None:
    try:
        return ipaddress.ip_network(text.strip("[]"), strict=False)
    except ValueError:
        return None
