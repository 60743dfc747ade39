"""Limit counters: requests per minute, tokens per minute, token budgets, in-flight leases.

The engine (``gateway/engine/limits.py``) decides which limits apply to a request and turns an
``Outcome`` into a refusal or headers; this module only keeps the counters, in process
(``MemoryLimiter``) or in Redis (``RedisLimiter``) so that every replica sharing that Redis sees the
same counts.

One admission checks every applicable counter of a tenant and, only when all pass, charges them
all; a settlement corrects the charge to the real usage and releases the leases. Against Redis each
is one Lua script run with EVALSHA: the script runs atomically on the server, so two replicas
admitting at the same instant cannot both see the last free slot (a read-then-write from Python
would need WATCH/MULTI retries, and several round trips, under contention), and the whole check is
one round trip, whatever the number of counters. The scripts read the clock with Redis ``TIME``,
so replicas whose clocks disagree still share one window. Every key of a tenant carries the hash
tag ``{<tenant>}`` (the store's and the ledger's too), so on Redis Cluster they share a slot and one
script may touch them all (all declared in KEYS: the cluster client routes a script by them).
Standalone ``redis://`` goes through the lean client (``state/resp.py``); TLS, Cluster and
Sentinel through redis-py (``state/redis_client.py``), the settlement then awaited off the
response's path (``settle_nowait`` declines).

The counters (``Check.kind``):

- ``r`` requests and ``t`` tokens: a sliding window of per-second buckets (a hash: second →
  count, plus the running total and the oldest and newest second, so a check costs a few
  commands whatever the rate, and memory is at most 61 fields): a charge counts until 61 s after
  the start of its second, so never fewer than 60 s: at most ``limit`` in any 60 s window, and no
  double burst at a minute boundary (a sorted-set log would be exact to the millisecond but grow
  by one entry per request: 60 × the request rate). A settlement adjusts the bucket its
  reservation went into.
- ``b`` budget: one counter per period (``extra``: ms until the period ends; the key outlives it by
  a day so late settlements still find it).
- ``c`` concurrency: leases (a sorted set of reservation id → start); ``extra`` is the lease in
  ms, after which a lease a crashed replica never released stops counting.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import quote

from state.resp import LeanRedis, pack_args
from state.topology import Topology

Kind = Literal["r", "t", "b", "c"]
_BUCKETS = 61  # seconds of token buckets summed: the window is 60 to 61 s, never less than 60
_BUDGET_GRACE_MS = 86_400_000


@dataclass(slots=True, frozen=True)
class Check:
    kind: Kind
    name: str  # the counter, within the tenant ("rpm", "k:<key>:tpm", "budget:2026-12-01", ...)
    limit: int
    extra: int = 0  # b: ms until the period ends; c: the lease in ms


@dataclass(slots=True)
class Outcome:
    """``failed``: the index of the first check that refused (None: admitted and charged).
    ``used``: per check, the count after the admission (or at the refusal); ``reset_ms``: per check,
    when it is back to empty; ``retry_ms``: when the refused check could admit (-1: never, the
    request alone exceeds it). ``second``: the token bucket the reservation went into."""

    failed: int | None
    retry_ms: int
    used: list[int] = field(default_factory=list)
    reset_ms: list[int] = field(default_factory=list)
    second: int = 0


class Limiter(Protocol):
    remote: bool  # a call is a network round trip (the engine then settles off the response's path)

    async def admit(self, tenant: str, checks: Sequence[Check], rid: str, tokens: int) -> Outcome:
        """Check every counter; if all pass, charge each (one request, ``tokens`` tokens, a lease
        named ``rid``). Raises ServiceUnavailable when the backend cannot answer in time."""

    async def settle(self, tenant: str, checks: Sequence[Check], rid: str, delta: int, second: int) -> None:
        """Correct the tokens charged by ``delta`` (floored at 0) and release ``rid``'s leases."""

    def settle_nowait(
        self,
        tenant: str,
        checks: Sequence[Check],
        rid: str,
        delta: int,
        second: int,
        done: Callable[[bool], None],
    ) -> bool:
        """``settle`` sent without waiting for it (``done(ok)`` reports it); False: not possible
        now, await ``settle`` instead."""

    async def aclose(self) -> None: ...


