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
tag ``{prefix:tenant}``, so on Redis Cluster they share a slot and one script may touch them all.

The counters (``Check.kind``):

- ``r`` requests: a sliding log (a sorted set of admission times); at most ``limit`` in any 60 s.
- ``t`` tokens: per-second buckets (a hash: second → tokens) summed over the last 61 s, so the
  window is never shorter than 60 s; a settlement adjusts the bucket the reservation went into.
- ``b`` budget: one counter per period (``extra``: ms until the period ends; the key outlives it by
  a day so late settlements still find it).
- ``c`` concurrency: leases (a sorted set of reservation id → start); ``extra`` is the lease in
  ms, after which a lease a crashed replica never released stops counting.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import quote

from gateway.kernel.errors import ServiceUnavailable

Kind = Literal["r", "t", "b", "c"]
WINDOW_MS = 60_000
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
    async def admit(self, tenant: str, checks: Sequence[Check], rid: str, tokens: int) -> Outcome:
        """Check every counter; if all pass, charge each (one request, ``tokens`` tokens, a lease
        named ``rid``). Raises ServiceUnavailable when the backend cannot answer in time."""

    async def settle(self, tenant: str, checks: Sequence[Check], rid: str, delta: int, second: int) -> None:
        """Correct the tokens charged by ``delta`` (floored at 0) and release ``rid``'s leases."""

    async def aclose(self) -> None: ...


# -- in process ---------------------------------------------------------------------------------
class MemoryLimiter:
    """The same semantics as the script below, for one process (``state.redis_url`` unset)."""

    def __init__(self, clock: Any = time.time) -> None:
        self._clock = clock
        self._logs: dict[tuple[str, str], deque[int]] = {}
        self._buckets: dict[tuple[str, str], dict[int, int]] = {}
        self._totals: dict[tuple[str, str], tuple[int, int]] = {}  # (value, expires at ms)
        self._leases: dict[tuple[str, str], dict[str, int]] = {}

    def _log(self, k: tuple[str, str], now: int) -> deque[int]:
        log = self._logs.setdefault(k, deque())
        while log and log[0] <= now - WINDOW_MS:
            log.popleft()
        return log

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
            if c.kind == "r":
                log = self._log(k, now)
                n = len(log)
                if n + 1 > c.limit:
                    out.failed, out.retry_ms = i, log[n - c.limit] + WINDOW_MS - now
                used, reset = n, (log[-1] + WINDOW_MS - now if log else 0)
            elif c.kind == "t":
                b = self._tokens(k, sec)
                n = sum(b.values())
                if n + tokens > c.limit:
                    out.failed, out.retry_ms = i, _token_retry(sorted(b.items()), n, tokens, c.limit, now)
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
            if c.kind == "r":
                self._logs[k].append(now)
                out.used[i] += 1
                out.reset_ms[i] = WINDOW_MS
            elif c.kind == "t":
                b = self._buckets[k]
                b[sec] = b.get(sec, 0) + tokens
                out.used[i] += tokens
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
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local sec = tonumber(t[1])
local rid, tokens = ARGV[1], tonumber(ARGV[2])
local out = {0, 0, sec}
local used = {}
for i = 1, #KEYS do
  local key, kind = KEYS[i], ARGV[3 * i]
  local limit, extra = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local n, reset, retry = 0, 0, nil
  if kind == 'r' then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - 60000)
    n = redis.call('ZCARD', key)
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if newest[2] then reset = tonumber(newest[2]) + 60000 - now end
    if n + 1 > limit then
      local at = redis.call('ZRANGE', key, n - limit, n - limit, 'WITHSCORES')
      retry = tonumber(at[2]) + 60000 - now
    end
  elseif kind == 't' then
    local flat = redis.call('HGETALL', key)
    local secs, vals = {}, {}
    for j = 1, #flat, 2 do
      local s = tonumber(flat[j])
      if s <= sec - 61 then redis.call('HDEL', key, flat[j])
      else secs[#secs + 1] = s; vals[s] = tonumber(flat[j + 1]); n = n + vals[s] end
    end
    table.sort(secs)
    if #secs > 0 then reset = (secs[#secs] + 61) * 1000 - now end
    if n + tokens > limit then
      if tokens > limit then retry = -1 else
        retry = 1000
        local left = n
        for _, s in ipairs(secs) do
          left = left - vals[s]
          if left + tokens <= limit then retry = math.max(0, (s + 61) * 1000 - now); break end
        end
      end
    end
  elseif kind == 'b' then
    n = tonumber(redis.call('GET', key) or '0')
    reset = extra
    if n + tokens > limit then
      if tokens > limit then retry = -1 else retry = extra end
    end
  else
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - extra)
    n = redis.call('ZCARD', key)
    if n + 1 > limit then retry = 1000 end
  end
  used[i] = n
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
  if kind == 'r' then
    redis.call('ZADD', key, now, rid)
    redis.call('PEXPIRE', key, 61000)
    out[at - 1] = used[i] + 1
    out[at] = 60000
  elseif kind == 't' then
    redis.call('HINCRBY', key, sec, tokens)
    redis.call('PEXPIRE', key, 62000)
    out[at - 1] = used[i] + tokens
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
    if v then redis.call('HSET', key, sec, math.max(0, tonumber(v) + delta)) end
  elseif kind == 'b' and delta ~= 0 then
    local v = redis.call('GET', key)
    if v then redis.call('SET', key, math.max(0, tonumber(v) + delta), 'KEEPTTL') end
  elseif kind == 'c' then
    redis.call('ZREM', key, rid)
  end
