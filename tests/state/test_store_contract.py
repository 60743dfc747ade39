"""One contract for every ResponseStore (memory, and real Redis standalone, Cluster and Sentinel),
then what only one of them promises: the memory store's bounds, Redis's key layout and round trips
(in every mode), failure and recovery (standalone).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr
from redis.asyncio.connection import AbstractConnection

from gateway.kernel.errors import InvalidRequest, ServiceUnavailable
from gateway.kernel.settings import StateSettings
from state import codec, redis_lean
from state.base import ResponseStore
from state.factory import create_store
from state.memory import MemoryStore
from state.redis import CHAIN, RedisStore
from tests.redis_server import RedisServer, free_port
from tests.redis_topology import Target
from tests.state.conftest import StoreFactory, make_response, pending_of, put_chain

# -- the contract ---------------------------------------------------------------------------


async def test_put_get_round_trip(store: ResponseStore) -> None:
    r = make_response()
    await store.put(r)
    got = await store.get(r.tenant, r.id)
    assert got == r
    assert got is not r


async def test_stored_data_is_isolated_from_callers(store: ResponseStore) -> None:
    r = make_response(text="original")
    await store.put(r)
    r.input_items[0]["content"][0]["text"] = "mutated after put"
    got = await store.get(r.tenant, r.id)
    assert got is not None
    assert got.input_items[0]["content"][0]["text"] == "in: original"
    got.resource["output"].clear()
    again = await store.get(r.tenant, r.id)
    assert again is not None and len(again.output_items) == 1


async def test_unknown_id_is_none(store: ResponseStore) -> None:
    assert await store.get("tenant-a", "resp_does_not_exist") is None
    assert await store.chain("tenant-a", "resp_does_not_exist", 10) is None
    assert await store.delete("tenant-a", "resp_does_not_exist") is False


async def test_put_overwrites_same_id(store: ResponseStore) -> None:
    r = make_response(text="v1")
    await store.put(r)
    r2 = make_response(text="v2", response_id=r.id)
    await store.put(r2)
    assert await store.get(r.tenant, r.id) == r2


@pytest.mark.parametrize("other", ["tenant-b", "tenant-a ", "TENANT-A", "tenant-a}:r:"])
async def test_tenant_isolation(store: ResponseStore, other: str) -> None:
    chain = await put_chain(store, 2, tenant="tenant-a")
    newest = chain[-1]
    items = [newest.input_items[0]["id"], newest.output_items[0]["id"]]
    assert await store.get(other, newest.id) is None
    assert await store.chain(other, newest.id, 10) is None
    assert await store.get_items(other, items) == {}
    assert await store.delete(other, newest.id) is False
    # the owner still sees everything, the foreign delete touched nothing
    assert await store.get("tenant-a", newest.id) == newest
    assert len(await store.get_items("tenant-a", items)) == 2


async def test_unusual_tenant_names_work(store: ResponseStore) -> None:
    for tenant in ["a:b", "{x}", "100%", "ümlaut tenant", "*?[]"]:
        r = make_response(tenant)
        await store.put(r)
        assert await store.get(tenant, r.id) == r
        assert await store.chain(tenant, r.id, 5) == [r]


async def test_chain_is_oldest_first(store: ResponseStore) -> None:
    turns = await put_chain(store, 5)
    got = await store.chain("tenant-a", turns[-1].id, 100)
    assert got == turns
    assert await store.chain("tenant-a", turns[0].id, 100) == turns[:1]
    assert await store.chain("tenant-a", turns[2].id, 100) == turns[:3]


async def test_chain_with_missing_ancestor_is_none(store: ResponseStore) -> None:
    orphan = make_response(prev="resp_never_stored")
    await store.put(orphan)
    assert await store.get(orphan.tenant, orphan.id) == orphan
    assert await store.chain(orphan.tenant, orphan.id, 10) is None

    turns = await put_chain(store, 4)
    assert await store.delete("tenant-a", turns[1].id) is True
    assert await store.chain("tenant-a", turns[-1].id, 10) is None
    assert await store.chain("tenant-a", turns[0].id, 10) == turns[:1]


async def test_chain_deeper_than_max_depth_is_invalid(store: ResponseStore) -> None:
    turns = await put_chain(store, 6)
    assert await store.chain("tenant-a", turns[-1].id, 6) == turns
    with pytest.raises(InvalidRequest) as info:
        await store.chain("tenant-a", turns[-1].id, 5)
    assert info.value.status == 400
    with pytest.raises(InvalidRequest):
        await store.chain("tenant-a", turns[-1].id, 1)
    assert await store.chain("tenant-a", turns[0].id, 1) == turns[:1]


async def test_ttl_expiry(make_store: StoreFactory) -> None:
    store = await make_store(ttl_seconds=1)
    turns = await put_chain(store, 2)
    items = [turns[0].input_items[0]["id"], turns[1].output_items[0]["id"]]
    assert await store.get("tenant-a", turns[1].id) == turns[1]
    assert len(await store.get_items("tenant-a", items)) == 2
    await asyncio.sleep(1.3)
    assert await store.get("tenant-a", turns[1].id) is None
    assert await store.chain("tenant-a", turns[1].id, 10) is None
    assert await store.get_items("tenant-a", items) == {}
    assert await store.delete("tenant-a", turns[0].id) is False


async def _sleep_until(deadline: float) -> None:
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))


async def test_storing_a_continuation_extends_the_chain_to_its_ttl(make_store: StoreFactory) -> None:
    """A chain lives as long as its newest member: storing turn 2 extends turn 1 (and turn 1's
    item-index entries) to turn 2's TTL, so turn 2 can still be continued after turn 1's own TTL."""
    ttl = 3
    store = await make_store(ttl_seconds=ttl)
    first = make_response(text="turn 1")
    await store.put(first)
    first_expires_by = time.monotonic() + ttl  # turn 1's own TTL ends no later than this
    await asyncio.sleep(1.5)
    second_expires_after = time.monotonic() + ttl  # turn 2's TTL ends no earlier than this
    second = make_response(prev=first.id, text="turn 2")
    await store.put(second)
    # 0.5 s past turn 1's own expiry, ~1 s before turn 2's: room for this VM's stalls either side
    await _sleep_until(first_expires_by + 0.5)
    assert await store.chain("tenant-a", second.id, 10) == [first, second]
    assert await store.get("tenant-a", first.id) == first
    items = [first.input_items[0]["id"], first.output_items[0]["id"]]
    assert len(await store.get_items("tenant-a", items)) == 2
    assert time.monotonic() < second_expires_after, "stalled past turn 2's TTL: inconclusive"


async def test_reads_do_not_extend_the_ttl(make_store: StoreFactory) -> None:
    ttl = 2
    store = await make_store(ttl_seconds=ttl)
    turns = await put_chain(store, 2)
    expires_by = time.monotonic() + ttl
    items = [turns[0].input_items[0]["id"], turns[1].output_items[0]["id"]]
    await asyncio.sleep(1.0)  # reads well inside the TTL; extending from here would outlive expires_by
    assert await store.get("tenant-a", turns[0].id) == turns[0]
    assert await store.get("tenant-a", turns[1].id) == turns[1]
    assert await store.chain("tenant-a", turns[1].id, 10) == turns
    assert len(await store.get_items("tenant-a", items)) == 2
    await _sleep_until(expires_by + 0.5)
    assert await store.get("tenant-a", turns[0].id) is None
    assert await store.get("tenant-a", turns[1].id) is None
    assert await store.chain("tenant-a", turns[1].id, 10) is None
    assert await store.get_items("tenant-a", items) == {}


async def test_a_write_ahead_record_is_invisible_to_every_read(store: ResponseStore) -> None:
    """Until its response is stored, an id with only a write-ahead record is unknown: to get,
    chain (a continuation of it is not found either), get_items and delete."""
    r = make_response()
    await store.reserve(pending_of(r), 60)
    assert await store.get(r.tenant, r.id) is None
    assert await store.chain(r.tenant, r.id, 10) is None
    assert await store.get_items(r.tenant, codec.item_ids(r)) == {}
    assert await store.delete(r.tenant, r.id) is False
    child = make_response(prev=r.id)
    await store.put(child)
    assert await store.chain(child.tenant, child.id, 10) is None
    await store.put(r)  # the response replaces its record
    assert await store.get(r.tenant, r.id) == r
    assert await store.chain(child.tenant, child.id, 10) == [r, child]
    assert await store.delete(r.tenant, r.id) is True


async def test_a_put_replaces_the_write_ahead_record_and_its_ttl(make_store: StoreFactory) -> None:
    """The stored response has the store's TTL, not its record's shorter one; a record written
    for an id already stored (never, with fresh ids) leaves that response as it was."""
    store = await make_store(ttl_seconds=60)
    r, kept = make_response(), make_response()
    await store.reserve(pending_of(r), 1)
    await store.put(r)
    await store.put(kept)
    await store.reserve(pending_of(kept), 1)
    await asyncio.sleep(1.3)
    assert await store.get(r.tenant, r.id) == r
    assert await store.get(kept.tenant, kept.id) == kept


async def test_release_leaves_a_stored_response_alone(store: ResponseStore) -> None:
    r = make_response()
    await store.reserve(pending_of(r), 60)
    await store.put(r)
    await store.release(r.tenant, r.id)
    assert await store.get(r.tenant, r.id) == r
    await store.release(r.tenant, "resp_never_reserved")  # nothing to drop: no error
    other = make_response()
    await store.reserve(pending_of(other), 60)
    await store.release(other.tenant, other.id)
    assert await store.get(other.tenant, other.id) is None


async def test_delete(store: ResponseStore) -> None:
    turns = await put_chain(store, 2)
    victim = turns[0]
    items = [victim.input_items[0]["id"], victim.output_items[0]["id"]]
    assert len(await store.get_items("tenant-a", items)) == 2
    assert await store.delete("tenant-a", victim.id) is True
    assert await store.get("tenant-a", victim.id) is None
    assert await store.delete("tenant-a", victim.id) is False
    assert await store.get_items("tenant-a", items) == {}
    assert await store.get("tenant-a", turns[1].id) == turns[1]


async def test_get_items_from_input_and_output(store: ResponseStore) -> None:
    a, b = await put_chain(store, 2)
    in_a, out_a = a.input_items[0], a.output_items[0]
    out_b = b.output_items[0]
    got = await store.get_items("tenant-a", [in_a["id"], out_a["id"], out_b["id"], "msg_missing"])
    assert got == {in_a["id"]: in_a, out_a["id"]: out_a, out_b["id"]: out_b}
    assert await store.get_items("tenant-a", []) == {}
    assert await store.get_items("tenant-a", ["msg_missing"]) == {}


async def test_get_items_survives_deleting_an_older_user_of_the_item_id(store: ResponseStore) -> None:
    first = make_response()
    second = make_response()
    shared = first.input_items[0]
    second.input_items.append(shared)  # a client re-sent the item with its id
    await store.put(first)
    await store.put(second)
    assert await store.delete("tenant-a", first.id) is True
    assert await store.get_items("tenant-a", [shared["id"]]) == {shared["id"]: shared}


# -- codec ----------------------------------------------------------------------------------


def test_codec_round_trip_and_unknown_version_is_missing() -> None:
    r = make_response()
    blob = codec.encode(r)
    assert blob[0] == codec.VERSION
    assert codec.decode(blob) == r
    assert codec.decode(bytes([codec.VERSION + 1]) + blob[1:]) is None
    assert codec.decode(blob[:-3]) is None
    assert codec.decode(b"") is None
    assert codec.decode(None) is None


# -- memory bounds --------------------------------------------------------------------------


def _same_size(n: int) -> list[Any]:
    return [make_response(text="payload") for _ in range(n)]


async def test_memory_evicts_lru_by_entries() -> None:
    store = MemoryStore(max_entries=3, max_bytes=10**9, ttl_seconds=60)
    r1, r2, r3, r4 = _same_size(4)
    for r in (r1, r2, r3):
        await store.put(r)
    assert await store.get("tenant-a", r1.id) == r1  # r1 is now the most recently used
    await store.put(r4)
    assert len(store) == 3
    assert await store.get("tenant-a", r2.id) is None
    for r in (r1, r3, r4):
        assert await store.get("tenant-a", r.id) == r
    # the evicted response's items left the index too
    assert await store.get_items("tenant-a", [r2.input_items[0]["id"]]) == {}
    assert all(rid != r2.id for rid in store._items.values())


async def test_memory_evicts_lru_by_bytes() -> None:
    rs = _same_size(5)
    size = len(codec.encode(rs[0]))
    assert all(len(codec.encode(r)) == size for r in rs)
    store = MemoryStore(max_entries=1000, max_bytes=3 * size + size // 2, ttl_seconds=60)
    for r in rs[:3]:
        await store.put(r)
    assert store.total_bytes == 3 * size
    await store.chain("tenant-a", rs[0].id, 5)  # a read counts as a use
    await store.put(rs[3])
    assert store.total_bytes == 3 * size <= store.max_bytes
    assert await store.get("tenant-a", rs[1].id) is None
    assert await store.get("tenant-a", rs[0].id) == rs[0]
    await store.delete("tenant-a", rs[0].id)
    assert store.total_bytes == 2 * size


async def test_memory_drops_a_response_larger_than_the_whole_budget() -> None:
    small = make_response()
    store = MemoryStore(max_entries=10, max_bytes=len(codec.encode(small)) + 100, ttl_seconds=60)
    await store.put(small)
    big = make_response(text="x" * 10_000)
    await store.put(big)
    assert await store.get("tenant-a", big.id) is None
    assert await store.get("tenant-a", small.id) == small


async def test_memory_write_ahead_records_take_no_room_and_expire() -> None:
    now = [1000.0]
    store = MemoryStore(max_entries=1, ttl_seconds=60, clock=lambda: now[0])
    stored, waiting = make_response(), make_response()
    await store.put(stored)
    await store.reserve(pending_of(waiting), 10)
    assert store.pending(waiting.tenant, waiting.id)
    assert len(store) == 1 and await store.get(stored.tenant, stored.id) == stored  # not evicted
    now[0] += 10.1
    assert not store.pending(waiting.tenant, waiting.id)
    fresh = make_response()
    await store.reserve(pending_of(fresh), 10)  # sweeps the expired record left in front
    assert list(store._pending) == [(fresh.tenant, fresh.id)]
    await store.put(fresh)
    assert not store.pending(fresh.tenant, fresh.id) and not store._pending


async def test_memory_ttl_uses_the_injected_monotonic_clock() -> None:
    now = [1000.0]
    store = MemoryStore(ttl_seconds=10, clock=lambda: now[0])
    r = make_response()
    await store.put(r)
    now[0] += 9.9
    assert await store.get("tenant-a", r.id) == r
    now[0] += 0.2
    assert await store.get("tenant-a", r.id) is None
    assert len(store) == 0 and store.total_bytes == 0 and not store._items


async def test_memory_put_extends_ancestors_on_the_injected_clock() -> None:
    now = [1000.0]
    store = MemoryStore(ttl_seconds=10, max_chain_depth=3, clock=lambda: now[0])
    turns = await put_chain(store, 4)  # all expire at 1010
    keep = store._entries[("tenant-a", turns[0].id)]
    keep.expires = 2000.0  # a longer expiry is never shortened
    now[0] += 6
    child = make_response(prev=turns[-1].id)
    await store.put(child)  # expires at 1016; extends 3 ancestors (max_chain_depth), not turns[0]
    assert [store._entries[("tenant-a", t.id)].expires for t in turns] == [2000.0, 1016, 1016, 1016]
    now[0] += 9.9
    assert await store.chain("tenant-a", child.id, 10) == [*turns, child]
    now[0] += 0.2  # the chain lives as long as its newest member, no longer
    assert await store.get("tenant-a", child.id) is None
    for t in turns[1:]:
        assert await store.get("tenant-a", t.id) is None
    assert await store.get("tenant-a", turns[0].id) == turns[0]


def test_factory_passes_the_chain_depth(redis_url: str) -> None:
    for settings in (
        StateSettings(max_chain_depth=7),
        StateSettings(redis_url=SecretStr(redis_url), max_chain_depth=7),
    ):
        store = create_store(settings)
        assert isinstance(store, MemoryStore | RedisStore) and store.max_chain_depth == 7


def test_factory_picks_the_backend(redis_url: str) -> None:
    assert isinstance(create_store(StateSettings()), MemoryStore)
    store = create_store(StateSettings(redis_url=SecretStr(redis_url), timeout_seconds=0.5))
    assert isinstance(store, RedisStore)
    assert store.timeout == 0.5


# -- Redis specifics ------------------------------------------------------------------------


@pytest.fixture
async def rstore(target: Target, key_prefix: str) -> AsyncIterator[RedisStore]:
    """A Redis store in each mode (standalone, cluster, sentinel)."""
    store = RedisStore(target.topology, key_prefix=key_prefix, ttl_seconds=60, timeout_seconds=2.0)
    yield store
    await store.aclose()


@pytest.fixture
async def raw(target: Target) -> AsyncIterator[aioredis.Redis]:
    """A plain client of the same Redis (a RedisCluster in cluster mode: every call routed)."""
    client = target.async_client()
    yield client
    await client.aclose()


async def test_redis_every_key_has_the_tenant_and_a_ttl(rstore: RedisStore, raw: aioredis.Redis) -> None:
    turns = await put_chain(rstore, 2, tenant="acme corp")
    keys = [k.decode() async for k in raw.scan_iter(match=f"{rstore.key_prefix}:{{acme%20corp}}:*")]
    assert len(keys) == 2 * 3  # two responses, each with one input and one output item
    assert rstore.response_key("acme corp", turns[0].id) in keys
    for key in keys:
        assert 0 < await raw.pttl(key) <= 60_000


async def test_redis_chain_bytes_grow_linearly(rstore: RedisStore, raw: aioredis.Redis) -> None:
    async def footprint(n: int) -> tuple[int, list[int]]:
        turns = await put_chain(rstore, n, text="t" * 200)
        keys = [rstore.response_key("tenant-a", t.id) for t in turns]
        usage = [await raw.memory_usage(k, samples=0) or 0 for k in keys]
        blobs = [await raw.hstrlen(k, "blob") for k in keys]
        assert sum(blobs) == sum(len(codec.encode(t)) for t in turns)
        return sum(usage), blobs

    total_10, _ = await footprint(10)
    total_40, blobs_40 = await footprint(40)
    assert 3.5 <= total_40 / total_10 <= 4.5
    assert max(blobs_40) <= 1.1 * min(blobs_40)  # the 40th turn holds no more than the 1st


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every packed command batch sent to any Redis (one per request/pipeline round trip), by
    redis-py or by the lean client."""
    sent: list[bytes] = []
    original = AbstractConnection.send_packed_command

    async def counting(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        sent.append(b"".join(command) if isinstance(command, list) else bytes(command))
        await original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    lean_send = redis_lean._Conn.send

    def lean_counting(self: redis_lean._Conn, data: bytes) -> Any:  # the lean client (state/redis_lean.py)
        sent.append(data)
        return lean_send(self, data)

    monkeypatch.setattr(redis_lean._Conn, "send", lean_counting)
    return sent


async def test_redis_chain_is_one_round_trip(rstore: RedisStore, round_trips: list[bytes]) -> None:
    turns = await put_chain(rstore, 25)
    # make sure the scripts are cached server-side (a fresh server answers NOSCRIPT once each)
    await rstore.chain("tenant-a", turns[0].id, 100)
    await rstore.get_items("tenant-a", [turns[0].output_items[0]["id"]])
    round_trips.clear()
    got = await rstore.chain("tenant-a", turns[-1].id, 100)
    assert got == turns
    assert len(round_trips) == 1 and b"EVALSHA" in round_trips[0]
    round_trips.clear()
    await rstore.put(make_response(prev=turns[-1].id))
    await rstore.get_items("tenant-a", [t.output_items[0]["id"] for t in turns])
    assert len(round_trips) == 2  # a put (with its 25 ancestors' TTLs) and get_items: one script each


async def test_redis_write_ahead_record_is_one_round_trip_and_holds_no_content(
    rstore: RedisStore, raw: aioredis.Redis, round_trips: list[bytes]
) -> None:
    r = make_response(text="the conversation")
    key = rstore.response_key(r.tenant, r.id)
    await rstore.reserve(pending_of(r), 1.5)  # a fresh server answers NOSCRIPT once: not counted
    await rstore.release(r.tenant, r.id)
    round_trips.clear()
    await rstore.reserve(pending_of(r), 600.25)
    assert len(round_trips) == 1 and b"EVALSHA" in round_trips[0]
    assert await raw.hgetall(key) == {
        b"status": b"in_progress",
        b"tenant": r.tenant.encode(),
        b"created_at": str(r.created_at).encode(),
    }
    assert 599_000 < await raw.pttl(key) <= 600_250
    await rstore.put(r)  # replaced whole: the response's fields and TTL only
    assert set(await raw.hgetall(key)) == {b"prev", b"blob", b"items"}
    assert 59_000 < await raw.pttl(key) <= 60_000
    await rstore.release(r.tenant, r.id)
    assert await raw.exists(key) == 1
    other = make_response()
    await rstore.reserve(pending_of(other), 60)
    await rstore.release(other.tenant, other.id)
    assert await raw.exists(rstore.response_key(other.tenant, other.id)) == 0


async def test_redis_put_extends_ancestor_and_item_ttls(rstore: RedisStore, raw: aioredis.Redis) -> None:
    turns = await put_chain(rstore, 4)
    reused = make_response()  # re-sends turns[1]'s input item, so that index key now points here
    reused.input_items.append(turns[1].input_items[0])
    await rstore.put(reused)

    def keys(t: Any) -> list[str]:
        return [rstore.response_key("tenant-a", t.id)] + [
            rstore.item_key("tenant-a", i) for i in codec.item_ids(t)
        ]

    for t in (*turns, reused):
        for key in keys(t):
            await raw.pexpire(key, 5_000)  # as if stored long ago
    longer = rstore.response_key("tenant-a", turns[0].id)
    await raw.pexpire(longer, 600_000)
    shared = rstore.item_key("tenant-a", turns[1].input_items[0]["id"])

    await rstore.put(make_response(prev=turns[-1].id))
    assert 590_000 < await raw.pttl(longer) <= 600_000  # never shortened
    for t in turns:
        for key in keys(t):
            if key not in (longer, shared):
                assert 50_000 < await raw.pttl(key) <= 60_000, key
    assert await raw.pttl(shared) <= 5_000  # it belongs to `reused`, which is no ancestor
    for key in keys(reused):
        assert await raw.pttl(key) <= 5_000


async def test_redis_put_extends_no_further_than_max_chain_depth(
    target: Target, key_prefix: str, raw: aioredis.Redis
) -> None:
    store = RedisStore(
        target.topology, key_prefix=key_prefix, ttl_seconds=60, timeout_seconds=2.0, max_chain_depth=2
    )
    try:
        turns = await put_chain(store, 3)
        for t in turns:
            await raw.pexpire(store.response_key("tenant-a", t.id), 5_000)
        await store.put(make_response(prev=turns[-1].id))
        ttls = [await raw.pttl(store.response_key("tenant-a", t.id)) for t in turns]
        assert ttls[0] <= 5_000 and all(50_000 < ms <= 60_000 for ms in ttls[1:])
    finally:
        await store.aclose()


async def test_redis_undecodable_blob_is_missing(rstore: RedisStore, raw: aioredis.Redis) -> None:
    turns = await put_chain(rstore, 2)
    key = rstore.response_key("tenant-a", turns[0].id)
    await raw.hset(key, "blob", b"\x63" + codec.encode(turns[0])[1:])  # a future version
    assert await rstore.get("tenant-a", turns[0].id) is None
    assert await rstore.chain("tenant-a", turns[1].id, 10) is None
    assert await rstore.get("tenant-a", turns[1].id) == turns[1]


BOUND = 3.0  # seconds a call against a down Redis may take here, timeout 0.5 s included


def _listening_socket_that_never_answers() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)  # the kernel completes the handshake; nobody ever reads or writes
    return sock


