"""Background responses' event logs and leases in Redis, beside the store's keys and under the
same hash tag (the tenant), so they work alike on standalone, Cluster and Sentinel:

- ``{prefix}:{<tenant>}:e:<response id>``: a Redis Stream, one entry per event, its id
  ``0-<sequence_number + 1>`` (fields ``d`` the event's JSON, ``t`` 1 on the terminal event),
  trimmed to about ``max_events`` (``XADD MAXLEN ~``) and expiring ``ttl_seconds`` after its last
  append. A reader replays and follows with one ``XREAD BLOCK`` from the id after its position.
- ``{prefix}:{<tenant>}:b:<response id>``: the owner's lease, a hash with a TTL its heartbeat
  renews; a cancel request sets its field ``c``, which the next heartbeat reads.
- ``{prefix}:{ctl-<replica>}:c``: a process's control stream, where a cancel made on another
  replica is sent to the lease's owner (fields ``t`` the tenant, ``r`` the response id), trimmed
  to about 1,000 entries and expiring an hour after the last; the owner follows it with
  ``XREAD BLOCK``.
- ``{prefix}:{<tenant>}:bg``: the tenant's running index, a sorted set of response ids by their
  lease's deadline (Redis's clock), where a sweeper finds the lapsed ones.

It shares the store's client and time bound (``RedisStore``)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from state.background import MAX_EVENTS, TTL_SECONDS, Beat, LoggedEvent
from state.redis import RedisStore
from state.redis_client import Script

_NOW = "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000)\n"

# KEYS[1] the lease, KEYS[2] the tenant's running index; ARGV[1] the TTL in ms, ARGV[2] the response
# id, ARGV[3] the index's TTL in s, ARGV[4] the owner (this process's id). The lease, and its
# deadline (the server's clock) in the index.
_CLAIM = Script(
    _NOW
    + """
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'o', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[1]), ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 1
"""
)

# KEYS[1] the lease, KEYS[2] the index; ARGV[1] its TTL in ms, ARGV[2] the response id.
# -1: no lease (it lapsed), 1: a cancel was asked for, 0: alive.
_BEAT = Script(
    _NOW
    + """
if redis.call('PEXPIRE', KEYS[1], ARGV[1]) == 0 then return -1 end
redis.call('ZADD', KEYS[2], 'XX', now + tonumber(ARGV[1]), ARGV[2])
return redis.call('HEXISTS', KEYS[1], 'c')
"""
)

# KEYS[1] the index; ARGV[1] how many. The ids whose lease deadline has passed.
STALE = Script(_NOW + "return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[1])")
_INDEX_TTL_SECONDS = 24 * 3600  # the index outlives its newest lease by a day
_STALE_BATCH = 100

# KEYS[1] the lease. The cancel request set for its owner, and its owner's id; 0: no lease.
_CANCEL = Script("""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'c', '1')
return redis.call('HGET', KEYS[1], 'o')
""")
_CONTROL_MAX = 1000  # a control stream keeps about this many requests
_CONTROL_TTL_SECONDS = 3600

_BEATS = {-1: Beat.LOST, 0: Beat.ALIVE, 1: Beat.CANCEL}


def _entries(reply: Any) -> list[Any]:
    """The entries of a one-stream XREAD reply, RESP2 or RESP3."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return next(iter(reply.values()))[0] if reply else []
    return list(reply[0][1])


def _event(entry: Any) -> LoggedEvent:
    entry_id, fields = entry
    seq = int(entry_id.rsplit(b"-", 1)[1]) - 1
    return LoggedEvent(seq, fields[b"d"], fields.get(b"t") == b"1")


