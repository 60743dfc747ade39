"""Redis ResponseStore: one hash per response (its own blob + ``prev`` pointer), chains walked
server-side by a Lua script in one round trip, an item-id index, TTL on every key.

A chain lives as long as its newest member: the put script, in the same round trip, walks the new
response's ancestors and raises each one's TTL (and its item-index keys') to the new response's.

A write-ahead record (``reserve``) is the same hash before the response is stored: ``status``,
``tenant`` and ``created_at``, no ``blob``, so every read and script takes it for a missing
response; the put's ``DEL`` + ``HSET`` replaces it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

import orjson
from redis.asyncio.cluster import RedisCluster

from gateway.kernel.errors import ServiceUnavailable, chain_too_deep
from state import codec
from state.base import PendingResponse, StoredResponse
from state.redis_client import Client, Script, bounded, connect, ping
from state.redis_lean import LeanRedis, pack_args
from state.topology import Topology

T = TypeVar("T")

# KEYS[1] the response's key; ARGV[1] the tenant's response-key prefix; ARGV[2] max depth.
# Returns {1, blob_newest, ..., blob_oldest}, {0} when a link is missing, {-1} when too deep.
_CHAIN = """
local key = KEYS[1]
local max = tonumber(ARGV[2])
local out = {1}
while true do
  local v = redis.call('HMGET', key, 'prev', 'blob')
  if not v[2] then return {0} end
  if #out > max then return {-1} end
  out[#out + 1] = v[2]
  if not v[1] or v[1] == '' then return out end
  key = ARGV[1] .. v[1]
end
"""

# KEYS[1] the response's key, KEYS[2..] its item-index keys; ARGV[1] the response id, ARGV[2] the
# previous response id ('' for none), ARGV[3] the blob, ARGV[4] the item ids (JSON), ARGV[5] the TTL
# in ms, ARGV[6] / ARGV[7] the tenant's response-key / item-key prefix, ARGV[8] the max chain depth.
# Stores the response, then walks up to ARGV[8] ancestors (stopping at the first missing one) and
# raises the TTL of each, and of its item-index keys that still point at it, to ARGV[5] ms; a
# longer TTL (or none) is left alone. Ancestor keys are derived, as in _CHAIN (same hash tag).
_PUT = """
local ttl = tonumber(ARGV[5])
local function extend(k)
  local left = redis.call('PTTL', k)
  if left >= 0 and left < ttl then redis.call('PEXPIRE', k, ttl) end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'prev', ARGV[2], 'blob', ARGV[3], 'items', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ttl)
for i = 2, #KEYS do redis.call('SET', KEYS[i], ARGV[1], 'PX', ttl) end
local rid, depth = ARGV[2], tonumber(ARGV[8])
while rid ~= '' and depth > 0 do
  local key = ARGV[6] .. rid
  local v = redis.call('HMGET', key, 'prev', 'items')
  if not v[2] then return 1 end
  extend(key)
  for _, id in ipairs(cjson.decode(v[2])) do
    local k = ARGV[7] .. id
    if redis.call('GET', k) == rid then extend(k) end
  end
  rid, depth = v[1] or '', depth - 1
