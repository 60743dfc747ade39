"""Limit counters: requests per minute, tokens per minute, token budgets, in-flight leases.

The engine (``gateway/engine/limits.py``) decides which limits apply to a request and turns an
``Outcome`` into a refusal or headers; the counters are kept in process (``MemoryLimiter``,
``state/limits/memory.py``) or in Redis (``RedisLimiter``, ``state/limits/redis.py``) so that every
replica sharing that Redis sees the same counts. This module holds what both share: the checks, the
outcome, the ``Limiter`` seam and the semantics below.

One admission checks every applicable counter of a tenant and, only when all pass, charges them
all; a settlement corrects the charge to the real usage and releases the leases.

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
- ``MONEY`` (``m``): a budget in money: a ``BUDGET`` counter of micro-units of the currency, charged
  the admission's ``cost`` (not its tokens) and settled by its ``cost_delta``.
- ``CONCURRENCY`` (``c``): leases (a sorted set of reservation id → when it expires: the admission's
  ``lease_ms`` after it), so a lease a crashed replica never released stops counting at its
  request's deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol


class CheckKind(StrEnum):
    """A check's counter (the module docstring); the value is what the Lua scripts compare."""

    REQUESTS = "r"
    TOKENS = "t"
    BUDGET = "b"
    MONEY = "m"
    CONCURRENCY = "c"


WINDOWED = (CheckKind.REQUESTS, CheckKind.TOKENS)  # the sliding windows of per-second buckets
BUCKETS = 61  # seconds of token buckets summed: the window is 60 to 61 s, never less than 60
BUDGET_GRACE_MS = 86_400_000
COUNT_MS = 62_000  # a record of an admission that charged only request counts: their window
TOMBSTONE_MS = 3_600_000  # a released admission's mark: an admission landing later is void
DEFAULT_LEASE_MS = 660_000


@dataclass(slots=True, frozen=True)
class Check:
    kind: CheckKind
    name: str  # the counter, within the tenant ("rpm", "k:<key>:tpm", "budget:2026-12-01", ...)
    limit: int
    extra: int = 0  # b, m: ms until the period ends


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
        self,
        tenant: str,
        checks: Sequence[Check],
        rid: str,
        tokens: int,
        lease_ms: int = DEFAULT_LEASE_MS,
        cost: int = 0,
    ) -> Outcome:
        """Check every counter; if all pass, charge each (one request, ``tokens`` tokens, ``cost``
        micro-units, a lease named ``rid`` for ``lease_ms``) and record it under ``rid``. Raises
        ServiceUnavailable when the backend cannot answer in time (``NotSent``: the admission was
        never sent)."""

    async def settle(
        self, tenant: str, checks: Sequence[Check], rid: str, delta: int, cost_delta: int = 0
    ) -> None:
        """Correct the tokens ``rid`` charged by ``delta`` and its cost by ``cost_delta`` (each
        floored at 0) and release its leases; once (a settlement of an admission already settled
        or released changes nothing)."""

    async def release(
        self, tenant: str, checks: Sequence[Check], rid: str, tokens: int, cost: int = 0
    ) -> None:
        """Undo whatever admission ``rid`` (of ``checks``, ``tokens``, ``cost``) charged, if it ran;
        if it has not run yet, it never will charge. Idempotent."""

    def settle_nowait(
        self,
        tenant: str,
        checks: Sequence[Check],
        rid: str,
        delta: int,
        done: Callable[[bool], None],
        cost_delta: int = 0,
    ) -> bool:
        """``settle`` sent without waiting for it (``done(ok)`` reports it); False: not possible
        now, await ``settle`` instead."""

    async def aclose(self) -> None: ...


def needs_settling(checks: Sequence[Check]) -> bool:
    """A settlement has work: a lease to release, tokens to correct, a long-lived record to drop
    (an admission of request counts only is not settled: its counts stay, its record expires)."""
    return any(c.kind is not CheckKind.REQUESTS for c in checks)


def keep_ms(checks: Sequence[Check], lease_ms: int) -> int:
    """How long an admission's record lives (see the module docstring)."""
    return max(lease_ms, COUNT_MS) if needs_settling(checks) else COUNT_MS
