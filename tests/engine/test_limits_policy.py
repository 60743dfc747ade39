"""The limits policy in Gateway.prepare: a lease taken is released on every path."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.engine.auth import Principal
from gateway.engine.orchestrator import Gateway
from gateway.engine.routing import Router
from gateway.engine.validate import create_request
from gateway.kernel.errors import RateLimited
from gateway.kernel.settings import Settings
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
