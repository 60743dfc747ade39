"""The limits policy in Gateway.prepare: a lease taken is released on every path."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from structlog.testing import capture_logs

from gateway.engine.auth import Principal
from gateway.engine.limits import TenantLimiter
from gateway.engine.orchestrator import Gateway
from gateway.engine.routing import Router
from gateway.engine.validate import create_request
from gateway.kernel.errors import RateLimited, ServiceUnavailable
from gateway.kernel.settings import Settings
from state.limits.memory import MemoryLimiter
from state.memory import MemoryStore


def gateway() -> Gateway:
    s = Settings(tenants={"t": {"limits": {"concurrent_requests": 1}}})
    return Gateway(s, router=Router(s), store=MemoryStore(max_entries=10, max_bytes=10**6, ttl_seconds=60))


def body() -> Any:
    return create_request({"model": "mock", "input": "hi", "store": False}, Settings().limits)


async def test_a_prepare_failing_after_admission_releases_its_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    gw = gateway()
    who = Principal(tenant="t")

    def broken(*a: Any, **k: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(gw, "_turn", broken)
    for _ in range(3):
        with pytest.raises(RuntimeError):
            await gw.prepare(body(), who)
    monkeypatch.undo()
    turn = await gw.prepare(body(), who)  # the lease is free
    with pytest.raises(RateLimited) as info:  # ... and now held
        await gw.prepare(body(), who)
    assert "concurrent requests of tenant 't': 1" in info.value.message
    await turn.run()
    await (await gw.prepare(body(), who)).run()  # released at the end of the turn
    await gw.aclose()


class _Down:
    """A limiter that fails while ``down`` is set."""

    remote = True

    def __init__(self) -> None:
        self.down = True
        self.inner = MemoryLimiter()

    async def admit(self, *a: Any) -> Any:
        if self.down:
            raise ServiceUnavailable("limiter unavailable")
        return await self.inner.admit(*a)

    async def settle(self, *a: Any) -> None:
        if self.down:
            raise ServiceUnavailable("limiter unavailable")
        await self.inner.settle(*a)

    async def release(self, *a: Any) -> None:
        if self.down:
            raise ServiceUnavailable("limiter unavailable")
        await self.inner.release(*a)

    def settle_nowait(self, *a: Any) -> bool:
        return False

    async def aclose(self) -> None:
        return None


@pytest.mark.parametrize("mode", ["allow", "deny"])
async def test_an_outage_is_logged_once_and_counted(mode: str) -> None:
    s = Settings(tenants={"t": {"limits": {"requests_per_minute": 5}}}, limits={"on_limiter_error": mode})
    down = _Down()
    lim = TenantLimiter(s, down)
    who = Principal(tenant="t")
    checks, labels = lim.checks(who)
    with capture_logs() as logs:
        for _ in range(3):
            if mode == "allow":
                assert await lim.reserve(who, checks, labels, 0, seconds=1) is None  # served unlimited
            else:
                with pytest.raises(ServiceUnavailable):
                    await lim.reserve(who, checks, labels, 0, seconds=1)
        down.down = False
        held = await lim.reserve(who, checks, labels, 0, seconds=1)
        assert held is not None
        await lim.settle_soon(held, 0)
        await lim.aclose()
    events = [e["event"] for e in logs]
    assert events == ["limiter_unavailable", "limiter_available"]
    assert lim.errors == 3


def test_two_keys_of_a_tenant_may_not_share_a_name() -> None:
    from gateway.kernel.settings import ConfigError, load_settings

    keys = [{"key": "k1", "tenant": "t", "name": "ci"}, {"key": "k2", "tenant": "t", "name": "ci"}]
    with pytest.raises(ConfigError, match=r"auth\.api_keys\.1\.name: the same name as auth\.api_keys\.0"):
        load_settings(auth={"api_keys": keys})
    keys[1]["tenant"] = "u"
    assert load_settings(auth={"api_keys": keys}).auth.api_keys is not None


class _InFlight(MemoryLimiter):
    """A remote-like limiter whose admissions, once sent, run when ``land`` is set, whether or
    not their caller is still waiting (a command already written to a frozen Redis)."""

    remote = True

    def __init__(self) -> None:
        super().__init__()
        self.land = asyncio.Event()
        self.sent: list[asyncio.Task[Any]] = []
        self.settles_failing = 0

    async def admit(self, *a: Any, **k: Any) -> Any:
        async def run() -> Any:
            await self.land.wait()
            return await MemoryLimiter.admit(self, *a, **k)

        task = asyncio.ensure_future(run())
        self.sent.append(task)
        return await asyncio.shield(task)

    async def settle(self, *a: Any) -> None:
        if self.settles_failing:
            self.settles_failing -= 1
            raise ServiceUnavailable("limiter unavailable")
        await MemoryLimiter.settle(self, *a)


LIMITED = Settings(tenants={"t": {"limits": {"concurrent_requests": 1, "requests_per_minute": 5}}})


async def test_a_caller_cancelled_mid_admission_leaves_no_charge() -> None:
    """The caller goes away while its admission is in flight; the release (sent at once, in the
    background) runs before the admission lands: the late admission charges nothing."""
    lim = _InFlight()
    policy = TenantLimiter(LIMITED, lim)
    who = Principal(tenant="t")
    checks, labels = policy.checks(who)
    caller = asyncio.ensure_future(policy.reserve(who, checks, labels, 0, seconds=1))
    await asyncio.sleep(0.01)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.sleep(0.01)  # the release has run: a tombstone
    lim.land.set()
    with pytest.raises(ServiceUnavailable):  # void
        await lim.sent[0]
    for n in range(5):  # all five requests a minute, and the one lease, are free
        held = await policy.reserve(who, checks, labels, 0, seconds=1)
        assert held is not None and held.standing is not None
        assert held.standing.requests is not None and held.standing.requests.remaining == 4 - n
        await policy.settle_soon(held, 0)
    await policy.aclose()


async def test_a_failed_settlement_is_sent_again_until_it_lands() -> None:
    lim = _InFlight()
    lim.land.set()
    lim.settles_failing = 3
    policy = TenantLimiter(LIMITED, lim)
    who = Principal(tenant="t")
    checks, labels = policy.checks(who)
    held = await policy.reserve(who, checks, labels, 0, seconds=1)
    assert held is not None
    await policy.settle_soon(held, 0)  # does not wait: the retries run in the background
    with pytest.raises(RateLimited):
        await policy.reserve(who, checks, labels, 0, seconds=1)  # the lease is still held
    for _ in range(100):
        if not lim.settles_failing and not policy._pending:
            break
        await asyncio.sleep(0.05)
    again = await policy.reserve(who, checks, labels, 0, seconds=1)  # released by the fourth try
    assert again is not None
    await policy.settle_soon(again, 0)
    await policy.aclose()