# -- in process ---------------------------------------------------------------------------------
class MemoryLimiter:
    """The same semantics as the script below, for one process (``state.redis_url`` unset)."""

    remote = False

    def __init__(self, clock: Any = time.time) -> None:
        self._clock = clock
        self._buckets: dict[tuple[str, str], dict[int, int]] = {}
        self._totals: dict[tuple[str, str], tuple[int, int]] = {}  # (value, expires at ms)
        self._leases: dict[tuple[str, str], dict[str, int]] = {}

    def _tokens(self, k: tuple[str, str], sec: int) -> dict[int, int]:
        b = self._buckets.setdefault(k, {})
        for s in [s for s in b if s <= sec - _BUCKETS]:
            del b[s]
        return b

    def _total(self, k: tuple[str, str], now: int) -> int:
        value, expires = self._totals.get(k, (0, 0))
        return value if expires > now else 0

    def _held(self, k: tuple[str, str], now: int, lease: int) -> dict[str, int]:
        held = self._leases.setdefault(k, {})
        for r in [r for r, t in held.items() if t <= now - lease]:
            del held[r]
        return held

    async def admit(self, tenant: str, checks: Sequence[Check], rid: str, tokens: int) -> Outcome:
        now = int(self._clock() * 1000)
        sec = now // 1000
        out = Outcome(failed=None, retry_ms=0, second=sec)
        for i, c in enumerate(checks):
            k = (tenant, c.name)
            if c.kind in "rt":
                amount = 1 if c.kind == "r" else tokens
                b = self._tokens(k, sec)
                n = sum(b.values())
                if n + amount > c.limit:
                    out.failed, out.retry_ms = i, _token_retry(sorted(b.items()), n, amount, c.limit, now)
                used, reset = n, ((max(b) + _BUCKETS) * 1000 - now if b else 0)
            elif c.kind == "b":
                n = self._total(k, now)
                if n + tokens > c.limit:
                    out.failed, out.retry_ms = i, (c.extra if tokens <= c.limit else -1)
                used, reset = n, c.extra
            else:
                held = self._held(k, now, c.extra)
                n = len(held)
                if n + 1 > c.limit:
                    out.failed, out.retry_ms = i, 1000
                used, reset = n, 0
            out.used.append(used)
            out.reset_ms.append(reset)
            if out.failed is not None:
                return out
        for i, c in enumerate(checks):
            k = (tenant, c.name)
            if c.kind in "rt":
                amount = 1 if c.kind == "r" else tokens
                b = self._buckets[k]
                b[sec] = b.get(sec, 0) + amount
                out.used[i] += amount
                out.reset_ms[i] = (sec + _BUCKETS) * 1000 - now
            elif c.kind == "b":
                self._totals[k] = (out.used[i] + tokens, now + c.extra + _BUDGET_GRACE_MS)
                out.used[i] += tokens
            else:
                self._leases[k][rid] = now
                out.used[i] += 1
        return out

    async def settle(self, tenant: str, checks: Sequence[Check], rid: str, delta: int, second: int) -> None:
        now = int(self._clock() * 1000)
        for c in checks:
            k = (tenant, c.name)
            if c.kind == "t" and delta:
                b = self._buckets.get(k)
                if b is not None and second in b:
                    b[second] = max(0, b[second] + delta)
            elif c.kind == "b" and delta:
                if k in self._totals:
                    value, expires = self._totals[k]
                    if expires > now:
                        self._totals[k] = (max(0, value + delta), expires)
            elif c.kind == "c":
                held = self._leases.get(k)
                if held is not None:
                    held.pop(rid, None)
                    if not held:
                        del self._leases[k]

    def settle_nowait(
        self,
        tenant: str,
        checks: Sequence[Check],
        rid: str,
        delta: int,
        second: int,
        done: Callable[[bool], None],
    ) -> bool:
        return False

    async def aclose(self) -> None:
        return None


def _token_retry(buckets: list[tuple[int, int]], used: int, tokens: int, limit: int, now: int) -> int:
    """When enough of the oldest buckets have left the window for ``tokens`` more (-1: never)."""
    if tokens > limit:
        return -1
    for sec, n in buckets:
        used -= n
        if used + tokens <= limit:
            return max(0, (sec + _BUCKETS) * 1000 - now)
    return 1000


