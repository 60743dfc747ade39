"""What only a Redis Cluster or a Sentinel set shows: tenants whose slots sit on different masters
all work through one client seeded with one node, each tenant's keys stay on its slot's master,
scripts reload on every master, ping covers every master, and the settings that pick a mode."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis

from gateway.engine.store_health import StoreHealth
from gateway.kernel.errors import ServiceUnavailable
from gateway.kernel.settings import ConfigError, StateSettings, load_settings
from state.factory import create_ledger, create_limiter, create_store
from state.limits.base import Check, CheckKind
from state.limits.redis import RedisLimiter
from state.redis import RedisStore
from state.redis_usage import RedisLedger
from tests.redis_server import unique_prefix
from tests.redis_topology import (
    ClusterTopology,
    SentinelTopology,
    Target,
    cluster_target,
    sentinel_target,
    standalone_target,
)
from tests.state.conftest import make_response, pending_of, put_chain

RPM = Check(CheckKind.REQUESTS, "rpm", 2)


def tenants_per_master(
    cluster: ClusterTopology, store: RedisStore, per_master: int = 2
) -> dict[int, list[str]]:
    return cluster.tenants_per_master(store.key_prefix, per_master)


@pytest.fixture
def prefix(cluster: ClusterTopology) -> Iterator[str]:
    p = unique_prefix()
    yield p
    cluster_target(cluster).delete_prefix(p)


@pytest.fixture
async def cstore(cluster: ClusterTopology, prefix: str) -> AsyncIterator[RedisStore]:
    settings = StateSettings(**cluster_target(cluster).state(prefix))
    store = create_store(settings)
    assert isinstance(store, RedisStore)
    yield store
    await store.aclose()


async def test_tenants_on_every_master_store_and_read_through_one_seed(
    cluster: ClusterTopology, cstore: RedisStore
) -> None:
    spread = tenants_per_master(cluster, cstore)
    assert len(spread) == 3
    for port, tenants in spread.items():
        node = redis.Redis(port=port)
        try:
            for tenant in tenants:
                turns = await put_chain(cstore, 3, tenant=tenant)  # the put script walks ancestors
                assert await cstore.chain(tenant, turns[-1].id, 10) == turns
                items = [t.output_items[0]["id"] for t in turns]
                assert len(await cstore.get_items(tenant, items)) == 3
                # every key of the tenant is on its slot's master, and that master alone
                keys = node.keys(f"{cstore.key_prefix}:{{{tenant}}}:*")
                assert len(keys) == 3 * 3
                assert await cstore.delete(tenant, turns[0].id) is True
                assert await cstore.chain(tenant, turns[-1].id, 10) is None
                assert await cstore.get(tenant, turns[-1].id) == turns[-1]
        finally:
            node.close()
    assert await cstore.ping() is True


async def test_scripts_reload_on_every_master_after_a_flush(
    cluster: ClusterTopology, cstore: RedisStore
) -> None:
    spread = tenants_per_master(cluster, cstore, per_master=1)
    for tenants in spread.values():
        await put_chain(cstore, 1, tenant=tenants[0])
    for port in cluster.ports:
        node = redis.Redis(port=port)
        node.script_flush()
        node.close()
    for tenants in spread.values():  # NOSCRIPT on each master: EVAL, then cached there
        turns = await put_chain(cstore, 2, tenant=tenants[0])
        assert await cstore.chain(tenants[0], turns[-1].id, 10) == turns


async def test_limiter_and_ledger_count_per_tenant_on_every_master(
    cluster: ClusterTopology, cstore: RedisStore, prefix: str
) -> None:
    settings = StateSettings(**cluster_target(cluster).state(prefix))
    limiter = create_limiter(settings)
    ledger = create_ledger(settings, cstore)
    assert isinstance(limiter, RedisLimiter) and isinstance(ledger, RedisLedger)
    assert limiter.settle_nowait("t", [RPM], "r", 0, lambda ok: None) is False  # redis-py: awaited
    tenants = [names[0] for names in tenants_per_master(cluster, cstore, per_master=1).values()]
    try:
        for tenant in tenants:
            outs = [await limiter.admit(tenant, [RPM], f"r{i}", 0) for i in range(3)]
            assert [o.failed for o in outs] == [None, None, 0]
            counts = {"requests": 1, "input_tokens": len(tenant), "cost_micros": 1000 * len(tenant)}
            await ledger.add(tenant, "2026-12-01", "k", "m", counts)
        outs = await asyncio.gather(*(limiter.admit(t, [RPM], "x", 0) for t in tenants))
        assert all(o.failed == 0 for o in outs)  # concurrent, on three masters
        rows = await ledger.read(tenants, ["2026-12-01"])
        assert {r.tenant: r.counts["input_tokens"] for r in rows} == {t: len(t) for t in tenants}
        assert {r.tenant: r.counts["cost_micros"] for r in rows} == {t: 1000 * len(t) for t in tenants}
        for tenant in tenants:  # each tenant's counters on its own slot's master
            port = cluster.master_of(limiter.key(tenant, "rpm"))
            assert port == cluster.master_of(ledger.day_key(tenant, "2026-12-01"))
            node = redis.Redis(port=port)
            assert node.exists(limiter.key(tenant, "rpm"), ledger.day_key(tenant, "2026-12-01")) == 2
            node.close()
    finally:
        await limiter.aclose()


async def test_ping_needs_every_master(cluster: ClusterTopology, cstore: RedisStore) -> None:
    """A paused master (no replica to take over: within the node timeout the cluster refuses every
    query, CLUSTERDOWN) fails the ping and that master's tenants within the store's timeout; once
    it is back, the same client serves every tenant again."""
    spread = tenants_per_master(cluster, cstore, per_master=1)
    paused = cluster.ports[-1]
    assert await cstore.ping() is True
    cluster.pause(paused)
    try:
        for call in (cstore.ping, lambda: cstore.put(make_response(spread[paused][0]))):
            started = time.monotonic()
            try:
                assert await call() is False
            except ServiceUnavailable:
                pass
            assert time.monotonic() - started < 2.0 + 1.5  # the store's timeout, plus this VM's stalls
    finally:
        cluster.resume(paused)
    deadline = time.monotonic() + 20
    while not await cstore.ping():
        assert time.monotonic() < deadline, "the cluster did not come back"
        await asyncio.sleep(0.2)
    for tenants in spread.values():
        r = make_response(tenants[0])
        await _eventually(lambda r=r: cstore.put(r))
        assert await cstore.get(r.tenant, r.id) == r


# -- sentinel ---------------------------------------------------------------------------------------
async def test_sentinel_follows_a_failover_without_a_restart() -> None:
    """``SENTINEL FAILOVER`` swaps master and replica: the same store, limiter and ledger write to
    the new master, and what was stored before is still there (``wait_replicas``: the put was
    acknowledged once the replica had it)."""
    topo = SentinelTopology().start()
    target: Target = sentinel_target(topo)
    p = unique_prefix()
    settings = StateSettings(**target.state(p), wait_replicas=1)  # so what is acknowledged survives
    store = create_store(settings)
    limiter = create_limiter(settings)
    ledger = create_ledger(settings, store)
    assert isinstance(store, RedisStore)
    try:
        before = await put_chain(store, 2)
        await limiter.admit("t", [RPM], "a", 0)
        old = topo.current_master()
        sentinel = redis.Redis(port=topo.sentinel_ports[0])
        sentinel.execute_command("SENTINEL", "FAILOVER", topo.name)
        sentinel.close()
        deadline = time.monotonic() + 30
        # done when the old master is a replica: until then it still takes writes (and a write
        # that lands there is lost when it resyncs: asynchronous replication, see docs/state.md)
        while topo.current_master() == old or not _is_master(topo.current_master()) or _is_master(old):
            assert time.monotonic() < deadline, "no failover"
            await asyncio.sleep(0.1)
        after = await _eventually(lambda: put_chain(store, 1, text="after"))
        assert await store.chain("tenant-a", before[-1].id, 10) == before
        assert await store.get("tenant-a", after[0].id) == after[0]
        assert (await limiter.admit("t", [RPM], "b", 0)).used == [2]  # the counter moved with it
        await ledger.add("t", "2026-12-01", "k", "m", {"requests": 1})
        new = redis.Redis(port=topo.current_master())
        assert new.exists(store.response_key("tenant-a", after[0].id)) == 1
        new.close()
    finally:
        await store.aclose()
        await limiter.aclose()
        topo.stop()


async def test_wait_replicas_acknowledges_a_put_only_once_replicas_have_it(
    sentinel: SentinelTopology, redis_url: str
) -> None:
    target = sentinel_target(sentinel)
    p = unique_prefix()
    one = RedisStore(target.topology, key_prefix=p, ttl_seconds=60, timeout_seconds=2.0, wait_replicas=1)
    two = RedisStore(target.topology, key_prefix=p, ttl_seconds=60, timeout_seconds=2.0, wait_replicas=2)
    alone = RedisStore(redis_url, key_prefix=p, ttl_seconds=60, timeout_seconds=1.0, wait_replicas=1)
    replica = redis.Redis(
        port=sentinel.replica_port
        if sentinel.current_master() == sentinel.master_port
        else sentinel.master_port
    )
    try:
        master = target.client()
        master.script_flush()  # the first put goes through NOSCRIPT, then EVAL, then WAIT
        master.close()
        r = make_response()
        await one.put(r)
        assert replica.exists(one.response_key(r.tenant, r.id)) == 1  # already on the replica
        assert await one.get(r.tenant, r.id) == r
        await one.put(make_response(prev=r.id))
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable):
            await two.put(make_response())  # one replica only: WAIT gives up after 1 s
        assert time.monotonic() - started < 2.0 + 1.5
        with pytest.raises(ServiceUnavailable):
            await alone.put(make_response())
    finally:
        replica.close()
        for store in (one, two, alone):
            await store.aclose()
        target.delete_prefix(p)
        standalone_target(redis_url).delete_prefix(p)


async def test_sentinel_with_passwords_and_a_db() -> None:
    """The master's password and db come from redis_url, the sentinels' own from
    sentinel_password; a wrong one is a 503, never a message holding it."""
    topo = SentinelTopology(password="m4ster-pw", sentinel_password="s3ntinel-pw").start()
    target = sentinel_target(topo)
    p = unique_prefix()
    state = {**target.state(p), "redis_url": target.url.replace("/0", "/2")}
    store = create_store(StateSettings(**state))
    wrong = create_store(StateSettings(**{**state, "sentinel_password": "wrong-pw"}))
    limiter = create_limiter(StateSettings(**state))
    try:
        r = make_response()
        await store.put(r)
        assert await store.get(r.tenant, r.id) == r
        assert (await limiter.admit("t", [RPM], "a", 0)).failed is None
        db2 = redis.Redis(port=topo.current_master(), password="m4ster-pw", db=2)
        assert db2.exists(f"{p}:{{tenant-a}}:r:{r.id}") == 1
        db2.close()
        with pytest.raises(ServiceUnavailable) as info:
            await wrong.put(make_response())
        assert "pw" not in str(info.value)
    finally:
        for closing in (store, wrong, limiter):
            await closing.aclose()
        topo.stop()


def _wait_for(ready: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _is_master(port: int) -> bool:
    client = redis.Redis(port=port, socket_timeout=0.5)
    try:
        return client.info("replication").get("role") == "master"
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


async def _eventually(call: Any, seconds: float = 20.0) -> Any:
    """``call()`` once it stops failing with ServiceUnavailable (the failover settling)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return await call()
        except ServiceUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


