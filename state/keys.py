"""Virtual keys' records (``POST /admin/keys``, gateway/engine/vkeys.py): in process, or in Redis
beside the store (every topology), shared by every replica.

A record is a JSON object (its fields are the engine's; the store only keeps them) holding the
SHA-256 digest of its secret, never the secret. Every change bumps a version number; a replica
reads every record again when the version it holds is not the store's any more
(``VirtualKeyStore.version``), and hears of a change at once where the store publishes one
(``listen``).

Redis layout, one hash tag so that a script may touch every key in a Cluster:
``{prefix}:{_vkeys}:keys`` (hash: key id → record JSON) and ``{prefix}:{_vkeys}:ver`` (the version);
changes are published on ``{prefix}:_vkeys:changes`` (the version as the message)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import orjson

if TYPE_CHECKING:
    from state.redis import RedisStore

log = logging.getLogger(__name__)

Record = dict[str, Any]


class VirtualKeyStore(Protocol):
    async def put(self, key_id: str, record: Record) -> int:
        """Create or replace a record; the new version."""

    async def delete(self, key_id: str) -> tuple[bool, int]:
        """Whether the record was there, and the new version."""

    async def load(self) -> tuple[int, dict[str, Record]]:
        """The version and every record, read together."""

    async def version(self) -> int: ...

    async def listen(self, changed: Callable[[], Awaitable[None]]) -> None:
        """Call ``changed`` whenever another replica changes a record; returns only when cancelled
        (or at once, where changes are not published: then the version check alone finds them)."""

    async def aclose(self) -> None: ...


class MemoryKeyStore:
    """One process's records."""

    def __init__(self) -> None:
        self._records: dict[str, bytes] = {}
        self._version = 0

    async def put(self, key_id: str, record: Record) -> int:
        self._records[key_id] = orjson.dumps(record)
        self._version += 1
        return self._version

    async def delete(self, key_id: str) -> tuple[bool, int]:
        found = self._records.pop(key_id, None) is not None
        if found:
            self._version += 1
        return found, self._version

    async def load(self) -> tuple[int, dict[str, Record]]:
        return self._version, {k: orjson.loads(v) for k, v in self._records.items()}

    async def version(self) -> int:
        return self._version

    async def listen(self, changed: Callable[[], Awaitable[None]]) -> None:
        return None  # one process: every change is its own

    async def aclose(self) -> None:
        return None


_PUT = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local v = redis.call('INCR', KEYS[2])
return v
"""

_DELETE = """
local n = redis.call('HDEL', KEYS[1], ARGV[1])
local v
if n == 1 then v = redis.call('INCR', KEYS[2]) else v = tonumber(redis.call('GET', KEYS[2]) or '0') end
return {n, v}
"""

_LOAD = """
local v = tonumber(redis.call('GET', KEYS[2]) or '0')
return {v, redis.call('HGETALL', KEYS[1])}
"""


class RedisKeyStore:
    """Shares the store's client, key prefix and time bound."""

    def __init__(self, store: RedisStore) -> None:
        from state.redis_client import Script

        self.store = store
        base = f"{store.key_prefix}:{{_vkeys}}:"
        self.keys = (f"{base}keys", f"{base}ver")
        self.channel = f"{store.key_prefix}:_vkeys:changes"
        self._put, self._delete, self._load = Script(_PUT), Script(_DELETE), Script(_LOAD)

    async def _publish(self, version: int) -> None:
        from redis.asyncio.cluster import RedisCluster

        client = self.store._client
        if isinstance(client, RedisCluster):
            return  # no pub/sub through the cluster client: the version check finds it
        with contextlib.suppress(Exception):  # the change is made; the version check finds it too
            await self.store._call(client.publish(self.channel, str(version)))

    async def put(self, key_id: str, record: Record) -> int:
        v = int(
            await self.store._call(
                self._put.run(self.store._client, self.keys, [key_id, orjson.dumps(record)])
            )
        )
        await self._publish(v)
        return v

    async def delete(self, key_id: str) -> tuple[bool, int]:
        n, v = await self.store._call(self._delete.run(self.store._client, self.keys, [key_id]))
        if int(n):
            await self._publish(int(v))
        return bool(int(n)), int(v)

    async def load(self) -> tuple[int, dict[str, Record]]:
        v, flat = await self.store._call(self._load.run(self.store._client, self.keys, []))
        pairs = iter(flat)
        records = {
            (k.decode() if isinstance(k, bytes) else k): orjson.loads(r)
            for k, r in zip(pairs, pairs, strict=True)
        }
        return int(v), records

    async def version(self) -> int:
        raw = await self.store._call(self.store._client.get(self.keys[1]))
        return int(raw or 0)

    async def listen(self, changed: Callable[[], Awaitable[None]]) -> None:
        from redis.asyncio import Redis

        client = self.store._client
        if not isinstance(client, Redis):
            return  # Cluster: the version check alone
        while True:
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                while True:
                    message = await pubsub.get_message(timeout=5.0)
                    if message is not None:
                        await changed()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a Redis restart or failover: subscribe again shortly
                log.warning("virtual keys: subscription lost: %s", type(exc).__name__)
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def aclose(self) -> None:
        return None  # the store closes the client
