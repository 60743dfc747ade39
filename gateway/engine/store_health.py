"""Whether the store can keep a ``store: true`` response, known before the upstream call.

A turn that cannot be stored would spend upstream tokens and then fail. So before its upstream call
(and before any compaction call made for it) the orchestrator writes the response's write-ahead
record (``reserve``: its id, tenant and ``created_at``, status ``in_progress``; see
``state/base.py``): that write is the check, exact at that moment, and one round trip. When it
fails, the request is refused with 503 and nothing is generated. The record's TTL is the upstream
call's whole deadline plus ``MARGIN_SECONDS``; the response's put replaces it, and a turn that ends
without one (failed, cancelled) drops it (``release``).

A failure is remembered for ``recheck_seconds``: in that time ``store: true`` requests are refused
at once (``require``), with no store call and no wait on a frozen server; after it, the next request
probes with one ping (shared by the requests arriving meanwhile, bounded by the store's timeout).
Every store write reports its outcome too, so an outage seen by a put takes effect at once. The
store given is the observed one (``ObservedStore``), so each failed check (a write-ahead record,
a probe) counts in ``gateway_state_store_errors_total``. ``store: false`` traffic never asks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from gateway.kernel.errors import ServiceUnavailable
from state.base import PendingResponse, ResponseStore

log = structlog.get_logger("gateway.engine.store_health")

# a write-ahead record outlives the upstream call's deadline by this much: the end-of-turn hooks
# and the final write come after it
MARGIN_SECONDS = 60.0


def _refusal() -> ServiceUnavailable:
    return ServiceUnavailable(
        "The state store is unavailable, so this response could not be stored; send "
        "store: false, or retry shortly."
    )


class StoreHealth:
    __slots__ = ("_clock", "_down_until", "_probe", "recheck_seconds", "store")

    def __init__(
        self, store: ResponseStore, recheck_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.recheck_seconds = recheck_seconds
        self._clock = clock
        self._down_until: float | None = None  # None: no failure known
        self._probe: asyncio.Future[bool] | None = None

    async def require(self) -> None:
        """Return unless the store is known down; then raise ServiceUnavailable (within
        ``recheck_seconds`` of the failure at once, after it when a ping says it still is).
        No store call while no failure is known."""
        if self._down_until is None:
            return
        if self._clock() >= self._down_until:
            if self._probe is None:
                self._probe = asyncio.ensure_future(self._ping())
            probe = self._probe
            healthy = await asyncio.shield(probe)
            if self._probe is probe:
                self._probe = None
                self.report(healthy)
        if self._down_until is not None:
            raise _refusal()

    async def reserve(self, pending: PendingResponse, deadline_seconds: float) -> None:
        """Write ``pending``'s write-ahead record, to last ``deadline_seconds`` (the upstream
        call's whole deadline) plus the margin; raise ServiceUnavailable when it cannot be kept."""
        await self.require()
        try:
            await self.store.reserve(pending, deadline_seconds + MARGIN_SECONDS)
        except ServiceUnavailable:
            self.report(False)
            raise _refusal() from None

    async def release(self, tenant: str, response_id: str) -> None:
        """Drop a write-ahead record no response will replace; if the store cannot, the record
        expires with its TTL (the failure is reported, not raised). While the store is known down
        it is not tried: a failing turn's end does not wait on a frozen server."""
        if self._down_until is not None and self._clock() < self._down_until:
            return
        try:
            await self.store.release(tenant, response_id)
        except ServiceUnavailable:
            self.report(False)

    def report(self, healthy: bool) -> None:
        """What a store call just showed."""
        if healthy != (self._down_until is None):
            log.warning("state_store_down") if not healthy else log.info("state_store_up")
        self._down_until = None if healthy else self._clock() + self.recheck_seconds

    async def _ping(self) -> bool:
        try:
            return await self.store.ping()
        except Exception:
            return False
