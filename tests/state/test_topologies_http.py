"""The gateway under uvicorn with ``redis_mode: cluster`` (tenants whose slots sit on different
masters all store, continue and read back) and ``redis_mode: sentinel`` (store: true traffic
while the master freezes: fast 503s, then success on the promoted replica, no restart)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.harness import ServedApp, serve_gateway
from tests.redis_server import unique_prefix
from tests.redis_topology import ClusterTopology, SentinelTopology, cluster_target, sentinel_target


async def create(
    c: httpx.AsyncClient, key: str | None, body: dict[str, Any], status: int = 200
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = await c.post("/v1/responses", headers=headers, json={"model": "mock", **body})
    assert r.status_code == status, r.text
    return r.json()


async def test_tenants_on_every_master_store_continue_and_read(cluster: ClusterTopology) -> None:
    prefix = unique_prefix()
    spread = cluster.tenants_per_master(prefix)
    tenants = [names[0] for names in spread.values()]
    assert len(tenants) == 3
    cfg = {
        "auth": {"api_keys": [{"key": f"sk-{t}", "tenant": t} for t in tenants]},
        "state": cluster_target(cluster).state(prefix),
        # the limiter's counters in the cluster too, each tenant's on its own master
        "tenants": {t: {"limits": {"requests_per_minute": 4}} for t in tenants},
    }
    try:
        with serve_gateway(cfg) as s:
            async with httpx.AsyncClient(base_url=s.base_url, timeout=30) as c:
                for tenant in tenants:
                    key = f"sk-{tenant}"
                    auth = {"Authorization": f"Bearer {key}"}
                    first = await create(c, key, {"input": f"I am {tenant}", "store": True})
                    second = await create(c, key, {"input": "again", "previous_response_id": first["id"]})
                    assert second["previous_response_id"] == first["id"]
                    streamed = await c.post(
                        "/v1/responses",
                        headers=auth,
                        json={
                            "model": "mock",
                            "input": "more",
                            "previous_response_id": second["id"],
                            "stream": True,
                        },
                    )
                    assert streamed.status_code == 200 and "response.completed" in streamed.text
                    got = await c.get(f"/v1/responses/{second['id']}", headers=auth)
                    assert got.status_code == 200 and got.json() == second
                    items = await c.get(f"/v1/responses/{first['id']}/input_items", headers=auth)
                    assert items.json()["data"][0]["content"][0]["text"] == f"I am {tenant}"
                    other = f"sk-{next(t for t in tenants if t != tenant)}"
                    foreign = await c.get(
                        f"/v1/responses/{first['id']}", headers={"Authorization": f"Bearer {other}"}
                    )
                    assert foreign.status_code == 404
                    # three turns admitted (and counted) so far: one left, then a refusal
                    last = await c.post("/v1/responses", headers=auth, json={"model": "mock", "input": "4th"})
                    assert last.status_code == 200 and last.headers["x-ratelimit-remaining-requests"] == "0"
                    refused = await c.post(
                        "/v1/responses", headers=auth, json={"model": "mock", "input": "5th"}
                    )
                    assert refused.status_code == 429
                ready = await c.get("/readyz")  # the store's ping: every master answers
                assert ready.status_code == 200 and ready.json()["checks"]["state_store"] is True
    finally:
        cluster_target(cluster).delete_prefix(prefix)


# -- sentinel failover under traffic ---------------------------------------------------------------
TIMEOUT = 1.0  # state.timeout_seconds


@dataclass
class Sample:
    started: float  # monotonic, relative to the master's freeze
    seconds: float
    status: int
    rid: str | None


async def _traffic(s: ServedApp, t0: float, stop: asyncio.Event, out: list[Sample]) -> None:
    async with httpx.AsyncClient(base_url=s.base_url, timeout=60) as c:
        while not stop.is_set():
            started = time.monotonic()
            r = await c.post("/v1/responses", json={"model": "mock", "input": "tick", "store": True})
            rid = r.json().get("id") if r.status_code == 200 else None
            out.append(Sample(started - t0, time.monotonic() - started, r.status_code, rid))
            await asyncio.sleep(0.02)


async def test_a_frozen_master_is_fast_503s_then_the_promoted_replica(
    capsys: pytest.CaptureFixture[str],
) -> None:
    topo = SentinelTopology(down_after_ms=1000).start()
    prefix = unique_prefix()
    cfg = {"state": {**sentinel_target(topo).state(prefix), "timeout_seconds": TIMEOUT}}
    samples: list[Sample] = []
    try:
        with serve_gateway(cfg) as s:
            stop = asyncio.Event()
            t0 = time.monotonic() + 1.0  # a second of normal traffic first
            workers = [asyncio.create_task(_traffic(s, t0, stop, samples)) for _ in range(2)]
            await asyncio.sleep(1.0)
            old = topo.current_master()
            topo.pause(old)  # SIGSTOP: connections stay open, nothing ever answers
            deadline = time.monotonic() + 45
            while True:  # until 20 successes in a row after the freeze
                await asyncio.sleep(0.2)
                after = [x for x in samples if x.started > 0]
                tail = after[-20:]
                if (
                    len(tail) == 20
                    and all(x.status == 200 for x in tail)
                    and any(x.status != 200 for x in after)
                ):
                    break
                assert time.monotonic() < deadline, f"no recovery: {[x.status for x in after[-30:]]}"
            stop.set()
            await asyncio.gather(*workers)
            assert topo.current_master() != old
            # stored on the new master: readable and continuable, by the same gateway
            last = next(x.rid for x in reversed(samples) if x.rid)
            async with httpx.AsyncClient(base_url=s.base_url, timeout=30) as c:
                assert (await c.get(f"/v1/responses/{last}")).status_code == 200
                await create(c, None, {"input": "next", "previous_response_id": last})
    finally:
        topo.stop()
    before = [x for x in samples if x.started <= 0]
    failed = [x for x in samples if x.status != 200]
    assert before and all(x.status == 200 for x in before)
    assert failed and {x.status for x in failed} == {503}
    first_fail, last_fail = min(x.started for x in failed), max(x.started + x.seconds for x in failed)
    worst = max(x.seconds for x in failed)
    slowest_ok = max(x.seconds for x in samples if x.status == 200)
    with capsys.disabled():
        print(
            f"\nsentinel failover (SIGSTOP master, down-after 1000 ms, timeout_seconds {TIMEOUT}): "
            f"{len(samples)} requests, {len(failed)} failed with 503 between {first_fail:.2f} s and "
            f"{last_fail:.2f} s after the freeze (failing for {last_fail - max(0.0, first_fail):.2f} s); "
            f"slowest 503 {worst:.2f} s, slowest 200 {slowest_ok:.2f} s"
        )
    # a failing request gives up within the store's timeout (a health probe or a put; the usage
    # count after a failed put does not wait again), with room for this 2-core VM's stalls
    assert worst < TIMEOUT + 1.5
    assert last_fail < 30