end
return 1
"""


class RedisLimiter:
    """Counters in Redis, each admission and settlement one EVALSHA (see the module docstring).
    Keys: ``{prefix:tenant}:l:<counter>`` (the tenant percent-escaped)."""

    def __init__(self, url: str, *, key_prefix: str, timeout_seconds: float) -> None:
        from redis.asyncio import Redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.key_prefix = key_prefix
        self.timeout = timeout_seconds
        self._client = Redis.from_url(
            url,
            socket_timeout=timeout_seconds,
            socket_connect_timeout=timeout_seconds,
            retry=Retry(NoBackoff(), 1),
        )
        # register_script: EVALSHA, falling back to EVAL (which caches it) on NOSCRIPT
        self._admit = self._client.register_script(_ADMIT)
        self._settle = self._client.register_script(_SETTLE)

    def key(self, tenant: str, name: str) -> str:
        return f"{{{self.key_prefix}:{quote(tenant, safe='')}}}:l:{name}"

    async def _run(self, call: Any) -> Any:
        """Bounded by ``timeout_seconds`` in all; a failure is a ServiceUnavailable naming no server."""
        from redis.exceptions import RedisError

        task = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait((task,), timeout=self.timeout)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not done:
            task.cancel()
            task.add_done_callback(_consume)
            raise ServiceUnavailable("limiter unavailable")
        try:
            return task.result()
        except (RedisError, OSError, TimeoutError):
            raise ServiceUnavailable("limiter unavailable") from None

    async def admit(self, tenant: str, checks: Sequence[Check], rid: str, tokens: int) -> Outcome:
        keys = [self.key(tenant, c.name) for c in checks]
        args: list[Any] = [rid, tokens]
        for c in checks:
            args += [c.kind, c.limit, c.extra]
        raw = await self._run(self._admit(keys=keys, args=args))
        vals = [int(v) for v in raw]
        failed = vals[0] - 1 if vals[0] else None
        return Outcome(failed=failed, retry_ms=vals[1], used=vals[3::2], reset_ms=vals[4::2], second=vals[2])

    async def settle(self, tenant: str, checks: Sequence[Check], rid: str, delta: int, second: int) -> None:
        todo = [c for c in checks if c.kind == "c" or (delta and c.kind in "tb")]
        if not todo:
            return
        keys = [self.key(tenant, c.name) for c in todo]
        await self._run(self._settle(keys=keys, args=[rid, delta, second, *(c.kind for c in todo)]))

    async def aclose(self) -> None:
        await self._client.aclose()


def _consume(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
