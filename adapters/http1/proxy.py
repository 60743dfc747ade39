"""Forward proxies: which one a request goes through (the provider's ``proxy``, or with
``trust_env`` the operator's ``HTTP(S)_PROXY`` / ``ALL_PROXY`` / ``NO_PROXY``, read and matched by
the standard library as urllib does), and the ``CONNECT`` tunnel for an https:// upstream."""

from __future__ import annotations

import base64
import urllib.request
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from adapters.http1.errors import ConnectError, ConnectFailure, RequestNotSent

if TYPE_CHECKING:
    from adapters.http1.connection import Connection

__all__ = ["Proxy", "ProxyChoice", "open_tunnel"]

TUNNEL_HEAD_LIMIT = 64 * 1024  # bytes of a CONNECT answer's head


class Proxy:
    """A plain-HTTP forward proxy: where to connect and the Proxy-Authorization line, if any."""

    __slots__ = ("auth", "host", "port")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")  # "host:port", as curl takes it
        if parts.scheme != "http" or not parts.hostname:
            raise RequestNotSent("The forward proxy URL must use plain HTTP.")
        self.host = parts.hostname
        try:
            self.port = parts.port or 80
        except ValueError:
            raise RequestNotSent("The forward proxy URL's port is not valid.") from None
        self.auth = ""
        if parts.username is not None:
            cred = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self.auth = f"proxy-authorization: Basic {base64.b64encode(cred).decode()}\r\n"


class ProxyChoice:
    """The proxy for each upstream: ``configured`` for all; else, when ``trust_env``, the
    environment's as :func:`urllib.request.getproxies_environment` reads it (lower- or
    upper-case ``<scheme>_proxy``, ``all_proxy``) unless :func:`urllib.request.proxy_bypass_environment`
    matches the host in ``no_proxy``; else none. The environment is read once, when the pool is made."""

    __slots__ = ("_env", "_fixed", "_parsed")

    def __init__(self, configured: str | None, *, trust_env: bool) -> None:
        self._fixed = Proxy(configured) if configured else None
        self._env = urllib.request.getproxies_environment() if trust_env and not configured else {}
        self._parsed: dict[str, Proxy] = {}

    def __call__(self, scheme: str, authority: str) -> Proxy | None:
        """The proxy for ``scheme``://``authority`` (host:port), or None: direct."""
        if self._fixed is not None or not self._env:
            return self._fixed
        env = self._env
        url = env.get(scheme) or env.get("all")
        # (proxy_bypass_environment is public in urllib but absent from typeshed's stubs)
        if not url or urllib.request.proxy_bypass_environment(authority, env):  # type: ignore[attr-defined]
            return None
        proxy = self._parsed.get(url)
        if proxy is None:
            proxy = self._parsed[url] = Proxy(url)
        return proxy


async def open_tunnel(conn: Connection, authority: str, proxy: Proxy) -> None:
    """``CONNECT authority`` through ``proxy`` on ``conn``; returns once the proxy said 200."""
    assert conn.transport is not None
    conn.tunnel = head = bytearray()
    conn.transport.write(f"CONNECT {authority} HTTP/1.1\r\nhost: {authority}\r\n{proxy.auth}\r\n".encode())
    while b"\r\n\r\n" not in head:
        if len(head) > TUNNEL_HEAD_LIMIT:
            raise ConnectError(ConnectFailure.PROXY_MALFORMED)
        if conn.eof or conn.closed:
            raise ConnectError(ConnectFailure.PROXY_CLOSED)
        await conn.wait_tunnel()
    conn.tunnel = None
    status = bytes(head).split(b"\r\n", 1)[0].split(b" ")
    if len(status) < 2 or not status[0].startswith(b"HTTP/1."):
        raise ConnectError(ConnectFailure.PROXY_MALFORMED)
    if status[1] == b"407":
        raise ConnectError(ConnectFailure.PROXY_AUTH)
    if status[1] != b"200":
        raise ConnectError(ConnectFailure.PROXY_REFUSED)