end
return 1
"""

# KEYS the item-index keys; ARGV[1] the tenant's response-key prefix.
# Returns the blobs of the distinct responses the items point at.
_ITEMS = """
local seen, out = {}, {}
for _, k in ipairs(KEYS) do
  local rid = redis.call('GET', k)
  if rid and not seen[rid] then
    seen[rid] = true
    local blob = redis.call('HGET', ARGV[1] .. rid, 'blob')
    if blob then out[#out + 1] = blob end
  end
end
return out
"""

# KEYS[1] the response's key; ARGV[1] the tenant's item-key prefix; ARGV[2] the response id.
# Drops the index entries that still point at this response, then the response. 1 if it existed.
_DELETE = """
local items = redis.call('HGET', KEYS[1], 'items')
if not items then return 0 end
for _, id in ipairs(cjson.decode(items)) do
  local k = ARGV[1] .. id
  if redis.call('GET', k) == ARGV[2] then redis.call('DEL', k) end
end
redis.call('DEL', KEYS[1])
return 1
"""

# KEYS[1] the response's key; ARGV[1] the tenant, ARGV[2] created_at, ARGV[3] the TTL in ms.
# The write-ahead record, in one atomic step (never a key without a TTL); an existing key (a
# stored response, were an id ever reused) is left as it is.
_RESERVE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'status', 'in_progress', 'tenant', ARGV[1], 'created_at', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS[1] the response's key. Drops it if it is only a write-ahead record (no blob).
_RELEASE = """
if redis.call('HEXISTS', KEYS[1], 'blob') == 1 then return 0 end
return redis.call('DEL', KEYS[1])
"""


PUT, CHAIN, ITEMS, DELETE = Script(_PUT), Script(_CHAIN), Script(_ITEMS), Script(_DELETE)
RESERVE, RELEASE = Script(_RESERVE), Script(_RELEASE)


class RedisStore:
    """Every key is ``{prefix}:{<tenant>}:r:<response id>`` or ``...:i:<item id>``; the tenant
    (percent-escaped) is the hash tag, so a tenant's keys share a Redis Cluster slot and the
    scripts may touch keys they derive."""

    def __init__(
        self,
        target: str | Topology,
        *,
        key_prefix: str = "orgw",
        ttl_seconds: int,
        timeout_seconds: float,
        max_chain_depth: int = 1000,
        wait_replicas: int = 0,
    ) -> None:
        self.key_prefix = key_prefix
        self.ttl_ms = int(ttl_seconds * 1000)
        self.max_chain_depth = max_chain_depth  # how far a put extends ancestors' TTLs
        self.timeout = timeout_seconds
        self.failed_at: float | None = None  # monotonic, of the last failed call (None: it worked)
        # a put also waits for this many replicas to have it (Redis WAIT), within half the timeout
        self.wait_replicas = wait_replicas
        self._wait_ms = max(1, int(timeout_seconds * 500))
        self.topology = target if isinstance(target, Topology) else Topology(target)
        self._client: Client = connect(self.topology, timeout_seconds)
        # the write-ahead record is on every store: true request's path: on the lean client's
        # pipelined connection where it can be (about a fifth of redis-py's CPU per call)
        self._lean = (
            LeanRedis(self.topology.url, timeout_seconds, "state store") if self.topology.lean else None
        )

    # -- keys --------------------------------------------------------------------------------
    def _base(self, tenant: str) -> str:
        return f"{self.key_prefix}:{{{quote(tenant, safe='')}}}:"

    def response_key(self, tenant: str, response_id: str) -> str:
        return f"{self._base(tenant)}r:{response_id}"

    def item_key(self, tenant: str, item_id: str) -> str:
        return f"{self._base(tenant)}i:{item_id}"

    # -- plumbing ----------------------------------------------------------------------------
    async def _call(self, awaitable: Awaitable[T]) -> T:
        try:
            result = await bounded(awaitable, self.timeout, "state store")
        except ServiceUnavailable:
            self.failed_at = time.monotonic()
            raise
        self.failed_at = None
        return result

    def failing(self) -> bool:
        """The last call failed, less than a timeout ago: what may skip a wait (the ledger's
        count at the end of a turn whose put just timed out), so that one outage costs one wait."""
        return self.failed_at is not None and time.monotonic() - self.failed_at < self.timeout

    async def _script(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return await script.run(self._client, keys, args)

    async def _lean_script(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """``script`` on the lean client when there is one (bounded by the timeout too), else as
        every other call."""
        if self._lean is None:
            return await self._call(self._script(script, keys, args))
        packed = pack_args(*keys, *args)
        try:
            result = await self._lean.evalsha(script.sha, script.source, len(keys), len(args), packed)
        except ServiceUnavailable:
            self.failed_at = time.monotonic()
            raise
        self.failed_at = None
        return result

    # -- ResponseStore -----------------------------------------------------------------------
    async def put(self, response: StoredResponse) -> None:
        """One script, one round trip: store the response and its item index with the TTL, and
        extend its ancestors (see ``ResponseStore.put``) — at most ``max_chain_depth`` of them,
        as deeper ones cannot be continued anyway. That walk costs a few server-side commands per
        ancestor and per ancestor item (no blobs move), about what the continuation's ``chain``
        read that preceded this put already cost."""
        tenant = response.tenant
        ids = codec.item_ids(response)
        keys = [self.response_key(tenant, response.id), *(self.item_key(tenant, i) for i in ids)]
        args = [
            response.id,
            response.previous_response_id or "",
            codec.encode(response),
            orjson.dumps(ids),
            self.ttl_ms,
            f"{self._base(tenant)}r:",
            f"{self._base(tenant)}i:",
            self.max_chain_depth,
        ]
        if self.wait_replicas:
            assert not isinstance(self._client, RedisCluster)  # refused by StateSettings
            call = PUT.run_replicated(self._client, keys, args, self.wait_replicas, self._wait_ms)
            await self._call(call)
            return
        await self._call(self._script(PUT, keys, args))

    async def reserve(self, pending: PendingResponse, ttl_seconds: float) -> None:
        """One script, one round trip, pipelined with the other requests' on the lean client where
        there is one; no replica WAIT (the record is a check and a placeholder: the response's put
        is what must survive a failover)."""
        key = self.response_key(pending.tenant, pending.id)
        args = [pending.tenant, pending.created_at, max(1, int(ttl_seconds * 1000))]
        await self._lean_script(RESERVE, [key], args)

    async def release(self, tenant: str, response_id: str) -> None:
        await self._lean_script(RELEASE, [self.response_key(tenant, response_id)], [])

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        blob = await self._call(self._client.hget(self.response_key(tenant, response_id), "blob"))
        return codec.decode(blob) if not isinstance(blob, str) else None  # bytes: no decode_responses

    async def chain(self, tenant: str, response_id: str, max_depth: int) -> list[StoredResponse] | None:
        prefix = f"{self._base(tenant)}r:"
        reply = await self._call(
            self._script(CHAIN, [self.response_key(tenant, response_id)], [prefix, max_depth])
        )
        if reply[0] == -1:
            raise chain_too_deep(max_depth)
        if reply[0] != 1:
            return None
        out: list[StoredResponse] = []
        for blob in reversed(reply[1:]):
            decoded = codec.decode(blob)
            if decoded is None:
                return None
            out.append(decoded)
        return out

    async def delete(self, tenant: str, response_id: str) -> bool:
        key = self.response_key(tenant, response_id)
        args = [f"{self._base(tenant)}i:", response_id]
        return bool(await self._call(self._script(DELETE, [key], args)))

    async def get_items(self, tenant: str, item_ids: list[str]) -> dict[str, dict[str, Any]]:
        wanted = set(item_ids)
        if not wanted:
            return {}
        keys = [self.item_key(tenant, i) for i in sorted(wanted)]
        blobs = await self._call(self._script(ITEMS, keys, [f"{self._base(tenant)}r:"]))
        found: dict[str, dict[str, Any]] = {}
        for blob in blobs:
            decoded = codec.decode(blob)
            if decoded is not None:
                for item_id, item in codec.find_items(decoded, wanted).items():
                    found.setdefault(item_id, item)
        return found

    async def ping(self) -> bool:
        try:
            return await self._call(ping(self._client))
        except ServiceUnavailable:
            return False

    async def aclose(self) -> None:
        if self._lean is not None:
            await self._lean.aclose()
        await self._client.aclose()
