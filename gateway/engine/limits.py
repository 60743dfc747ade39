"""Tenancy limits, the policy: which limits apply to a request, the reservation before the upstream
call and its settlement at the end of the turn, the refusals and the ``x-ratelimit-*`` headers.

A key's limits (``auth.api_keys[].limits``) and its tenant's (``tenants.<name>.limits``) both apply,
so the stricter wins; a budget is the tenant's. The counters live in ``state/limits.py`` (in process,
or in Redis when ``state.redis_url`` is set, shared by every replica).

Tokens are reserved, then settled: ``Gateway.prepare`` reserves the estimated input tokens
(``gateway/kernel/estimate.py``) plus ``max_output_tokens`` (or ``limits.output_token_reservation``,
4096 by default) against the tokens-per-minute limits and the budget, in the same atomic admission
as the request count and the concurrency lease, so concurrent requests (on any replica) can never
together pass a limit. The end-of-turn hook settles the charge to the real usage (input + output;
without usage, the estimate of what was produced) and releases the lease; against Redis that
round trip runs beside the response rather than before it.

When the limiter cannot answer (Redis down or slower than ``state.timeout_seconds``),
``limits.on_limiter_error`` decides: ``allow`` serves the request unlimited, ``deny`` refuses it
with 503. The outage is logged once when it starts and once when it ends, and counted
(``errors``, shown on /metrics).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

import structlog

from gateway.engine.auth import Principal
from gateway.engine.telemetry import NOOP_OBSERVER, Observer
from gateway.kernel.errors import QuotaExceeded, RateLimited, ServiceUnavailable
from gateway.kernel.ids import new_id
from gateway.kernel.settings import Settings, TenantSettings
from state.limits import Check, Limiter, Outcome

log = structlog.get_logger("gateway.engine.limits")

# a check's counter (its name's last part: a key's or its tenant's) → the ``limit`` of its refusal
_LIMIT_NAMES = {
    "rpm": "requests_per_minute",
    "tpm": "tokens_per_minute",
    "conc": "concurrent_requests",
    "ws": "websocket_connections",
}
_WHAT = {"rpm": "requests per minute", "tpm": "tokens per minute", "conc": "concurrent requests"}


def reset_text(ms: int) -> str:
    """A duration as OpenAI's ``x-ratelimit-reset-*`` headers write it: "120ms", "6s", "1.5s",
    "1m0s", "1h2m3s"."""
    ms = max(0, ms)
    if ms < 1000:
        return f"{ms}ms"
    total = ms / 1000
    hours, rest = divmod(int(total), 3600)
    minutes = rest // 60
    seconds = total - hours * 3600 - minutes * 60
    secs = f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    if minutes:
        return f"{minutes}m{secs}"
    return secs


@dataclass(slots=True)
class Reservation:
    """What an admission charged; ``settle`` corrects and releases it (once)."""

    tenant: str
    checks: list[Check]
    rid: str
    tokens: int
    second: int
    headers: dict[str, str]
    settled: bool = False


class TenantLimiter:
    def __init__(
        self,
        settings: Settings,
        limiter: Limiter,
        clock: Callable[[], float] | None = None,
        observer: Observer = NOOP_OBSERVER,
    ) -> None:
        self.settings = settings
        self.observer = observer
        self.limiter = limiter
        self.on_error = settings.limits.on_limiter_error
        self.output_reservation = settings.limits.output_token_reservation
        self.lease_ms = int(
            max((p.timeouts.total for p in settings.provider_table().values()), default=600.0) * 1000 + 60_000
        )
        self.socket_lease_ms = int(
            (settings.limits.ws_connection_seconds + settings.limits.ws_drain_seconds + 60) * 1000
        )
        self._clock = clock or time.time
        self.errors = 0  # limiter calls that failed (shown on /metrics)
        self._pending: set[asyncio.Task[None]] = set()
        self._cache: dict[tuple[str, str | None], tuple[list[Check], list[str], float]] = {}
        self.down = False

    def _tenant(self, name: str) -> TenantSettings:
        return self.settings.tenants.get(name) or TenantSettings()

    # -- which limits ----------------------------------------------------------------------------
    def checks(self, principal: Principal) -> tuple[list[Check], list[str]]:
        """The counters a request of ``principal`` is admitted against, and what each one is (for
        the refusal's message); cached per key until the budget's period ends."""
        ck = (principal.tenant, principal.key_name)  # a name names one key of a tenant (settings)
        hit = self._cache.get(ck)
        if hit is not None and self._clock() < hit[2]:
            return hit[0], hit[1]
        checks, labels, until = self._checks(principal)
        if len(self._cache) >= 10_000:
            self._cache.clear()
        self._cache[ck] = (checks, labels, until)
        return checks, labels

    def _checks(self, principal: Principal) -> tuple[list[Check], list[str], float]:
        tenant = self._tenant(principal.tenant)
        until = math.inf
        checks: list[Check] = []
        labels: list[str] = []
        key = principal.limits
        key_label = f"this API key ({principal.key_name})"
        tenant_label = f"tenant '{principal.tenant}'"
        for attr, kind, short in (
            ("requests_per_minute", "r", "rpm"),
            ("tokens_per_minute", "t", "tpm"),
            ("concurrent_requests", "c", "conc"),
        ):
            extra = self.lease_ms if kind == "c" else 0
            limit = getattr(key, attr) if key is not None else None
            if limit is not None:
                checks.append(Check(kind, f"k:{principal.key_name}:{short}", limit, extra))  # type: ignore[arg-type]
                labels.append(f"{_WHAT[short]} of {key_label}: {limit}")
            limit = getattr(tenant.limits, attr)
            if limit is not None:
                checks.append(Check(kind, short, limit, extra))  # type: ignore[arg-type]
                labels.append(f"{_WHAT[short]} of {tenant_label}: {limit}")
        if tenant.budget is not None:
            period, left_ms = self._period(tenant.budget.period)
            # extra: the key's lifetime (at least the rest of the period)
            checks.append(Check("b", f"budget:{period}", tenant.budget.tokens, left_ms))
            labels.append(
                f"token budget per {tenant.budget.period} of {tenant_label}: {tenant.budget.tokens}"
            )
            until = self._clock() + left_ms / 1000
        return checks, labels, until

    def _period(self, period: str) -> tuple[str, int]:
        now = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
        if period == "day":
            start = now.replace(hour=0, minute=0, second=0, microsecond=0)
            end = start + dt.timedelta(days=1)
            name = start.strftime("%Y-%m-%d")
        else:
            start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            end = (start + dt.timedelta(days=32)).replace(day=1)
            name = start.strftime("%Y-%m")
        return name, max(1, int((end - now).total_seconds() * 1000))

    def wants_tokens(self, checks: list[Check]) -> bool:
        return any(c.kind in "tb" for c in checks)

    # -- admission ---------------------------------------------------------------------------------
    async def reserve(
        self, principal: Principal, checks: list[Check], labels: list[str], tokens: int
    ) -> Reservation | None:
        """Admit and charge, or raise the refusal. None: no limit applies, or the limiter is down
        and ``on_limiter_error`` is allow."""
        if not checks:
            return None
        rid = new_id("lim")
        try:
            out = await self.limiter.admit(principal.tenant, checks, rid, tokens)
        except ServiceUnavailable:
            self._failed()
            if self.on_error == "deny":
                raise ServiceUnavailable(
                    "The rate limiter is unavailable, so this request was not admitted; retry shortly."
                ) from None
            return None
        self._ok()
        headers = _headers(checks, out)
        if out.failed is not None:
            check = checks[out.failed]
            if check.kind == "b":  # when the period ends (check.extra may be from earlier)
                budget = self._tenant(principal.tenant).budget
                check = replace(check, extra=self._period(budget.period if budget else "day")[1])
            self.observer.rate_limited(principal.tenant, _limit_name(check))
            raise _refusal(check, labels[out.failed], out, tokens, headers)
        return Reservation(principal.tenant, checks, rid, tokens, out.second, headers)

    async def settle_soon(self, res: Reservation, actual: int) -> None:
        """``settle``, off the caller's path when the limiter is remote: the response does not wait
        for the round trip (a settlement only lowers a charge or releases a lease, so the next
        request seeing it a moment late is refused at worst, never admitted wrongly)."""
        if not self.limiter.remote:
            await self.settle(res, actual)
            return
        if res.settled:
            return
        delta = actual - res.tokens

        def done(ok: bool) -> None:
            if ok:
                self._ok()
            else:
                # Release the leases once more, awaited on a fresh connection (a lost one would
                # hold for minutes); the tokens stay as reserved, as the first try may have landed.
                res.settled = False
                self._spawn(self.settle(res, res.tokens))

        if self.limiter.settle_nowait(res.tenant, res.checks, res.rid, delta, res.second, done):
            res.settled = True
            return
        self._spawn(self.settle(res, actual))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def aclose(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        await self.limiter.aclose()

    async def settle(self, res: Reservation, actual: int) -> None:
        if res.settled:
            return
        res.settled = True
        try:
            await self.limiter.settle(res.tenant, res.checks, res.rid, actual - res.tokens, res.second)
        except ServiceUnavailable:
            self._failed()  # the lease expires by itself; the tokens stay charged as reserved
        else:
            self._ok()

    async def open_socket(self, principal: Principal) -> Reservation | None:
        """A WebSocket connection's lease (tenants.<name>.limits.websocket_connections)."""
        limit = self._tenant(principal.tenant).limits.websocket_connections
        if limit is None:
            return None
        check = Check("c", "ws", limit, self.socket_lease_ms)
        return await self.reserve(
            principal, [check], [f"open WebSocket connections of tenant '{principal.tenant}': {limit}"], 0
        )

    # -- outages ---------------------------------------------------------------------------------
    def _failed(self) -> None:
        self.errors += 1
        self.observer.limiter_error()
        if not self.down:
            self.down = True
            log.warning("limiter_unavailable", on_limiter_error=self.on_error)

    def _ok(self) -> None:
        if self.down:
            self.down = False
            log.info("limiter_available")


def _limit_name(check: Check) -> str:
    if check.kind == "b":
        return "budget"
    return _LIMIT_NAMES.get(check.name.rpartition(":")[2], "_other")


def _headers(checks: list[Check], out: Outcome) -> dict[str, str]:
    """The ``x-ratelimit-*`` headers: for requests and for tokens, the per-minute limit with the
    least left (the key's or the tenant's)."""
    best: dict[str, tuple[int, int, int]] = {}  # kind: remaining, limit, reset
    for i in range(len(out.used)):
        c = checks[i]
        if c.kind == "r" or c.kind == "t":
            left = c.limit - out.used[i]
            have = best.get(c.kind)
            if have is None or left < have[0]:
                best[c.kind] = (left if left > 0 else 0, c.limit, out.reset_ms[i])
    headers: dict[str, str] = {}
    for kind, what in (("r", "requests"), ("t", "tokens")):
        if kind in best:
            left, limit, reset = best[kind]
            headers[f"x-ratelimit-limit-{what}"] = str(limit)
            headers[f"x-ratelimit-remaining-{what}"] = str(left)
            headers[f"x-ratelimit-reset-{what}"] = reset_text(reset)
    return headers


def _refusal(check: Check, label: str, out: Outcome, tokens: int, headers: dict[str, str]) -> RateLimited:
    never = out.retry_ms < 0
    retry = 60.0 if never else max(1.0, math.ceil(out.retry_ms / 1000))
    if check.kind == "b":
        retry = max(1.0, math.ceil(check.extra / 1000))
        if never:
            msg = f"This request's estimated {tokens} tokens exceed the {label}."
        else:
            msg = f"Token budget exhausted: {label}; it renews in {reset_text(check.extra)}."
        return QuotaExceeded(msg, retry_after=retry, headers=headers)
    if never:
        msg = (
            f"This request's estimated {tokens} tokens exceed the limit on {label}; send less input "
            "or a lower max_output_tokens."
        )
    else:
        msg = f"Rate limit reached for {label}. Retry in {reset_text(out.retry_ms)}."
    return RateLimited(msg, retry_after=retry, headers=headers)
