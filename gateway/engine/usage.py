"""Metering: what each turn cost, into the usage ledger (``state/usage.py``), and the report
``GET /v1/usage`` reads back.

One row per tenant, UTC day, key name and model (the name the client asked for). A turn adds one
request, one error when it failed, and the tokens of the ``usage`` its response carries: input and
output, and within them cached (part of input) and reasoning (part of output) tokens, so a total is
input + output, never more. Every turn ``Gateway.prepare`` makes is metered by its end-of-turn hook,
except compaction's summarizing call, whose usage ``/v1/responses/compact`` returns and meters itself.

A row also adds each turn's cost (``cost_micros``: integer micro-units of ``currency``, the model's
``price`` applied to that same usage by ``gateway/kernel/pricing.py``, rounded down per turn), so a
row's cost is exactly the sum of its turns' costs; the report gives it as ``cost_micros`` and as a
decimal string ``cost``. The spend is counted on ``gateway_spend_total{tenant,model}`` too.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from datetime import date, timedelta
from typing import Any

import structlog

from gateway.engine.auth import Principal
from gateway.engine.telemetry import NOOP_OBSERVER, Observer
from gateway.engine.turn import TurnHook, TurnResult
from gateway.kernel import pricing
from gateway.kernel.errors import GatewayError
from gateway.kernel.pricing import FREE, ModelPrice
from state.usage import METRICS, MemoryLedger, UsageLedger, UsageRow

log = structlog.get_logger("gateway.engine.usage")

GROUPS = ("model", "key", "day")


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def counts_of(
    usage: Mapping[str, Any] | None, *, failed: bool, price: ModelPrice = FREE, cache_write: int = 0
) -> dict[str, int]:
    """The ledger counts of one request whose response carried ``usage`` (the builder's own,
    or compaction's: well-formed, so read as it is; a value that is not a count is 0), and its
    cost at ``price``."""
    if not usage:
        return {**_NONE, "errors": int(failed)}
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    reasoning = (usage.get("output_tokens_details") or {}).get("reasoning_tokens")
    return {
        "requests": 1,
        "errors": int(failed),
        "input_tokens": _int(usage.get("input_tokens")),
        "output_tokens": _int(usage.get("output_tokens")),
        "cached_tokens": _int(cached) if cached else 0,
        "reasoning_tokens": _int(reasoning) if reasoning else 0,
        "cost_micros": pricing.cost(price, usage, cache_write),
    }


_NONE = {
    "requests": 1,
    "errors": 0,
    "input_tokens": 0,
    "output_tokens": 0,
    "cached_tokens": 0,
    "reasoning_tokens": 0,
    "cost_micros": 0,
}


_DAY: list[Any] = [-1, ""]  # the last UTC day number seen, and its name


def utc_day(at: float | None = None) -> str:
    """The UTC date of ``at`` (now), as YYYY-MM-DD; the current day's name is computed once."""
    now = time.time() if at is None else at
    n = int(now // 86400)
    if n != _DAY[0]:
        if at is not None:
            return time.strftime("%Y-%m-%d", time.gmtime(now))
        _DAY[0], _DAY[1] = n, time.strftime("%Y-%m-%d", time.gmtime(now))
    return str(_DAY[1])


class Meter:
    def __init__(
        self,
        ledger: UsageLedger,
        prices: Mapping[str, ModelPrice] | None = None,
        observer: Observer = NOOP_OBSERVER,
        currency: str = "USD",
    ) -> None:
        self.ledger = ledger
        self.prices = prices or {}
        self.observer = observer
        self.currency = currency

    async def record(
        self, principal: Principal, model: str, usage: Mapping[str, Any] | None, *, failed: bool
    ) -> None:
        """Count one request. A ledger that is down loses this count (logged), never the response."""
        counts = counts_of(usage, failed=failed, price=self.prices.get(model, FREE))
        self._spent(principal.tenant, model, counts)
        try:
            await self.ledger.add(principal.tenant, utc_day(), principal.key_name or "", model, counts)
        except GatewayError as exc:
            log.warning("usage_not_recorded", tenant=principal.tenant, model=model, code=exc.code)

    def cost(self, model: str, result: TurnResult) -> int:
        """A turn's cost in micro-units: the ledger's figure (what ``x-gateway-cost`` shows)."""
        return pricing.cost(self.prices.get(model, FREE), result.usage, result.cache_write_tokens)

    def _spent(self, tenant: str, model: str, counts: dict[str, int]) -> None:
        if counts["cost_micros"]:
            self.observer.spend(tenant, model, counts["cost_micros"])

    def hook(self, principal: Principal, model: str) -> TurnHook:
        """The end-of-turn hook that meters a turn (added last in ``Gateway.prepare``, so it sees
        the outcome the client sees, a failed store write included)."""

        ledger, tenant, key = self.ledger, principal.tenant, principal.key_name or ""
        price, spent = self.prices.get(model, FREE), self._spent

        def counts(result: TurnResult) -> dict[str, int]:
            found = counts_of(
                result.usage,
                failed=result.status == "failed",
                price=price,
                cache_write=result.cache_write_tokens,
            )
            spent(tenant, model, found)
            return found

        if isinstance(ledger, MemoryLedger):
            add_now = ledger.add_now

            def meter_now(result: TurnResult) -> None:
                add_now(tenant, utc_day(), key, model, counts(result))

            return meter_now

        async def meter(result: TurnResult) -> None:
            found = counts(result)
            try:
                await ledger.add(tenant, utc_day(), key, model, found)
            except GatewayError as exc:
                log.warning("usage_not_recorded", tenant=tenant, model=model, code=exc.code)

        return meter

    async def report(self, tenants: Iterable[str], start: date, end: date, group_by: str) -> dict[str, Any]:
        """The rows of ``tenants`` from ``start`` to ``end`` (UTC days, inclusive), summed per
        tenant and ``group_by`` (model | key | day), with their totals."""
        days = [(start + timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]
        rows = await self.ledger.read(sorted(set(tenants)), days)
        groups: dict[tuple[str, str], dict[str, int]] = {}
        total = dict.fromkeys(METRICS, 0)
        for row in rows:
            sums = groups.setdefault((row.tenant, _group(row, group_by)), dict.fromkeys(METRICS, 0))
            for name in METRICS:
                sums[name] += row.counts.get(name, 0)
                total[name] += row.counts.get(name, 0)
        data = [
            {"tenant": tenant, group_by: value or None, **_shape(sums)}
            for (tenant, value), sums in sorted(groups.items())
        ]
        return {
            "object": "usage",
            "start": start.isoformat(),
            "end": end.isoformat(),
            "group_by": group_by,
            "currency": self.currency,
            "data": data,
            "totals": _shape(total),
        }


def _group(row: UsageRow, group_by: str) -> str:
    return row.model if group_by == "model" else row.key if group_by == "key" else row.day


def _shape(c: dict[str, int]) -> dict[str, Any]:
    return {
        "requests": c["requests"],
        "errors": c["errors"],
        "input_tokens": c["input_tokens"],
        "output_tokens": c["output_tokens"],
        "total_tokens": c["input_tokens"] + c["output_tokens"],
        "input_tokens_details": {"cached_tokens": c["cached_tokens"]},
        "output_tokens_details": {"reasoning_tokens": c["reasoning_tokens"]},
        "cost_micros": c["cost_micros"],
        "cost": pricing.text(c["cost_micros"]),
    }
