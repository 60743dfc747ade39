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

Every admission has an id (``rid``). A charging admission records what it charged under that id
(``a:<rid>``: its bucket second), in the same script call, so the id costs no round trip. A caller
that never learns an admission's outcome (cancelled while it was in flight, timed out, the
connection lost: a command already written may still run) sends ``release``: it undoes exactly
what the record says, once, and leaves a tombstone; a release that runs before its admission
(the admission still on a dead connection, run later) leaves the tombstone too, and an admission
that finds one charges nothing. A settlement finds the record, corrects the charge, and deletes it,
so it too applies at most once (a retried settlement, or one after a release, changes nothing).
The record lives as long as what it charged can need undoing: the lease (the request's deadline)
when a lease or tokens are charged, else the 61 s of a request count; a tombstone lives an hour
(an admission stuck longer than that on a frozen server is not undone).

The counters (``Check.kind``, a ``CheckKind``; the Lua scripts compare its letter):

- ``REQUESTS`` (``r``) and ``TOKENS`` (``t``): a sliding window of per-second buckets (a hash: second →
  count, plus the running total and the oldest and newest second, so a check costs a few
  commands whatever the rate, and memory is at most 61 fields): a charge counts until 61 s after
  the start of its second, so never fewer than 60 s: at most ``limit`` in any 60 s window, and no
  double burst at a minute boundary (a sorted-set log would be exact to the millisecond but grow
  by one entry per request: 60 × the request rate). A settlement adjusts the bucket its
  reservation went into.
- ``BUDGET`` (``b``): one counter per period (``extra``: ms until the period ends; the key outlives it by
  a day so late settlements still find it).
- ``CONCURRENCY`` (``c``): leases (a sorted set of reservation id → when it expires: the admission's
  ``lease_ms`` after it), so a lease a crashed replica never released stops counting at its
  request's deadline.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol
from urllib.parse import quote

from gateway.kernel.errors import ServiceUnavailable
from state.resp import LeanRedis, NotSent, pack_args
from state.topology import Topology


class CheckKind(StrEnum):
    """A check's counter (the module docstring); the value is what the Lua scripts compare."""

    REQUESTS = "r"
    TOKENS = "t"
    BUDGET = "b"
    CONCURRENCY = "c"


_WINDOWED = (CheckKind.REQUESTS, CheckKind.TOKENS)  # the sliding windows of per-second buckets
_BUCKETS = 61  # seconds of token buckets summed: the window is 60 to 61 s, never less than 60
_BUDGET_GRACE_MS = 86_400_000
_COUNT_MS = 62_000  # a record of an admission that charged only request counts: their window
TOMBSTONE_MS = 3_600_000  # a released admission's mark: an admission landing later is void
DEFAULT_LEASE_MS = 660_000

__all__ = ["Check", "CheckKind", "Limiter", "MemoryLimiter", "NotSent", "Outcome", "RedisLimiter"]


@dataclass(slots=True, frozen=True)
class Check:
    kind: CheckKind
    name: str  # the counter, within the tenant ("rpm", "k:<key>:tpm", "budget:2026-12-01", ...)
    limit: int
    extra: int = 0  # BUDGET: ms until the period ends


@dataclass(slots=True)
class Outcome:
    """``failed``: the index of the first check that refused (None: admitted and charged).
    ``used``: per check, the count after the admission (or, refused, as it stands: every check is
    read, so the headers show each); ``reset_ms``: per check, when it is back to empty;
    ``retry_ms``: when the refused check could admit (-1: never, the request alone exceeds it)."""

    failed: int | None
    retry_ms: int
    used: list[int] = field(default_factory=list)
    reset_ms: list[int] = field(default_factory=list)


class Limiter(Protocol):
    remote: bool  # a call is a network round trip (the engine then settles off the response's path)

    async def admit(
        self, tenant: str, checks: Sequence[Check], rid: str, tokens: int, lease_ms: int = DEFAULT_LEASE_MS
    ) -> Outcome:
        """Check every counter; if all pass, charge each (one request, ``tokens`` tokens, a lease
        named ``rid`` for ``lease_ms``) and record it under ``rid``. Raises ServiceUnavailable when
        the backend cannot answer in time (``NotSent``: the admission was never sent)."""

    async def settle(self, tenant: str, checks: Sequence[Check], rid: str, delta: int) -> None:
        """Correct the tokens ``rid`` charged by ``delta`` (floored at 0) and release its leases;
        once (a settlement of an admission already settled or released changes nothing)."""

    async def release(self, tenant: str, checks: Sequence[Check], rid: str, tokens: int) -> None:
        """Undo whatever admission ``rid`` (of ``checks``, ``tokens``) charged, if it ran; if it has
        not run yet, it never will charge. Idempotent."""

    def settle_nowait(
        self,
        tenant: str,
        checks: Sequence[Check],
        rid: str,
        delta: int,
        done: Callable[[bool], None],
    ) -> bool:
        """``settle`` sent without waiting for it (``done(ok)`` reports it); False: not possible
        now, await ``settle`` instead."""

    async def aclose(self) -> None: ...


def needs_settling(checks: Sequence[Check]) -> bool:
    """A settlement has work: a lease to release, tokens to correct, a long-lived record to drop
    (an admission of request counts only is not settled: its counts stay, its record expires)."""
    return any(c.kind is not CheckKind.REQUESTS for c in checks)


def _keep_ms(checks: Sequence[Check], lease_ms: int) -> int:
    """How long an admission's record lives (see the module docstring)."""
    return max(lease_ms, _COUNT_MS) if needs_settling(checks) else _COUNT_MS


# -- in process ---------------------------------------------------------------------------------
class MemoryLimiter:
    """The same semantics as the scripts below, for one process (``state.redis_url`` unset)."""

    remote = False

    def __init__(self, clock: Any = time.time) -> None:
        self._clock = clock
        self._buckets: dict[tuple[str, str], dict[int, int]] = {}
        self._totals: dict[tuple[str, str], tuple[int, int]] = {}  # (value, expires at ms)
        self._leases: dict[tuple[str, str], dict[str, int]] = {}  # rid → expires at ms
        # (tenant, rid) → (bucket second, expires at ms); second -1: a tombstone
        self._records: dict[tuple[str, str], tuple[int, int]] = {}
        self._swept = 0  # records kept after the last sweep of expired ones

    def _tokens(self, k: tuple[str, str], sec: int) -> dict[int, int]:
        b = self._buckets.setdefault(k, {})
        for s in [s for s in b if s <= sec - _BUCKETS]:
            del b[s]
        return b

    def _total(self, k: tuple[str, str], now: int) -> int:
        value, expires = self._totals.get(k, (0, 0))
        return value if expires > now else 0

    def _held(self, k: tuple[str, str], now: int) -> dict[str, int]:
        held = self._leases.setdefault(k, {})
        for r in [r for r, until in held.items() if until <= now]:
            del held[r]
        return held

    def _record(self, tenant: str, rid: str, now: int) -> int | None:
        found = self._records.get((tenant, rid))
        if found is None or found[1] <= now:
            return None
        return found[0]

    def _keep(self, tenant: str, rid: str, sec: int, until: int, now: int) -> None:
        records = self._records
        records[(tenant, rid)] = (sec, until)
        if len(records) > 2 * self._swept + 1000:  # amortized: a sweep per doubling
            for k in [k for k, (_, exp) in records.items() if exp <= now]:
                del records[k]
            self._swept = len(records)

    async def admit(
        self, tenant: str, checks: Sequence[Check], rid: str, tokens: int, lease_ms: int = DEFAULT_LEASE_MS
    ) -> Outcome:
        now = int(self._clock() * 1000)
        sec = now // 1000
        seen = self._record(tenant, rid, now)
        if seen is not None:  # released before it ran (no caller waits for it), or ran already
            if seen < 0:
                raise ServiceUnavailable("limiter admission void")
            return Outcome(failed=None, retry_ms=0)
        out = Outcome(failed=None, retry_ms=0)
        for i, c in enumerate(checks):
            k = (tenant, c.name)
            retry: int | None = None
            if c.kind in _WINDOWED:
                amount = 1 if c.kind is CheckKind.REQUESTS else tokens
                b = self._tokens(k, sec)
                n = sum(b.values())
                if n + amount > c.limit:
                    retry = _token_retry(sorted(b.items()), n, amount, c.limit, now)
                used, reset = n, ((max(b) + _BUCKETS) * 1000 - now if b else 0)
            elif c.kind is CheckKind.BUDGET:
                n = self._total(k, now)
                if n + tokens > c.limit:
                    retry = c.extra if tokens <= c.limit else -1
                used, reset = n, c.extra
            else:
                n = len(self._held(k, now))
                if n + 1 > c.limit:
                    retry = 1000
                used, reset = n, 0
            out.used.append(used)
            out.reset_ms.append(reset)
            if retry is not None and out.failed is None:
                out.failed, out.retry_ms = i, retry
        if out.failed is not None:
            return out
        for i, c in enumerate(checks):
            k = (tenant, c.name)
            if c.kind in _WINDOWED:
                amount = 1 if c.kind is CheckKind.REQUESTS else tokens
                b = self._buckets[k]
                b[sec] = b.get(sec, 0) + amount
                out.used[i] += amount
                out.reset_ms[i] = (sec + _BUCKETS) * 1000 - now
            elif c.kind is CheckKind.BUDGET:
                self._totals[k] = (out.used[i] + tokens, now + c.extra + _BUDGET_GRACE_MS)
                out.used[i] += tokens
            else:
                self._leases[k][rid] = now + lease_ms
                out.used[i] += 1
        self._keep(tenant, rid, sec, now + _keep_ms(checks, lease_ms), now)
        return out

    def _undo(self, tenant: str, checks: Sequence[Check], rid: str, sec: int, delta: int, count: int) -> None:
        now = int(self._clock() * 1000)
        for c in checks:
            k = (tenant, c.name)
            d = count if c.kind is CheckKind.REQUESTS else delta
            if c.kind in _WINDOWED and d:
                b = self._buckets.get(k)
                if b is not None and sec in b:
                    b[sec] = max(0, b[sec] + d)
            elif c.kind is CheckKind.BUDGET and d:
                if k in self._totals:
                    value, expires = self._totals[k]
                    if expires > now:
                        self._totals[k] = (max(0, value + d), expires)
            elif c.kind is CheckKind.CONCURRENCY:
                held = self._leases.get(k)
                if held is not None:
                    held.pop(rid, None)
                    if not held:
                        del self._leases[k]

    async def settle(self, tenant: str, checks: Sequence[Check], rid: str, delta: int) -> None:
        sec = self._record(tenant, rid, int(self._clock() * 1000))
        if sec is None or sec < 0:
            return
        del self._records[(tenant, rid)]
        self._undo(tenant, checks, rid, sec, delta, 0)

    async def release(self, tenant: str, checks: Sequence[Check], rid: str, tokens: int) -> None:
        now = int(self._clock() * 1000)
        sec = self._record(tenant, rid, now)
        if sec is not None and sec >= 0:
            self._undo(tenant, checks, rid, sec, -tokens, -1)
        if sec is None or sec >= 0:
            self._keep(tenant, rid, -1, now + TOMBSTONE_MS, now)

    def settle_nowait(
        self,
        tenant: str,
        checks: Sequence[Check],
        rid: str,
        delta: int,
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
# KEYS[1]: the admission's record; then one per check. ARGV[1] the reservation id, ARGV[2] the
# tokens, ARGV[3] the lease in ms, ARGV[4] how long the record lives; then per check i:
# ARGV[3i+2] kind, ARGV[3i+3] limit, ARGV[3i+4] extra. Returns {failed (0: none, else the check's
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
local out = {0, 0}
local used = {}
for i = 1, #KEYS - 1 do
  local key, kind = KEYS[i + 1], ARGV[3 * i + 2]
  local limit, extra = tonumber(ARGV[3 * i + 3]), tonumber(ARGV[3 * i + 4])
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
  local key, kind, extra = KEYS[i + 1], ARGV[3 * i + 2], tonumber(ARGV[3 * i + 4])
  local at = 2 + 2 * i
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
    redis.call('ZADD', key, now + lease, rid)
    if redis.call('PTTL', key) < lease then redis.call('PEXPIRE', key, lease) end
    out[at - 1] = used[i] + 1
  end
end
redis.call('SET', rec, sec, 'PX', ARGV[4])
return out
"""

# KEYS[1]: the admission's record; then the checks. ARGV[1] the reservation id, ARGV[2] 's'
# (settle: ARGV[3] the token delta) or 'x' (release: ARGV[3] the tokens charged), ARGV[3 + i] the
# kind of check i. Only a recorded admission is corrected; a release leaves a tombstone either way.
_SETTLE = (
    """
local rec, rid, mode, amount = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local sec = redis.call('GET', rec)
if sec == 'v' then return 0 end
if sec then
  local delta, count = amount, 0
  if mode == 'x' then delta, count = -amount, -1 end
  for i = 2, #KEYS do
    local key, kind = KEYS[i], ARGV[2 + i]
    local d = delta
    if kind == 'r' then d = count end
    if (kind == 'r' or kind == 't') and d ~= 0 then
      local v = redis.call('HGET', key, sec)
      if v then
        local new = math.max(0, tonumber(v) + d)
        redis.call('HSET', key, sec, new)
        redis.call('HINCRBY', key, 'n', new - tonumber(v))
      end
    elseif kind == 'b' and d ~= 0 then
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

    async def admit(
        self, tenant: str, checks: Sequence[Check], rid: str, tokens: int, lease_ms: int = DEFAULT_LEASE_MS
    ) -> Outcome:
        keys = [self.key(tenant, "a:" + rid), *(self.key(tenant, c.name) for c in checks)]
        args: list[Any] = [rid, tokens, lease_ms, _keep_ms(checks, lease_ms)]
        for c in checks:
            args += [c.kind, c.limit, c.extra]
        raw = await self._eval(_ADMIT, keys, args)
        vals = [int(v) for v in raw]
        if vals[0] == -1:  # released before it ran: no caller waits for this any more
            raise ServiceUnavailable("limiter admission void")
        failed = vals[0] - 1 if vals[0] > 0 else None
        return Outcome(failed=failed, retry_ms=vals[1], used=vals[2::2], reset_ms=vals[3::2])

    def _settle_args(
        self, tenant: str, checks: Sequence[Check], rid: str, mode: str, n: int
    ) -> tuple[list[str], list[Any]]:
        keys = [self.key(tenant, "a:" + rid), *(self.key(tenant, c.name) for c in checks)]
        return keys, [rid, mode, n, *(c.kind for c in checks)]

    async def settle(self, tenant: str, checks: Sequence[Check], rid: str, delta: int) -> None:
        if needs_settling(checks):
            await self._eval(_SETTLE, *self._settle_args(tenant, checks, rid, "s", delta))

    async def release(self, tenant: str, checks: Sequence[Check], rid: str, tokens: int) -> None:
        await self._eval(_SETTLE, *self._settle_args(tenant, checks, rid, "x", tokens))

    def settle_nowait(
        self,
        tenant: str,
        checks: Sequence[Check],
        rid: str,
        delta: int,
        done: Callable[[bool], None],
    ) -> bool:
        if self._lean is None:
            return False
        if not needs_settling(checks):
            done(True)
            return True
        keys, args = self._settle_args(tenant, checks, rid, "s", delta)
        packed = pack_args(*keys, *args)
        return self._lean.send_nowait(_SHA[_SETTLE], _SETTLE, len(keys), len(args), packed, done)

    async def aclose(self) -> None:
        if self._lean is not None:
            await self._lean.aclose()
        else:
            await self._client.aclose()