class RedisBackgroundLog:
    def __init__(
        self, store: RedisStore, *, max_events: int = MAX_EVENTS, ttl_seconds: int = TTL_SECONDS
    ) -> None:
        self.store = store
        self.max_events = max_events
        self.ttl_seconds = ttl_seconds
        # an XREAD BLOCK waits at most this long, well inside the client's socket timeout
        self.max_block_ms = max(1, int(store.timeout * 400))
        self.replica = uuid.uuid4().hex  # this process, as a lease's owner
        self._control_at: bytes | str = "0-0"  # the last control request read (the stream is ours)

    def events_key(self, tenant: str, response_id: str) -> str:
        return f"{self.store._base(tenant)}e:{response_id}"

    def lease_key(self, tenant: str, response_id: str) -> str:
        return f"{self.store._base(tenant)}b:{response_id}"

    def index_key(self, tenant: str) -> str:
        return f"{self.store._base(tenant)}bg"

    async def claim(self, tenant: str, response_id: str, ttl_seconds: float) -> None:
        keys = [self.lease_key(tenant, response_id), self.index_key(tenant)]
        args = [max(1, int(ttl_seconds * 1000)), response_id, _INDEX_TTL_SECONDS, self.replica]
        await self.store._call(self.store._script(_CLAIM, keys, args))

    async def beat(self, tenant: str, response_id: str, ttl_seconds: float) -> Beat:
        keys = [self.lease_key(tenant, response_id), self.index_key(tenant)]
        args = [max(1, int(ttl_seconds * 1000)), response_id]
        return _BEATS[int(await self.store._call(self.store._script(_BEAT, keys, args)))]

    async def stale(self, tenant: str) -> list[str]:
        found = await self.store._call(self.store._script(STALE, [self.index_key(tenant)], [_STALE_BATCH]))
        return [rid.decode() if isinstance(rid, bytes) else str(rid) for rid in found]

    def control_key(self, replica: str) -> str:
        return f"{self.store.key_prefix}:{{ctl-{replica}}}:c"

    async def cancel(self, tenant: str, response_id: str) -> bool:
        key = self.lease_key(tenant, response_id)
        owner = await self.store._call(self.store._script(_CANCEL, [key], []))
        if not owner:
            return False
        replica = owner.decode() if isinstance(owner, bytes) else str(owner)
        pipe = self.store._client.pipeline(transaction=False)  # the owner's stream: its own slot
        stream = self.control_key(replica)
        pipe.xadd(stream, {"t": tenant, "r": response_id}, maxlen=_CONTROL_MAX, approximate=True)
        pipe.expire(stream, _CONTROL_TTL_SECONDS)
        await self.store._call(pipe.execute())
        return True

    async def control(self, wait_seconds: float) -> list[tuple[str, str]]:
        block = max(1, min(self.max_block_ms, int(wait_seconds * 1000)))
        key = self.control_key(self.replica)
        reply = await self.store._call(self.store._client.xread({key: self._control_at}, block=block))
        out: list[tuple[str, str]] = []
        for entry_id, fields in _entries(reply):
            self._control_at = entry_id
            out.append((fields[b"t"].decode(), fields[b"r"].decode()))
        return out

    async def held(self, tenant: str, response_id: str) -> bool:
        return bool(await self.store._call(self.store._client.exists(self.lease_key(tenant, response_id))))

    async def drop(self, tenant: str, response_id: str) -> None:
        pipe = self.store._client.pipeline(transaction=False)
        pipe.delete(self.lease_key(tenant, response_id))
        pipe.zrem(self.index_key(tenant), response_id)
        await self.store._call(pipe.execute())

    async def append(self, tenant: str, response_id: str, events: Sequence[LoggedEvent]) -> None:
        key = self.events_key(tenant, response_id)
        pipe = self.store._client.pipeline(transaction=False)
        for e in events:
            fields: dict[Any, Any] = {"d": e.data, "t": b"1" if e.terminal else b"0"}
            pipe.xadd(key, fields, id=f"0-{e.seq + 1}", maxlen=self.max_events, approximate=True)
        pipe.expire(key, self.ttl_seconds)
        await self.store._call(pipe.execute())

    async def read(self, tenant: str, response_id: str, after: int, wait_seconds: float) -> list[LoggedEvent]:
        key = self.events_key(tenant, response_id)
        block = min(self.max_block_ms, int(wait_seconds * 1000)) if wait_seconds > 0 else None
        reply = await self.store._call(
            self.store._client.xread({key: f"0-{after + 1}"}, count=self.max_events, block=block)
        )
        return [_event(entry) for entry in _entries(reply)]

    async def last(self, tenant: str, response_id: str) -> LoggedEvent | None:
        reply = await self.store._call(
            self.store._client.xrevrange(self.events_key(tenant, response_id), count=1)
        )
        return _event(reply[0]) if reply else None

    async def aclose(self) -> None:
        return None  # the store closes the client
