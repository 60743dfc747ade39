"""The live gateway: which ``Gateway`` new work uses, and who still holds an older one.

A reload (gateway/api/reload.py) swaps in a new ``Gateway``; work already under way keeps the one it
started on. Every HTTP request and every WebSocket turn holds the gateway it runs on (a count per
gateway), so an older gateway's resources are closed only once nothing holds it any more.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import structlog
from starlette.requests import Request
from starlette.responses import Response

from gateway.engine.orchestrator import Gateway

log = structlog.get_logger("gateway.api.live")

Retire = Callable[[Gateway], Awaitable[None]]
Handler = Callable[[Request, Gateway], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


class LiveGateway:
    """``current``: what new requests and turns use. ``acquire``/``release`` (or ``hold``) count the
    users of a gateway; ``swap`` makes a new one current and closes the old one (``retire``) when its
    last user releases it."""

    def __init__(self, gateway: Gateway, retire: Retire) -> None:
        self.current = gateway
        self._retire = retire
        self._holds: dict[Gateway, int] = {}
        self._idle: dict[Gateway, asyncio.Event] = {}  # swapped out, waiting for its last user
        self._retiring: set[asyncio.Task[None]] = set()

    def acquire(self) -> Gateway:
        gw = self.current
        self.retain(gw)
        return gw

    def retain(self, gw: Gateway) -> None:
        """Hold ``gw`` once more (a detached background turn, beyond its request), current or not."""
        self._holds[gw] = self._holds.get(gw, 0) + 1

    def release(self, gw: Gateway) -> None:
        left = self._holds[gw] - 1
        if left:
            self._holds[gw] = left
            return
        del self._holds[gw]
        idle = self._idle.get(gw)
        if idle is not None:
            idle.set()

    @contextmanager
    def hold(self) -> Iterator[Gateway]:
        """The current gateway, held for the ``with`` block (a request, a WebSocket turn)."""
        gw = self.acquire()
        try:
            yield gw
        finally:
            self.release(gw)

    def holders(self, gw: Gateway) -> int:
        return self._holds.get(gw, 0)

    def swap(self, new: Gateway) -> Gateway:
        """Make ``new`` current; the old one is retired once nothing holds it. Returns the old one."""
        old, self.current = self.current, new
        idle = self._idle[old] = asyncio.Event()
        if not self._holds.get(old):
            idle.set()
        task = asyncio.ensure_future(self._retire_when_idle(old, idle))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        return old

    async def _retire_when_idle(self, old: Gateway, idle: asyncio.Event) -> None:
        await idle.wait()
        del self._idle[old]
        try:
            await self._retire(old)
        except Exception:
            log.exception("gateway_retire_failed")
        log.info("gateway_retired")

    async def aclose(self) -> None:
        """At shutdown (every request and turn has ended or been cut): retire what is left."""
        for idle in self._idle.values():
            idle.set()  # a handler that was cut may not have released its hold
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)


def holding(handler: Handler) -> Endpoint:
    """``handler`` as a route's endpoint: it is given the gateway current when its request arrived,
    held (``LiveGateway.acquire``) until it has answered, so a reload meanwhile changes nothing
    under it."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        live: LiveGateway = request.app.state.live
        with live.hold() as gw:
            return await handler(request, gw)

    return endpoint
