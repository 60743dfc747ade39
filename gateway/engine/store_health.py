"""Whether the store can keep a ``store: true`` response, known before the upstream call.

A turn that cannot be stored would spend upstream tokens and then fail, so the orchestrator asks
``StoreHealth.require()`` first. The answer is cached for ``recheck_seconds``: while the store is
healthy that costs one ping per interval (shared by every request in it); while it is down, requests
are refused at once, and the next interval's first request probes again (bounded by the store's own
timeout). Every store write reports its outcome too, so an outage seen by a put takes effect at
once. ``store: false`` traffic never asks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from gateway.kernel.errors import ServiceUnavailable
from state.base import ResponseStore

log = structlog.get_logger("gateway.engine.store_health")


class StoreHealth:
    __slots__ = ("_clock", "_healthy", "_known_until", "_probe", "recheck_seconds", "store")

    def __init__(
        self, store: ResponseStore, recheck_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.recheck_seconds = recheck_seconds
        self._clock = clock
        self._healthy = True
        self._known_until = 0.0
        self._probe: asyncio.Future[bool] | None = None

    async def require(self) -> None:
        """Return when the store is known healthy; raise ServiceUnavailable when it is not."""
        if self._clock() >= self._known_until:
            if self._probe is None:
                self._probe = asyncio.ensure_future(self._ping())
            probe = self._probe
            healthy = await asyncio.shield(probe)
            if self._probe is probe:
                self._probe = None
                self.report(healthy)
        if not self._healthy:
            raise ServiceUnavailable(
                "The state store is unavailable, so this response could not be stored; send "
                "store: false, or retry shortly."
            )

    def report(self, healthy: bool) -> None:
        """What a store call just showed."""
        if healthy != self._healthy:
            log.warning("state_store_down") if not healthy else log.info("state_store_up")
        self._healthy = healthy
        self._known_until = self._clock() + self.recheck_seconds

    async def _ping(self) -> bool:
        try:
            return await self.store.ping()
        except Exception:
            return False
