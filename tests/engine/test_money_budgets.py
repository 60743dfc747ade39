"""Budgets in money (gateway/engine/limits.py): a key's and its tenant's, each period rolling over
on the policy's clock, a start–end window closed before and after it; in process and in a real
Redis (the counter's name carries its period, so the rollover is the same in both)."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.engine.auth import Principal
from gateway.engine.limits import TenantLimiter
from gateway.kernel.errors import QuotaExceeded
from gateway.kernel.settings import Budget, Settings
from state.limits.base import Limiter
from state.limits.memory import MemoryLimiter
from state.limits.redis import RedisLimiter
from tests.redis_server import delete_prefix, redis_url, unique_prefix

START = dt.datetime(2026, 12, 31, 23, 0, tzinfo=dt.UTC).timestamp()  # an hour before a new year


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[Limiter]:
    if request.param == "memory":
        yield MemoryLimiter()
        return
    p = unique_prefix()
    lim = RedisLimiter(redis_url(), key_prefix=p, timeout_seconds=2)
    try:
        yield lim
    finally:
        await lim.aclose()
        delete_prefix(redis_url(), p)


def policy(limiter: Limiter, clock: Clock, **tenant: Any) -> TenantLimiter:
    return TenantLimiter(Settings(tenants={"t": tenant}), limiter, clock=clock)


async def spend(lim: TenantLimiter, who: Principal, cost: int) -> None:
    checks, labels = lim.checks(who)
    held = await lim.reserve(who, checks, labels, 0, seconds=10, cost=cost)
    assert held is not None
    await lim.settle_soon(held, 0, cost)


@pytest.mark.parametrize(
    ("period", "step"),
    [("day", 3600), ("month", 3600), ({"seconds": 600}, 600)],
    ids=["day", "month", "seconds"],
)
async def test_a_key_budget_renews_with_its_period(limiter: Limiter, period: Any, step: int) -> None:
    clock = Clock()
    lim = policy(limiter, clock)
    who = Principal("t", key_name="k1", budget=Budget(amount="1.00", period=period))
    await spend(lim, who, 600_000)
    checks, labels = lim.checks(who)
    with pytest.raises(QuotaExceeded) as info:
        await lim.reserve(who, checks, labels, 0, seconds=10, cost=600_000)
    assert info.value.code == "insufficient_quota" and info.value.status == 429
    per = "per 600 s" if isinstance(period, dict) else f"per {period}"
    assert f"Budget exhausted: budget {per} of this API key (k1): 1.00 USD" in info.value.message
    assert "it renews in" in info.value.message
    clock.now += step  # the next day, month, or window of 600 s: a fresh counter
    await spend(lim, who, 600_000)
    await spend(lim, who, 400_000)  # exactly the budget
    checks, labels = lim.checks(who)
    with pytest.raises(QuotaExceeded):
        await lim.reserve(who, checks, labels, 0, seconds=10, cost=1)
    await lim.aclose()


async def test_a_key_budget_and_its_tenants_both_apply(limiter: Limiter) -> None:
    clock = Clock()
    lim = policy(limiter, clock, budget={"amount": "2.00", "period": "month"})
    one = Principal("t", key_name="k1", budget=Budget(amount="1.50"))
    two = Principal("t", key_name="k2")
    await spend(lim, one, 1_500_000)
    checks, labels = lim.checks(one)
    with pytest.raises(QuotaExceeded) as info:  # the key's own budget
        await lim.reserve(one, checks, labels, 0, seconds=10, cost=100_000)
    assert "this API key (k1): 1.50 USD" in info.value.message
    await spend(lim, two, 500_000)  # the tenant's has 0.50 left, for any of its keys
    checks, labels = lim.checks(two)
    with pytest.raises(QuotaExceeded) as info:
        await lim.reserve(two, checks, labels, 0, seconds=10, cost=1)
    assert "budget per month of tenant 't': 2.00 USD" in info.value.message
    # a worst case above the whole budget is refused as such
    with pytest.raises(QuotaExceeded) as info:
        await lim.reserve(two, checks, labels, 0, seconds=10, cost=2_000_001)
    assert "worst-case cost of 2.000001 USD exceeds the budget per month" in info.value.message
    await lim.aclose()


async def test_a_window_admits_only_while_it_is_open(limiter: Limiter) -> None:
    clock = Clock()
    window = {"start": "2027-01-01T00:00:00Z", "end": "2027-01-02T00:00:00Z"}
    lim = policy(limiter, clock, budget={"amount": "1", "tokens": 1000, "period": window})
    who = Principal("t", key_name="k1")
    checks, labels = lim.checks(who)
    with pytest.raises(QuotaExceeded) as info:  # an hour before it opens
        await lim.reserve(who, checks, labels, 10, seconds=10, cost=10)
    assert "is not open: it opens in 1h0m0s" in info.value.message
    clock.now += 3600
    await spend(lim, who, 999_999)
    clock.now += 86_400  # it has ended: nothing renews
    checks, labels = lim.checks(who)
    with pytest.raises(QuotaExceeded) as info:
        await lim.reserve(who, checks, labels, 10, seconds=10, cost=10)
    assert "from 2027-01-01T00:00:00Z to 2027-01-02T00:00:00Z" in info.value.message
    assert "it has ended" in info.value.message
    await lim.aclose()


async def test_token_budgets_keep_working_beside_money(limiter: Limiter) -> None:
    clock = Clock()
    lim = policy(limiter, clock, budget={"tokens": 100, "amount": "5.00"})
    who = Principal("t", key_name="k1")
    checks, labels = lim.checks(who)
    held = await lim.reserve(who, checks, labels, 90, seconds=10, cost=10)
    assert held is not None
    with pytest.raises(QuotaExceeded) as info:
        await lim.reserve(who, checks, labels, 20, seconds=10, cost=10)
    assert "Token budget exhausted: token budget per day of tenant 't': 100" in info.value.message
    await lim.settle_soon(held, 50, 10)
    assert await lim.reserve(who, checks, labels, 20, seconds=10, cost=10) is not None
    await lim.aclose()


async def test_a_key_that_comes_with_another_budget_is_checked_against_it(limiter: Limiter) -> None:
    """A key changed without a reload (a virtual key's PATCH): the cached checks are not reused."""
    clock = Clock()
    lim = policy(limiter, clock)
    before = Principal("t", key_name="k1", budget=Budget(amount="1.00"))
    await spend(lim, before, 900_000)
    after = Principal("t", key_name="k1", budget=Budget(amount="0.50"))
    checks, labels = lim.checks(after)
    with pytest.raises(QuotaExceeded) as info:
        await lim.reserve(after, checks, labels, 0, seconds=10, cost=1)
    assert "this API key (k1): 0.50 USD" in info.value.message
    assert lim.checks(Principal("t", key_name="k1")) == ([], [])  # no budget any more
    await lim.aclose()


async def test_budget_use_reads_every_budget_without_charging(limiter: Limiter) -> None:
    clock = Clock()
    lim = policy(limiter, clock, budget={"amount": "2.00", "tokens": 5000, "period": "month"})
    who = Principal("t", key_name="k1", budget=Budget(amount="1.50", period={"seconds": 3600}))
    checks, labels = lim.checks(who)
    held = await lim.reserve(who, checks, labels, 300, seconds=10, cost=400_000)
    assert held is not None
    for _ in range(2):  # reading charges nothing
        use = await lim.budget_use(who)
        assert [(u.scope, u.unit, u.limit, u.used) for u in use] == [
            ("key", "micros", 1_500_000, 400_000),
            ("tenant", "tokens", 5000, 300),
            ("tenant", "micros", 2_000_000, 400_000),
        ]
    assert use[0].label == "budget per 3600 s of this API key (k1): 1.50 USD"
    assert use[0].resets_in_ms == 3_600_000  # the clock is on the hour
    await lim.settle_soon(held, 100, 123_456)
    tenant_only = await lim.budget_use(Principal("t"))
    assert [(u.scope, u.used) for u in tenant_only] == [("tenant", 100), ("tenant", 123_456)]
    assert await lim.budget_use(Principal("other")) == []
    await lim.aclose()
