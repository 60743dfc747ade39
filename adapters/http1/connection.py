"""One upstream connection: the asyncio protocol carrying one :class:`~adapters.http1.exchange.Exchange`
at a time (a CONNECT tunnel's answer before any), and what tells whether it may be reused."""

from __future__ import annotations

import asyncio
import select
from typing import TYPE_CHECKING

from adapters.http1.exchange import Exchange

if TYPE_CHECKING:
    from adapters.http1.pool import Pool

__all__ = ["Connection", "PoolKey"]

PoolKey = tuple[bool, str, int]  # (tls, host, port)


class Connection(asyncio.Protocol):
    """A connection to one upstream (``key``), counted by its ``pool`` until closed."""

    __slots__ = (
        "closed",
        "eof",
        "exchange",
        "idle_since",
        "key",
        "loop",
        "poller",
        "pool",
        "spoiled",
        "transport",
        "tunnel",
        "tunnel_waiter",
    )

    def __init__(self, pool: Pool, key: PoolKey) -> None:
        self.pool = pool
        self.key = key
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.poller: select.poll | None = None  # the socket, for stale bytes or an EOF unread
        self.exchange: Exchange | None = None  # the request in flight
        self.tunnel: bytearray | None = None  # a CONNECT answer's head being read
        self.tunnel_waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.eof = False  # the server closed its side
        self.spoiled = False  # bytes came that belong to no request: never reused
        self.idle_since = 0.0

    # -- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and self.poller is None:
            self.poller = select.poll()  # one per connection: a reuse check is one poll(2)
            self.poller.register(sock.fileno(), select.POLLIN)

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is not None and not ex.complete and ex.exc is None:
            ex.received(data)
            return
        if self.tunnel is not None:
            self.tunnel += data
            if b"\r\n\r\n" in self.tunnel:
                self._wake_tunnel()
            return
        self.spoiled = True  # bytes after the answer (or an idle connection talking): not reused

    def eof_received(self) -> bool:
        self._ended()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended()
        if not self.closed:
            self.closed = True
            self.pool.forget(self)

    def _ended(self) -> None:
        self.eof = True
        if self.exchange is not None:
            self.exchange.ended()
        self._wake_tunnel()

    # -- the client's side -------------------------------------------------------------------------
    def start(self) -> Exchange:
        """A new exchange, current from now on (the previous one was released)."""
        self.exchange = ex = Exchange(self)
        return ex

    def pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def _wake_tunnel(self) -> None:
        waiter = self.tunnel_waiter
        if waiter is not None:
            self.tunnel_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def wait_tunnel(self) -> None:
        self.tunnel_waiter = waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self.tunnel_waiter = None

    def close(self) -> None:
        if self.exchange is not None:
            self.exchange.detach()
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
            self.pool.forget(self)

    def abort(self) -> None:
        """Close without flushing (a connection that never became usable)."""
        if self.transport is not None:
            self.transport.abort()  # connection_lost comes later and is a no-op
        if not self.closed:
            self.closed = True
            self.pool.forget(self)

    @property
    def usable(self) -> bool:
        t = self.transport
        return not (self.closed or self.eof or self.spoiled or t is None or t.is_closing())

    def reusable(self) -> bool:
        """Usable, and its socket holds no stale byte and no EOF the loop has not read yet
        (checked just before an idle connection is given a request, as httpcore does)."""
        return self.usable and not (self.poller is not None and self.poller.poll(0))
