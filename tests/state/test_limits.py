"""The limit counters (state/limits/): the same semantics in process and in Redis."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest

from gateway.kernel.errors import ServiceUnavailable
from state.limits.base import Check, CheckKind, Limiter
from state.limits.memory import MemoryLimiter
from state.limits.redis import RedisLimiter
from tests.redis_server import delete_prefix, free_port, redis_url, unique_prefix
from tests.state.conftest import REDIS_MODES, target_of

RPM = Check(CheckKind.REQUESTS, "rpm", 3)
TPM = Check(CheckKind.TOKENS, "tpm", 1000)
CONC = Check(CheckKind.CONCURRENCY, "conc", 2)
BUDGET = Check(CheckKind.BUDGET, "budget:x", 500, 3_600_000)


@pytest.fixture(params=["memory", *REDIS_MODES])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[Limiter]:
    if request.param == "memory":
        yield MemoryLimiter()
        return
    target = target_of(request, request.param)
    p = unique_prefix()
    lim = RedisLimiter(target.topology, key_prefix=p, timeout_seconds=2)
    try:
        yield lim
    finally:
        await lim.aclose()
        target.delete_prefix(p)


async def test_requests_sliding_log(limiter: Limiter) -> None:
    outs = [await limiter.admit("t", [RPM], f"r{i}", 0) for i in range(4)]
    assert [o.failed for o in outs] == [None, None, None, 0]
    assert [o.used[0] for o in outs] == [1, 2, 3, 3]
    assert 60_000 <= outs[3].retry_ms <= 61_000
    assert (await limiter.admit("other", [RPM], "x", 0)).failed is None  # per tenant


async def test_all_or_nothing_and_settlement(limiter: Limiter) -> None:
    first = await limiter.admit("t", [CONC, TPM, BUDGET], "a", 400)
    assert first.failed is None and first.used == [1, 400, 400]
    # the budget refuses: nothing else is charged
    refused = await limiter.admit("t", [CONC, TPM, BUDGET], "b", 200)
    assert refused.failed == 2 and refused.retry_ms == 3_600_000
    again = await limiter.admit("t", [CONC, TPM, BUDGET], "c", 50)
    assert again.failed is None and again.used == [2, 450, 450]
    assert (await limiter.admit("t", [CONC], "d", 0)).failed == 0  # two leases held
    await limiter.settle("t", [CONC, TPM, BUDGET], "a", -390)  # used 10 of 400
    after = await limiter.admit("t", [CONC, TPM, BUDGET], "e", 0)
    assert after.failed is None and after.used == [2, 60, 60]
    never = await limiter.admit("t", [TPM], "f", 5000)
    assert never.failed == 0 and never.retry_ms == -1


async def test_concurrent_admissions_never_overshoot(limiter: Limiter) -> None:
    outs = await asyncio.gather(*(limiter.admit("t", [RPM, BUDGET], f"r{i}", 100) for i in range(20)))
    assert sum(o.failed is None for o in outs) == 3  # RPM 3 (budget 500 would admit 5)


async def test_memory_window_has_no_double_burst_at_a_minute_edge() -> None:
    now = [1000.5]
    lim = MemoryLimiter(clock=lambda: now[0])
    assert all([(await lim.admit("t", [RPM], str(i), 0)).failed is None for i in range(3)])
    now[0] = 1000.5 + 59.9  # a new calendar minute, but not 60 s later
    assert (await lim.admit("t", [RPM], "x", 0)).failed == 0
    now[0] = 1060.9  # 60.4 s later: still counted (its second's bucket lasts 61 s)
    assert (await lim.admit("t", [RPM], "y", 0)).failed == 0
    now[0] = 1061.0
    assert (await lim.admit("t", [RPM], "z", 0)).failed is None
    # tokens: per-second buckets over at least 60 s
    assert (await lim.admit("t", [TPM], "a", 1000)).failed is None
    now[0] += 60.0
    assert (await lim.admit("t", [TPM], "b", 1)).failed == 0
    now[0] += 1.0
    assert (await lim.admit("t", [TPM], "c", 1000)).failed is None


async def test_redis_down_is_service_unavailable_within_the_timeout() -> None:
    lim = RedisLimiter(f"redis://127.0.0.1:{free_port()}/0", key_prefix="x", timeout_seconds=0.3)
    try:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(ServiceUnavailable):
            await lim.admit("t", [RPM], "a", 0)
        assert loop.time() - t0 < 1.0
    finally:
        await lim.aclose()


async def test_redis_script_reloaded_after_a_flush_and_a_db_in_the_url() -> None:
    import redis

    url = redis_url().rsplit("/", 1)[0] + "/3"
    p = unique_prefix()
    lim = RedisLimiter(url, key_prefix=p, timeout_seconds=2)
    try:
        assert (await lim.admit("t", [RPM], "a", 0)).failed is None
        redis.Redis.from_url(url).script_flush()
        assert (await lim.admit("t", [RPM], "b", 0)).used == [2]  # NOSCRIPT: EVAL, then cached
        assert redis.Redis.from_url(url).exists(lim.key("t", "rpm"))  # in db 3
        # concurrent calls pipeline on the one connection, each gets its own reply
        outs = await asyncio.gather(*(lim.admit("u", [RPM], f"r{i}", 0) for i in range(5)))
        assert sorted(o.used[0] for o in outs) == [1, 2, 3, 3, 3]
    finally:
        await lim.aclose()
        delete_prefix(url, p)


# -- admissions whose outcome was lost ----------------------------------------------------------
ALL = [RPM, TPM, CONC, BUDGET]
_probes = itertools.count()


async def counts(limiter: Limiter, tenant: str) -> list[int]:
    """What ``tenant`` has charged on each of ALL, read by a zero-token admission (then released)."""
    rid = f"probe-{next(_probes)}"
    probe = await limiter.admit(tenant, ALL, rid, 0)
    await limiter.release(tenant, ALL, rid, 0)
    assert probe.failed is None
    return [probe.used[0] - 1, probe.used[1], probe.used[2] - 1, probe.used[3]]


async def test_a_release_undoes_its_admission_exactly_once(limiter: Limiter) -> None:
    await limiter.admit("t", ALL, "kept", 100)
    assert (await limiter.admit("t", ALL, "lost", 200)).failed is None
    await limiter.release("t", ALL, "lost", 200)
    assert await counts(limiter, "t") == [1, 100, 1, 100]
    await limiter.release("t", ALL, "lost", 200)  # again: nothing more
    await limiter.settle("t", ALL, "lost", -150)  # a settlement after the release: nothing
    assert await counts(limiter, "t") == [1, 100, 1, 100]
    await limiter.settle("t", ALL, "kept", -90)
    await limiter.settle("t", ALL, "kept", -90)  # a settlement applies once
    assert await counts(limiter, "t") == [1, 10, 0, 10]


async def test_a_release_before_its_admission_voids_it(limiter: Limiter) -> None:
    """The admission still on a dead connection runs after its release: it charges nothing."""
    await limiter.release("t", ALL, "late", 300)
    with pytest.raises(ServiceUnavailable):  # void: no caller waits for it
        await limiter.admit("t", ALL, "late", 300)
    assert await counts(limiter, "t") == [0, 0, 0, 0]


async def test_a_lease_lasts_its_own_deadline(limiter: Limiter) -> None:
    assert (await limiter.admit("t", [CONC], "short", 0, lease_ms=300)).failed is None
    assert (await limiter.admit("t", [CONC], "long", 0, lease_ms=60_000)).failed is None
    assert (await limiter.admit("t", [CONC], "x", 0)).failed == 0  # two held
    await asyncio.sleep(0.45)
    assert (await limiter.admit("t", [CONC], "y", 0)).used == [2]  # the short one expired


async def test_a_request_count_only_admission_is_not_settled() -> None:
    """Its record expires with its count (61 s): no settlement round trip is needed for it."""
    from state.limits.base import needs_settling

    assert not needs_settling([RPM]) and needs_settling([RPM, TPM]) and needs_settling([CONC])


MONEY = Check(CheckKind.MONEY, "money:x", 1_000_000, 3_600_000)  # 1.000000 of the currency


async def test_a_money_budget_is_charged_the_cost_not_the_tokens(limiter: Limiter) -> None:
    checks = [BUDGET, MONEY]
    first = await limiter.admit("t", checks, "a", 100, 60_000, 700_000)
    assert first.failed is None and first.used == [100, 700_000]
    # the tokens would fit, the cost would not: refused at the money budget, nothing charged
    refused = await limiter.admit("t", checks, "b", 100, 60_000, 400_000)
    assert refused.failed == 1 and refused.retry_ms == 3_600_000 and refused.used == [100, 700_000]
    # settled to the real cost (a worst case of 0.7 that cost 0.25): the room comes back
    await limiter.settle("t", checks, "a", -50, -450_000)
    ok = await limiter.admit("t", checks, "c", 10, 60_000, 400_000)
    assert ok.failed is None and ok.used == [60, 650_000]
    # settled once only
    await limiter.settle("t", checks, "a", -50, -450_000)
    assert (await limiter.admit("t", [MONEY], "d", 0, 60_000, 0)).used == [650_000]
    # a release undoes exactly the cost charged
    await limiter.release("t", checks, "c", 10, 400_000)
    assert (await limiter.admit("t", [MONEY], "e", 0, 60_000, 0)).used == [250_000]
    # a cost above the whole budget can never be admitted
    never = await limiter.admit("t", [MONEY], "f", 0, 60_000, 1_000_001)
    assert never.failed == 0 and never.retry_ms == -1
    # a settlement never takes the counter below zero
    await limiter.settle("t", [MONEY], "e", 0, -10_000_000)
    assert (await limiter.admit("t", [MONEY], "g", 0, 60_000, 0)).used == [0]
