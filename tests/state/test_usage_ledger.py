"""The usage ledger's two forms: the same rows back; the in-process one bounded, the Redis one
one hash per tenant and day with a retention TTL, holding only names and numbers."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import pytest
import redis

from gateway.kernel.errors import ServiceUnavailable
from state.redis import RedisStore
from state.redis_usage import RedisLedger
from state.usage import METRICS, RETENTION_DAYS, MemoryLedger, UsageLedger
from tests.redis_server import delete_prefix, redis_url, unique_prefix
from tests.state.conftest import REDIS_MODES, make_response, target_of


@pytest.fixture(params=["memory", *REDIS_MODES])
async def ledger(request: pytest.FixtureRequest) -> AsyncIterator[UsageLedger]:
    if request.param == "memory":
        yield MemoryLedger()
        return
    target = target_of(request, request.param)
    p = unique_prefix()
    store = RedisStore(target.topology, key_prefix=p, ttl_seconds=60, timeout_seconds=2)
    yield RedisLedger(store)
    await store.aclose()
    target.delete_prefix(p)


async def test_rows_add_up_per_tenant_day_key_and_model(ledger: UsageLedger) -> None:
    await ledger.add("a", "2026-12-01", "k1", "m", {"requests": 1, "input_tokens": 10})
    await ledger.add("a", "2026-12-01", "k1", "m", {"requests": 1, "errors": 1, "output_tokens": 4})
    for cost in (1_234_567, 1, 999_999_999_999):  # micro-units add exactly
        await ledger.add("a", "2026-12-01", "k1", "m", {"cost_micros": cost})
    await ledger.add("a", "2026-12-02", "", "we/ird\tmodel", {"requests": 1, "cached_tokens": 3})
    await ledger.add("b", "2026-12-01", "k1", "m", {"requests": 5})
    rows = await ledger.read(["a"], ["2026-12-01", "2026-12-02", "2026-12-03"])
    got = {(r.tenant, r.day, r.key, r.model): r.counts for r in rows}
    first = dict.fromkeys(METRICS, 0) | {"requests": 2, "errors": 1, "input_tokens": 10, "output_tokens": 4}
    first["cost_micros"] = 1_234_567 + 1 + 999_999_999_999
    second = dict.fromkeys(METRICS, 0) | {"requests": 1, "cached_tokens": 3}
    assert got == {("a", "2026-12-01", "k1", "m"): first, ("a", "2026-12-02", "", "we/ird\tmodel"): second}


async def test_the_memory_ledger_drops_its_oldest_days_first() -> None:
    ledger = MemoryLedger(max_rows=3)
    for day in ("2026-12-01", "2026-12-02"):
        for model in ("x", "y"):
            await ledger.add("a", day, "k", model, {"requests": 1})
    rows = await ledger.read(["a"], ["2026-12-01", "2026-12-02"])
    assert {(r.day, r.model) for r in rows} == {("2026-12-02", "x"), ("2026-12-02", "y")}


async def test_a_redis_day_is_one_hash_with_the_retention_ttl() -> None:
    p = unique_prefix()
    store = RedisStore(redis_url(), key_prefix=p, ttl_seconds=60, timeout_seconds=2)
    client = redis.Redis.from_url(redis_url())
    try:
        await RedisLedger(store).add("t", "2026-12-01", "k", "m", {"requests": 1, "input_tokens": 7})
        [key] = list(client.scan_iter(match=f"{p}:*"))
        assert key == f"{p}:{{t}}:u:2026-12-01".encode()
        assert 0 < client.ttl(key) <= RETENTION_DAYS * 86400
        assert client.hgetall(key) == {b'["k","m","requests"]': b"1", b'["k","m","input_tokens"]': b"7"}
    finally:
        client.close()
        await store.aclose()
        delete_prefix(redis_url(), p)


async def test_a_count_right_after_a_failed_store_call_does_not_wait_again() -> None:
    """The end of a turn whose put just timed out: the ledger fails at once (the count is lost,
    logged by the engine), instead of making the client wait a second timeout."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts, never answers
    store = RedisStore(
        f"redis://127.0.0.1:{silent.getsockname()[1]}/0", key_prefix="x", ttl_seconds=60, timeout_seconds=0.5
    )
    try:
        with pytest.raises(ServiceUnavailable):
            await store.put(make_response())
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable):
            await RedisLedger(store).add("t", "2026-12-01", "k", "m", {"requests": 1})
        assert time.monotonic() - started < 0.1
        await asyncio.sleep(0.6)  # a timeout later it tries again (and waits again)
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable):
            await RedisLedger(store).add("t", "2026-12-01", "k", "m", {"requests": 1})
        assert time.monotonic() - started >= 0.4
    finally:
        await store.aclose()
        silent.close()