# -- Redis --------------------------------------------------------------------------------------
# KEYS: one per check. ARGV[1] the reservation id, ARGV[2] the tokens; then per check i:
# ARGV[3i] kind, ARGV[3i+1] limit, ARGV[3i+2] extra. Returns {failed (0: none, else the check's
# index), retry_ms, second, used_1, reset_1, used_2, reset_2, ...}.
_ADMIT = """
local t = redis.call('TIME')
local sec = tonumber(t[1])
local now = sec * 1000 + math.floor(tonumber(t[2]) / 1000)
local rid, tokens = ARGV[1], tonumber(ARGV[2])
local out = {0, 0, sec}
local used = {}
for i = 1, #KEYS do
  local key, kind = KEYS[i], ARGV[3 * i]
  local limit, extra = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
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
  elseif kind == 'b' then
    n = tonumber(redis.call('GET', key) or '0')
    reset = extra
    if n + tokens > limit then
      if tokens > limit then retry = -1 else retry = extra end
    end
    used[i] = n
  else
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - extra)
    n = redis.call('ZCARD', key)
    if n + 1 > limit then retry = 1000 end
    used[i] = n
  end
  out[#out + 1] = n
  out[#out + 1] = reset
  if retry then
    out[1] = i
    out[2] = retry
    return out
  end
end
for i = 1, #KEYS do
  local key, kind, extra = KEYS[i], ARGV[3 * i], tonumber(ARGV[3 * i + 2])
  local at = 3 + 2 * i
  if kind == 'r' or kind == 't' then
    local u = used[i]
    redis.call('HINCRBY', key, sec, u[2])
    redis.call('HSET', key, 'n', u[1] + u[2], 'lo', u[3], 'hi', sec)
    redis.call('PEXPIRE', key, 62000)
    out[at - 1] = u[1] + u[2]
    out[at] = (sec + 61) * 1000 - now
  elseif kind == 'b' then
    redis.call('INCRBY', key, tokens)
    redis.call('PEXPIRE', key, extra + 86400000)
    out[at - 1] = used[i] + tokens
  else
    redis.call('ZADD', key, now, rid)
    redis.call('PEXPIRE', key, extra)
    out[at - 1] = used[i] + 1
  end
end
return out
"""

# KEYS: the checks to settle; ARGV[1] the reservation id, ARGV[2] the token delta, ARGV[3] the
# bucket second of the reservation, ARGV[3 + i] the kind of check i.
_SETTLE = """
local rid, delta, sec = ARGV[1], tonumber(ARGV[2]), ARGV[3]
for i = 1, #KEYS do
  local key, kind = KEYS[i], ARGV[3 + i]
  if kind == 't' and delta ~= 0 then
    local v = redis.call('HGET', key, sec)
    if v then
      local new = math.max(0, tonumber(v) + delta)
      redis.call('HSET', key, sec, new)
      redis.call('HINCRBY', key, 'n', new - tonumber(v))
    end
  elseif kind == 'b' and delta ~= 0 then
    local v = redis.call('GET', key)
    if v then redis.call('SET', key, math.max(0, tonumber(v) + delta), 'KEEPTTL') end
  elseif kind == 'c' then
    redis.call('ZREM', key, rid)
  end
end
return 1
"""


_SHA = {src: hashlib.sha1(src.encode()).hexdigest() for src in (_ADMIT, _SETTLE)}


class RedisLimiter:
    """Counters in Redis, each admission and settlement one EVALSHA (see the module docstring).
    Keys: ``<prefix>:{<tenant>}:l:<counter>`` (the tenant percent-escaped), the store's layout."""

    remote = True

    def __init__(self, target: str | Topology, *, key_prefix: str, timeout_seconds: float) -> None:
        self.key_prefix = key_prefix
        self.timeout = timeout_seconds
        self.topology = target if isinstance(target, Topology) else Topology(target)
        self._lean: LeanRedis | None = None
        self._client: Any = None
        if self.topology.mode == "standalone" and not self.topology.url.startswith("rediss://"):
            self._lean = LeanRedis(self.topology.url, timeout_seconds)  # see state/resp.py
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

    async def admit(self, tenant: str, checks: Sequence[Check], rid: str, tokens: int) -> Outcome:
        keys = [self.key(tenant, c.name) for c in checks]
        args: list[Any] = [rid, tokens]
        for c in checks:
            args += [c.kind, c.limit, c.extra]
        raw = await self._eval(_ADMIT, keys, args)
        vals = [int(v) for v in raw]
        failed = vals[0] - 1 if vals[0] else None
        return Outcome(failed=failed, retry_ms=vals[1], used=vals[3::2], reset_ms=vals[4::2], second=vals[2])

    async def settle(self, tenant: str, checks: Sequence[Check], rid: str, delta: int, second: int) -> None:
        todo = [c for c in checks if c.kind == "c" or (delta and c.kind in "tb")]
        if not todo:
            return
        keys = [self.key(tenant, c.name) for c in todo]
        await self._eval(_SETTLE, keys, [rid, delta, second, *(c.kind for c in todo)])

    def settle_nowait(
        self,
        tenant: str,
        checks: Sequence[Check],
        rid: str,
        delta: int,
        second: int,
        done: Callable[[bool], None],
    ) -> bool:
        if self._lean is None:
            return False
        todo = [c for c in checks if c.kind == "c" or (delta and c.kind in "tb")]
        if not todo:
            done(True)
            return True
        args = [rid, delta, second, *(c.kind for c in todo)]
        packed = pack_args(*(self.key(tenant, c.name) for c in todo), *args)
        return self._lean.send_nowait(_SHA[_SETTLE], _SETTLE, len(todo), len(args), packed, done)

    async def aclose(self) -> None:
        if self._lean is not None:
            await self._lean.aclose()
        else:
            await self._client.aclose()
