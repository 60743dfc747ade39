"""The usage ledger: counters per tenant, UTC day, key name and model; never any content.

Each row counts ``METRICS``: requests, errors, input and output tokens, the cached (a part of
input) and reasoning (a part of output) tokens, and the cost in micro-units of the currency.
``MemoryLedger`` keeps them in process, bounded (the oldest days go first); ``RedisLedger``
(``state/redis_usage.py``) keeps one hash per tenant and day.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

# cost_micros: the turns' cost, integer micro-units of the configured currency (gateway/kernel/pricing.py)
METRICS = (
    "requests",
    "errors",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "cost_micros",
)
RETENTION_DAYS = 400  # how long a day's counters are kept


@dataclass(slots=True, frozen=True)
class UsageRow:
    tenant: str
    day: str  # YYYY-MM-DD, UTC
    key: str  # the key's name ("" without client keys)
    model: str
    counts: dict[str, int]


class UsageLedger(Protocol):
    async def add(self, tenant: str, day: str, key: str, model: str, counts: dict[str, int]) -> None:
        """Add ``counts`` (a subset of METRICS) to the row; raises ServiceUnavailable when the
        backend is down."""

    async def read(self, tenants: Iterable[str], days: list[str]) -> list[UsageRow]:
        """Every row of those tenants on those days."""

    async def aclose(self) -> None: ...


class MemoryLedger:
    """In process, at most ``max_rows`` rows: past it, the oldest day's rows are dropped."""

    def __init__(self, max_rows: int = 100_000) -> None:
        self.max_rows = max_rows
        self._days: dict[str, dict[tuple[str, str, str], dict[str, int]]] = {}
        self._rows = 0

    async def add(self, tenant: str, day: str, key: str, model: str, counts: dict[str, int]) -> None:
        self.add_now(tenant, day, key, model, counts)

    def add_now(self, tenant: str, day: str, key: str, model: str, counts: dict[str, int]) -> None:
        """``add`` without a coroutine: in process nothing waits, and this runs on every turn."""
        rows = self._days.setdefault(day, {})
        row = rows.get((tenant, key, model))
        if row is None:
            row = rows[(tenant, key, model)] = dict.fromkeys(METRICS, 0)
            self._rows += 1
            while self._rows > self.max_rows and len(self._days) > 1:
                oldest = min(self._days)
                self._rows -= len(self._days.pop(oldest))
        for name, n in counts.items():
            row[name] += n

    async def read(self, tenants: Iterable[str], days: list[str]) -> list[UsageRow]:
        wanted = set(tenants)
        return [
            UsageRow(tenant, day, key, model, dict(counts))
            for day in days
            for (tenant, key, model), counts in self._days.get(day, {}).items()
            if tenant in wanted
        ]

    async def aclose(self) -> None:
        return None
