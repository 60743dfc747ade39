"""The limit counters in process (``state.redis_url`` unset): the semantics of ``state/limits/base.py``,
the same as the Redis scripts' (``state/limits/redis.py``), for one process."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from gateway.kernel.errors import ServiceUnavailable
from state.limits.base import (
    BUCKETS,
    BUDGET_GRACE_MS,
    DEFAULT_LEASE_MS,
    TOMBSTONE_MS,
    WINDOWED,
    Check,
    CheckKind,
    Outcome,
    keep_ms,
)

_BUDGETS = (CheckKind.BUDGET, CheckKind.MONEY)


class MemoryLimiter:
    """The same semantics as the Redis scripts, for one process."""

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
        for s in [s for s in b if s <= sec - BUCKETS]:
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
        self,
        tenant: str,
        checks: Sequence[Check],
        rid: str,
        tokens: int,
        lease_ms: int = DEFAULT_LEASE_MS,
        cost: int = 0,
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
            if c.kind in WINDOWED:
                amount = 1 if c.kind is CheckKind.REQUESTS else tokens
                b = self._tokens(k, sec)
                n = sum(b.values())
                if n + amount > c.limit:
                    retry = _token_retry(sorted(b.items()), n, amount, c.limit, now)
                used, reset = n, ((max(b) + BUCKETS) * 1000 - now if b else 0)
            elif c.kind in _BUDGETS:
                amount = tokens if c.kind is CheckKind.BUDGET else cost
                n = self._total(k, now)
                if n + amount > c.limit:
                    retry = c.extra if amount <= c.limit else -1
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
            if c.kind in WINDOWED:
                amount = 1 if c.kind is CheckKind.REQUESTS else tokens
                b = self._buckets[k]
                b[sec] = b.get(sec, 0) + amount
                out.used[i] += amount
                out.reset_ms[i] = (sec + BUCKETS) * 1000 - now
            elif c.kind in _BUDGETS:
                amount = tokens if c.kind is CheckKind.BUDGET else cost
                self._totals[k] = (out.used[i] + amount, now + c.extra + BUDGET_GRACE_MS)
                out.used[i] += amount
            else:
                self._leases[k][rid] = now + lease_ms
                out.used[i] += 1
        self._keep(tenant, rid, sec, now + keep_ms(checks, lease_ms), now)
        return out

    def _undo(
        self, tenant: str, checks: Sequence[Check], rid: str, sec: int, delta: int, count: int, money: int
    ) -> None:
        now = int(self._clock() * 1000)
        for c in checks:
            k = (tenant, c.name)
            d = count if c.kind is CheckKind.REQUESTS else money if c.kind is CheckKind.MONEY else delta
            if c.kind in WINDOWED and d:
                b = self._buckets.get(k)
                if b is not None and sec in b:
                    b[sec] = max(0, b[sec] + d)
            elif c.kind in _BUDGETS and d:
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

    async def settle(
        self, tenant: str, checks: Sequence[Check], rid: str, delta: int, cost_delta: int = 0
    ) -> None:
        sec = self._record(tenant, rid, int(self._clock() * 1000))
        if sec is None or sec < 0:
            return
        del self._records[(tenant, rid)]
        self._undo(tenant, checks, rid, sec, delta, 0, cost_delta)

    async def release(
        self, tenant: str, checks: Sequence[Check], rid: str, tokens: int, cost: int = 0
    ) -> None:
        now = int(self._clock() * 1000)
        sec = self._record(tenant, rid, now)
        if sec is not None and sec >= 0:
            self._undo(tenant, checks, rid, sec, -tokens, -1, -cost)
        if sec is None or sec >= 0:
            self._keep(tenant, rid, -1, now + TOMBSTONE_MS, now)

    def settle_nowait(
        self,
        tenant: str,
        checks: Sequence[Check],
        rid: str,
        delta: int,
        done: Callable[[bool], None],
        cost_delta: int = 0,
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
            return max(0, (sec + BUCKETS) * 1000 - now)
    return 1000
