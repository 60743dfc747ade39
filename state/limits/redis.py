"""The limit counters in Redis (``RedisLimiter``), shared by every replica using that Redis; the
semantics are ``state/limits/base.py``'s.

An admission, a settlement and a release are each one Lua script run with EVALSHA: the script runs
atomically on the server, so two replicas admitting at the same instant cannot both see the last
free slot (a read-then-write from Python would need WATCH/MULTI retries, and several round trips,
under contention), and the whole check is one round trip, whatever the number of counters. The
scripts read the clock with Redis ``TIME``, so replicas whose clocks disagree still share one
window. Every key of a tenant carries the hash tag ``{<tenant>}`` (the store's and the ledger's
too), so on Redis Cluster they share a slot and one script may touch them all (all declared in KEYS:
the cluster client routes a script by them). Standalone ``redis://`` goes through the lean client
(``state/redis_lean.py``); TLS, Cluster and Sentinel through redis-py (``state/redis_client.py``),
the settlement then awaited off the response's path (``settle_nowait`` declines).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

from gateway.kernel.errors import ServiceUnavailable
from state.limits.base import DEFAULT_LEASE_MS, TOMBSTONE_MS, Check, Outcome, keep_ms, needs_settling
from state.redis_lean import LeanRedis, pack_args
from state.topology import Topology

# KEYS[1]: the admission's record; then one per check. ARGV[1] the reservation id, ARGV[2] the
# tokens, ARGV[3] the lease in ms, ARGV[4] how long the record lives, ARGV[5] the cost (micro-units,
# what a money budget is charged); then per check i: ARGV[3i+3] kind, ARGV[3i+4] limit, ARGV[3i+5]
# extra. Returns {failed (0: none, else the check's
# index; -1: void, released before it ran; -2: ran already), retry_ms, used_1, reset_1, ...}.
_ADMIT = """
local rec = KEYS[1]
local seen = redis.call('GET', rec)
if seen then
  if seen == 'v' then return {-1, 0} end
  return {-2, 0}
