"""StoreHealth against a real Redis store whose server stops answering (a listening socket that
never replies, as a frozen Redis): the write-ahead record is the check, a failure is remembered
for ``recheck_seconds`` (refusals at once, no call, no wait), then one ping shared by every waiting
request probes; a record is not released while the store is known down."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest

from gateway.engine.store_health import StoreHealth
from gateway.kernel.errors import ServiceUnavailable
from state.base import PendingResponse
from state.redis import RedisStore
from tests.redis_server import RedisServer

TIMEOUT = 0.5
RECHECK = 0.6


@pytest.fixture
def silent() -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # the kernel completes the handshakes; nobody ever reads or writes
    yield sock
    sock.close()


class Counting(RedisStore):
    """The Redis store, counting the calls StoreHealth makes."""

    calls: list[str]

    async def reserve(self, pending: PendingResponse, ttl_seconds: float) -> None:
        self.calls.append("reserve")
        await super().reserve(pending, ttl_seconds)

    async def release(self, tenant: str, response_id: str) -> None:
        self.calls.append("release")
        await super().release(tenant, response_id)

    async def ping(self) -> bool:
        self.calls.append("ping")
        return await super().ping()


def counting(url: str) -> Counting:
    store = Counting(url, key_prefix="health", ttl_seconds=60, timeout_seconds=TIMEOUT)
    store.calls = []
    return store


def pending() -> PendingResponse:
    return PendingResponse(f"resp_{time.monotonic_ns()}", "t", 1_700_000_000)


async def test_a_silent_store_is_found_out_by_the_record_then_refused_at_once(silent: socket.socket) -> None:
    store = counting(f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
    health = StoreHealth(store, recheck_seconds=RECHECK)
    try:
        await health.require()  # nothing known: no call at all
        assert store.calls == []
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable) as info:
            await health.reserve(pending(), 60)
        assert time.monotonic() - started < TIMEOUT + 1.0
        assert "send store: false" in info.value.message  # the refusal, not the store's own words
        assert store.calls == ["reserve"]
        started = time.monotonic()
        for _ in range(20):  # known down: refused without a call, and without a wait
            with pytest.raises(ServiceUnavailable):
                await health.reserve(pending(), 60)
        await health.release("t", "resp_x")  # not tried either: the record expires on its own
        assert time.monotonic() - started < 0.2
        assert store.calls == ["reserve"]
        await asyncio.sleep(RECHECK)
        waiting = [asyncio.ensure_future(health.require()) for _ in range(10)]
        outcomes = await asyncio.gather(*waiting, return_exceptions=True)
        assert all(isinstance(o, ServiceUnavailable) for o in outcomes)
        assert store.calls == ["reserve", "ping"]  # one probe for all ten
    finally:
        await store.aclose()


async def test_the_probe_lets_requests_through_once_the_store_answers() -> None:
    server = RedisServer().start()
    store = counting(server.url)
    health = StoreHealth(store, recheck_seconds=RECHECK)
    try:
        await health.reserve(pending(), 60)
        server.stop()
        with pytest.raises(ServiceUnavailable):
            await health.reserve(pending(), 60)
        server.start()
        with pytest.raises(ServiceUnavailable):
            await health.reserve(pending(), 60)  # still within the interval: no call
        await asyncio.sleep(RECHECK)
        record = pending()
        await health.reserve(record, 60)  # the probe answered, then the record was written
        await health.release(record.tenant, record.id)
        assert store.calls == ["reserve", "reserve", "ping", "reserve", "release"]
    finally:
        await store.aclose()
        server.stop()
