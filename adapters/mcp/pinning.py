"""An httpx2 client (the MCP SDK's HTTP library) that connects only to the addresses the SSRF
check admitted (policy.py): its connection pool's network backend maps the server's host to them,
so the name is never resolved again between the check and the connection (TLS still verifies the
host name). This module alone knows the internals it relies on (httpx2's transport holding an
httpcore2 ``AsyncConnectionPool`` as ``_pool``, whose ``network_backend`` is a constructor
argument); ``supported()`` checks them, and tests/adapters/test_mcp_pinning.py fails loudly when an
upgrade changes them."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable
from typing import Any

import httpcore2
import httpx2
from httpcore2 import AsyncNetworkBackend, AsyncNetworkStream
from httpcore2._backends.auto import AutoBackend


class PinnedBackend(AsyncNetworkBackend):
    """Connects ``host`` to its checked addresses (the first that answers); any other host: none."""

    def __init__(self, host: str, addresses: list[str]) -> None:
        self._host = host
        self._addresses = addresses
        self._inner = AutoBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore2's signature)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> AsyncNetworkStream:
        if host.strip("[]").lower() != self._host.strip("[]"):
            raise httpcore2.ConnectError("the MCP server's connection went to another host")
        last: Exception | None = None
        for address in self._addresses:
            try:
                return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout, OSError) as exc:
                last = exc
        raise httpcore2.ConnectError(str(last) if last is not None else "no address to connect to")

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109
        socket_options: Iterable[Any] | None = None,
    ) -> AsyncNetworkStream:
        raise httpcore2.ConnectError("unix sockets are not MCP servers")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class ResponseTooLarge(Exception):
    """A response body ran past the client's cap."""


class _Capped(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, cap: int) -> None:
        self._inner = inner
        self._cap = cap

    async def __aiter__(self) -> Any:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._cap:
                raise ResponseTooLarge(f"a response from the MCP server exceeded {self._cap} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class CappedTransport(httpx2.AsyncBaseTransport):
    """Every response body cut off past ``cap`` bytes (a JSON answer has no other bound)."""

    def __init__(self, inner: httpx2.AsyncHTTPTransport, cap: int) -> None:
        self._inner = inner
        self._cap = cap

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        response.stream = _Capped(response.stream, self._cap)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@functools.cache
def supported() -> bool:
    """The internals this module replaces are where it expects them (checked once a process)."""
    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    pool = getattr(transport, "_pool", None)
    params = inspect.signature(httpcore2.AsyncConnectionPool).parameters
    return isinstance(pool, httpcore2.AsyncConnectionPool) and "network_backend" in params


def pinned_client(
    host: str,
    addresses: list[str],
    *,
    headers: dict[str, str] | None,
    timeout: httpx2.Timeout,
    cap: int,
    auth: httpx2.Auth | None = None,
) -> httpx2.AsyncClient:
    """A client whose every connection goes to ``addresses`` (``host``'s checked addresses), and
    whose every response body stops at ``cap`` bytes. No proxies from the environment (they would
    connect elsewhere), no redirects of its own."""
    if not supported():
        raise RuntimeError("httpx2's transport changed: adapters/mcp/pinning.py cannot pin MCP connections")
    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    transport._pool = httpcore2.AsyncConnectionPool(
        ssl_context=transport._pool._ssl_context,
        network_backend=PinnedBackend(host.lower(), addresses),
        max_connections=4,
        max_keepalive_connections=0,
    )
    return httpx2.AsyncClient(
        transport=CappedTransport(transport, cap),
        headers=headers,
        timeout=timeout,
        auth=auth,
        follow_redirects=False,
        trust_env=False,
    )