@pytest.mark.parametrize("target", ["closed-port", "silent-server"])
async def test_redis_down_fails_fast(target: str) -> None:
    silent = _listening_socket_that_never_answers() if target == "silent-server" else None
    port = silent.getsockname()[1] if silent else free_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    store = RedisStore(url, key_prefix="down", ttl_seconds=60, timeout_seconds=0.5)
    # 0.5 s per call is the contract; the bound leaves room for this VM's multi-100-ms stalls while
    # still failing on a hang (redis-py alone takes several seconds against a silent server).
    calls = [
        lambda: store.reserve(pending_of(make_response()), 60),
        lambda: store.release("t", "resp_x"),
        lambda: store.put(make_response()),
        lambda: store.get("t", "resp_x"),
        lambda: store.chain("t", "resp_x", 10),
        lambda: store.get_items("t", ["msg_x"]),
        lambda: store.delete("t", "resp_x"),
    ]
    try:
        for call in calls:
            started = time.monotonic()
            with pytest.raises(ServiceUnavailable) as info:
                await call()
            assert time.monotonic() - started < BOUND
            assert info.value.message == "state store unavailable"
            assert info.value.status == 503
            assert "hunter2" not in str(info.value) and str(port) not in str(info.value)
            assert info.value.__cause__ is None and info.value.__suppress_context__
        started = time.monotonic()
        assert await store.ping() is False
        assert time.monotonic() - started < BOUND
    finally:
        await store.aclose()
        if silent:
            silent.close()