# -- settings ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ({"redis_mode": "sentinel"}, ["state.redis_url:", "state.sentinels:", "state.sentinel_master:"]),
        (
            {"redis_mode": "cluster", "redis_url": "redis://10.0.0.5:6379/2"},
            ["state.redis_url: a Redis Cluster"],
        ),
        (
            {"redis_mode": "cluster", "redis_url": "redis://10.0.0.5:6379?db=1"},
            ["state.redis_url: a Redis Cluster"],
        ),
        (
            {"redis_mode": "cluster", "redis_url": "unix:///run/redis.sock"},
            ["state.redis_url: redis_mode cluster"],
        ),
        (
            {
                "redis_mode": "sentinel",
                "redis_url": "redis://m/0",
                "sentinels": ["a:1", "b"],
                "sentinel_master": "m",
            },
            ["state.sentinels.1: must be host:port"],
        ),
        ({"redis_url": "redis://h/0", "sentinel_master": "m"}, ["state.sentinel_master: is only used"]),
        ({"redis_mode": "replicated"}, ["state.redis_mode"]),
        ({"redis_mode": "cluster", "redis_url": "redis://h/0", "wait_replicas": 1}, ["state.wait_replicas:"]),
        ({"wait_replicas": 1}, ["state.wait_replicas: needs a redis_url"]),
    ],
)
def test_bad_topology_settings_name_the_field(state: dict[str, Any], expected: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(state={"redis_url": None, **state} if "redis_url" not in state else state)
    for text in expected:
        assert text in str(info.value)
    assert "10.0.0.5" not in str(info.value)  # a URL may hold a password: never repeated


def test_good_topology_settings() -> None:
    cluster = load_settings(
        state={"redis_mode": "cluster", "redis_url": "rediss://:pw@10.0.0.5:6379/0"}
    ).state
    assert cluster.redis_mode == "cluster"
    sentinel = load_settings(
        state={
            "redis_mode": "sentinel",
            "redis_url": "redis://:pw@mymaster/1",
            "sentinels": ["10.0.0.7:26379", "[::1]:26380"],
            "sentinel_master": "mymaster",
        }
    ).state
    assert sentinel.sentinels == ["10.0.0.7:26379", "[::1]:26380"]


async def test_store_health_checks_every_mode(target: Target, key_prefix: str) -> None:
    store = create_store(StateSettings(**target.state(key_prefix)))
    try:
        health = StoreHealth(store, recheck_seconds=0.01)
        r = make_response()
        await health.reserve(pending_of(r), 1)  # the write-ahead record: no ServiceUnavailable
        await store.put(r)
        assert await store.get(r.tenant, r.id) == r
        health.report(False)
        with pytest.raises(ServiceUnavailable):
            await health.require()  # known down: refused without a call
        await asyncio.sleep(0.02)
        await health.require()  # past the recheck: the ping answered
        await health.reserve(pending_of(make_response()), 1)
    finally:
        await store.aclose()


async def test_cluster_follows_a_replica_taking_over_a_frozen_master(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """3 masters with a replica each: a master frozen (SIGSTOP) costs its tenants fast 503s until
    Redis promotes its replica (cluster-node-timeout 2 s), then the same client writes there."""
    topo = ClusterTopology(masters=3, replicas=1).start()
    store = RedisStore(cluster_target(topo).topology, key_prefix="cf", ttl_seconds=60, timeout_seconds=1.0)
    try:
        spread = topo.tenants_per_master("cf")
        frozen = next(iter(spread))
        tenant = spread[frozen][0]
        before = make_response(tenant)
        await store.put(before)
        key = store.response_key(tenant, before.id)
        _wait_for(lambda: topo.replicated(frozen, key))  # asynchronous: not yet at the ack
        topo_replicas = topo.replicas_of(frozen)
        topo.pause(frozen)
        started = time.monotonic()
        failed: list[float] = []
        worst = 0.0
        while True:
            t = time.monotonic()
            try:
                after = make_response(tenant)
                await store.put(after)
                break
            except ServiceUnavailable:
                failed.append(time.monotonic() - started)
                worst = max(worst, time.monotonic() - t)
            assert time.monotonic() - started < 30, "no replica took over"
            await asyncio.sleep(0.05)
        healthy = next(port for port in spread if port != frozen)
        # the promoted replica serves the slot (the other masters learn it by gossip, soon)
        _wait_for(lambda: topo.master_of(key, ask=healthy) in topo_replicas)
        assert await store.get(tenant, after.id) == after
        assert await store.get(tenant, before.id) == before  # it was replicated before the freeze
        for tenants in spread.values():  # every tenant works again, through the same client
            r = make_response(tenants[0])
            await _eventually(lambda r=r: store.put(r))
            assert await store.get(r.tenant, r.id) == r
        with capsys.disabled():
            print(
                f"\ncluster failover (SIGSTOP a master, node timeout 2 s, timeout_seconds 1.0): "
                f"{len(failed)} puts failed with 503 over {failed[-1] if failed else 0:.2f} s, "
                f"slowest {worst:.2f} s"
            )
        assert worst < 1.0 + 1.5
    finally:
        await store.aclose()
        topo.stop()