end
local t = redis.call('TIME')
local sec = tonumber(t[1])
local now = sec * 1000 + math.floor(tonumber(t[2]) / 1000)
local rid, tokens, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local cost = tonumber(ARGV[5])
local out = {0, 0}
local used = {}
for i = 1, #KEYS - 1 do
  local key, kind = KEYS[i + 1], ARGV[3 * i + 3]
  local limit, extra = tonumber(ARGV[3 * i + 4]), tonumber(ARGV[3 * i + 5])
  local n, reset, retry = 0, 0, nil
  if kind == 'r' or kind == 't' then
    local amount = tokens
    if kind == 'r' then amount = 1 end
    local v = redis.call('HMGET', key, 'n', 'lo', 'hi')
    n = tonumber(v[1] or '0')
    local lo, hi = tonumber(v[2] or sec), tonumber(v[3] or sec)
    local cut = sec - 61
    if lo <= cut then
      for b = lo, math.min(cut, lo + 61) do
        local x = redis.call('HGET', key, b)
        if x then n = n - tonumber(x); redis.call('HDEL', key, b) end
      end
      lo = cut + 1
      redis.call('HSET', key, 'n', n, 'lo', lo)
    end
    if n > 0 then reset = (hi + 61) * 1000 - now end
    if n + amount > limit then
      if amount > limit then retry = -1 else
        retry = 1000
        local left = n
        for b = lo, hi do
          local x = redis.call('HGET', key, b)
          if x then
            left = left - tonumber(x)
            if left + amount <= limit then retry = math.max(0, (b + 61) * 1000 - now); break end
          end
        end
      end
    end
    used[i] = {n, amount, lo}
  elseif kind == 'b' or kind == 'm' then
    local amount = tokens
    if kind == 'm' then amount = cost end
    n = tonumber(redis.call('GET', key) or '0')
    reset = extra
    if n + amount > limit then
      if amount > limit then retry = -1 else retry = extra end
    end
    used[i] = {n, amount}
  else
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    n = redis.call('ZCARD', key)
    if n + 1 > limit then retry = 1000 end
    used[i] = n
  end
  out[#out + 1] = n
  out[#out + 1] = reset
  if retry and out[1] == 0 then
    out[1] = i
    out[2] = retry
  end
end
if out[1] ~= 0 then return out end
for i = 1, #KEYS - 1 do
  local key, kind, extra = KEYS[i + 1], ARGV[3 * i + 3], tonumber(ARGV[3 * i + 5])
  local at = 2 + 2 * i
  if kind == 'r' or kind == 't' then
    local u = used[i]
    redis.call('HINCRBY', key, sec, u[2])
    redis.call('HSET', key, 'n', u[1] + u[2], 'lo', u[3], 'hi', sec)
    redis.call('PEXPIRE', key, 62000)
    out[at - 1] = u[1] + u[2]
    out[at] = (sec + 61) * 1000 - now
  elseif kind == 'b' or kind == 'm' then
    local u = used[i]
    redis.call('INCRBY', key, u[2])
    redis.call('PEXPIRE', key, extra + 86400000)
    out[at - 1] = u[1] + u[2]
  else
    redis.call('ZADD', key, now + lease, rid)
    if redis.call('PTTL', key) < lease then redis.call('PEXPIRE', key, lease) end
    out[at - 1] = used[i] + 1
  end
end
redis.call('SET', rec, sec, 'PX', ARGV[4])
return out
"""

# KEYS[1]: the admission's record; then the checks. ARGV[1] the reservation id, ARGV[2] 's'
# (settle: ARGV[3] the token delta, ARGV[4] the cost delta) or 'x' (release: ARGV[3] the tokens,
# ARGV[4] the cost charged), ARGV[4 + i] the kind of check i. Only a recorded admission is
# corrected; a release leaves a tombstone either way.
_SETTLE = (
    """
local rec, rid, mode, amount, cost = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local sec = redis.call('GET', rec)
if sec == 'v' then return 0 end
if sec then
  local delta, count, money = amount, 0, cost
  if mode == 'x' then delta, count, money = -amount, -1, -cost end
  for i = 2, #KEYS do
    local key, kind = KEYS[i], ARGV[3 + i]
    local d = delta
    if kind == 'r' then d = count end
    if kind == 'm' then d = money end
    if (kind == 'r' or kind == 't') and d ~= 0 then
      local v = redis.call('HGET', key, sec)
      if v then
        local new = math.max(0, tonumber(v) + d)
        redis.call('HSET', key, sec, new)
        redis.call('HINCRBY', key, 'n', new - tonumber(v))
      end
    elseif (kind == 'b' or kind == 'm') and d ~= 0 then
      local v = redis.call('GET', key)
      if v then redis.call('SET', key, math.max(0, tonumber(v) + d), 'KEEPTTL') end
    elseif kind == 'c' then
      redis.call('ZREM', key, rid)
    end
  end
end
if mode == 'x' then redis.call('SET', rec, 'v', 'PX', """
    + str(TOMBSTONE_MS)
    + """)
else redis.call('DEL', rec) end
return 1
"""
)


_SHA = {src: hashlib.sha1(src.encode()).hexdigest() for src in (_ADMIT, _SETTLE)}


class RedisLimiter:
    """Counters in Redis, each admission, settlement and release one EVALSHA (see the module
    docstring). Keys: ``<prefix>:{<tenant>}:l:<counter>`` (the tenant percent-escaped), the store's
    layout; an admission's record ``<prefix>:{<tenant>}:l:a:<rid>``."""

    remote = True

    def __init__(self, target: str | Topology, *, key_prefix: str, timeout_seconds: float) -> None:
        self.key_prefix = key_prefix
        self.timeout = timeout_seconds
        self.topology = target if isinstance(target, Topology) else Topology(target)
        self._lean: LeanRedis | None = None
        self._client: Any = None
        if self.topology.lean:
            self._lean = LeanRedis(self.topology.url, timeout_seconds)  # see state/redis_lean.py
            return
        from state.redis_client import Script, connect  # redis-py: imported only when used

        # cluster (routed by KEYS, all of one tenant's slot), sentinel (the current master), TLS
        self._client = connect(self.topology, timeout_seconds)
        self._scripts = {src: Script(src) for src in (_ADMIT, _SETTLE)}

    async def _eval(self, source: str, keys: list[str], args: list[Any]) -> Any:
        if self._lean is not None:
            packed = pack_args(*keys, *args)
            return await self._lean.evalsha(_SHA[source], source, len(keys), len(args), packed)
        from state.redis_client import bounded

        # the engine logs an outage once (gateway/engine/limits.py), not every failed call
        call = self._scripts[source].run(self._client, keys, args)
        return await bounded(call, self.timeout, "limiter", log_errors=False)

    def key(self, tenant: str, name: str) -> str:
        return f"{self.key_prefix}:{{{quote(tenant, safe='')}}}:l:{name}"

    async def admit(
        self,
        tenant: str,
        checks: Sequence[Check],
        rid: str,
        tokens: int,
        lease_ms: int = DEFAULT_LEASE_MS,
        cost: int = 0,
    ) -> Outcome:
        keys = [self.key(tenant, "a:" + rid), *(self.key(tenant, c.name) for c in checks)]
        args: list[Any] = [rid, tokens, lease_ms, keep_ms(checks, lease_ms), cost]
        for c in checks:
            args += [c.kind, c.limit, c.extra]
        raw = await self._eval(_ADMIT, keys, args)
        vals = [int(v) for v in raw]
        if vals[0] == -1:  # released before it ran: no caller waits for this any more
            raise ServiceUnavailable("limiter admission void")
        failed = vals[0] - 1 if vals[0] > 0 else None
        return Outcome(failed=failed, retry_ms=vals[1], used=vals[2::2], reset_ms=vals[3::2])

    def _settle_args(
        self, tenant: str, checks: Sequence[Check], rid: str, mode: str, n: int, cost: int
    ) -> tuple[list[str], list[Any]]:
        keys = [self.key(tenant, "a:" + rid), *(self.key(tenant, c.name) for c in checks)]
        return keys, [rid, mode, n, cost, *(c.kind for c in checks)]

    async def settle(
        self, tenant: str, checks: Sequence[Check], rid: str, delta: int, cost_delta: int = 0
    ) -> None:
        if needs_settling(checks):
            await self._eval(_SETTLE, *self._settle_args(tenant, checks, rid, "s", delta, cost_delta))

    async def release(
        self, tenant: str, checks: Sequence[Check], rid: str, tokens: int, cost: int = 0
    ) -> None:
        await self._eval(_SETTLE, *self._settle_args(tenant, checks, rid, "x", tokens, cost))

    def settle_nowait(
        self,
        tenant: str,
        checks: Sequence[Check],
        rid: str,
        delta: int,
        done: Callable[[bool], None],
        cost_delta: int = 0,
    ) -> bool:
        if self._lean is None:
            return False
        if not needs_settling(checks):
            done(True)
            return True
        keys, args = self._settle_args(tenant, checks, rid, "s", delta, cost_delta)
        packed = pack_args(*keys, *args)
        return self._lean.send_nowait(_SHA[_SETTLE], _SETTLE, len(keys), len(args), packed, done)

    async def aclose(self) -> None:
        if self._lean is not None:
            await self._lean.aclose()
        else:
            await self._client.aclose()