async def test_redis_password_in_url() -> None:
    server = RedisServer(password="s3cret-pw").start()
    good = RedisStore(server.url, key_prefix="pw", ttl_seconds=60, timeout_seconds=1.0)
    bad = RedisStore(
        server.url.replace("s3cret-pw", "wrong-pw"), key_prefix="pw", ttl_seconds=60, timeout_seconds=1.0
    )
    try:
        r = make_response()
        await good.put(r)
        assert await good.get(r.tenant, r.id) == r
        assert await bad.ping() is False
        with pytest.raises(ServiceUnavailable) as info:
            await bad.get(r.tenant, r.id)
        assert "wrong-pw" not in str(info.value)
    finally:
        await good.aclose()
        await bad.aclose()
        server.stop()


async def test_redis_recovers_after_a_restart_on_the_same_port() -> None:
    server = RedisServer().start()
    store = RedisStore(server.url, key_prefix="recover", ttl_seconds=60, timeout_seconds=1.0)
    try:
        before = await put_chain(store, 3)
        assert await store.chain("tenant-a", before[-1].id, 10) == before

        await store.reserve(pending_of(make_response()), 60)
        server.stop()
        with pytest.raises(ServiceUnavailable):
            await store.reserve(pending_of(make_response()), 60)
        with pytest.raises(ServiceUnavailable):
            await store.put(make_response())
        with pytest.raises(ServiceUnavailable):
            await store.chain("tenant-a", before[-1].id, 10)
        assert await store.ping() is False

        server.start()  # a new process: no data (no persistence) and an empty script cache
        check = aioredis.Redis.from_url(server.url)
        assert await check.script_exists(CHAIN.sha) == [False]
        await check.aclose()
        assert await store.ping() is True
        assert await store.get("tenant-a", before[0].id) is None
        waiting = make_response()
        await store.reserve(pending_of(waiting), 60)  # a new connection, and NOSCRIPT: EVAL
        await store.put(waiting)
        assert await store.get("tenant-a", waiting.id) == waiting
        after = await put_chain(store, 3)
        assert await store.chain("tenant-a", after[-1].id, 10) == after
        assert await store.get_items("tenant-a", [after[0].input_items[0]["id"]]) == {
            after[0].input_items[0]["id"]: after[0].input_items[0]
        }
    finally:
        await store.aclose()
        server.stop()
