"""Tenancy limits, the policy: which limits apply to a request, the reservation before the upstream
call and its settlement at the end of the turn, the refusals and the figures of the
``x-ratelimit-*`` headers.

A key's limits (``auth.api_keys[].limits``) and its tenant's (``tenants.<name>.limits``) both apply,
so the stricter wins; so do a key's budget (``auth.api_keys[].budget``) and its tenant's. A budget
counts tokens, money (micro-units of the currency, at the model's prices:
``gateway/kernel/pricing.py``), or both, per UTC day, month, run of ``seconds``, or one
``start``–``end`` window (outside which it admits nothing that costs anything). The counters live
in ``state/limits/`` (in process, or in Redis when ``state.redis_url`` is set, shared by every
replica).

Tokens are reserved, then settled: ``Gateway.prepare`` reserves the estimated input tokens
(``gateway/kernel/estimate.py``) plus ``max_output_tokens`` (or ``limits.output_token_reservation``,
4096 by default) against the tokens-per-minute limits and the budgets, and the worst case of their
cost at the model's prices (``pricing.worst_case``) against the budgets in money, in the same
atomic admission as the request count and the concurrency lease, so concurrent requests (on any
replica) can never together pass a limit. The end-of-turn hook settles the charge to the real
usage (input + output; without usage, the estimate of what was produced) and its cost
(``pricing.cost``, the ledger's figure) and releases the lease; against Redis that round trip runs
beside the response rather than before it. A compacting request is admitted before
its summarizing call, which then charges only its own tokens.

No charge without an outcome: an admission this process never learns the outcome of (the request
task cancelled while it was in flight, a timeout, a lost connection: the command may still run on
the server) is released in the background, and so is a settlement that failed sent again, while
the limiter is down, until the lease's deadline (``_compensate``; the releases and settlements
themselves apply at most once, ``state/limits/base.py``). A lease lasts its request's deadline (the
route's ``total_seconds``, twice for a compacting request, the socket's age limit and drain for a
WebSocket connection) plus ``LEASE_MARGIN_SECONDS``.

When the limiter cannot answer (Redis down or slower than ``state.timeout_seconds``),
``limits.on_limiter_error`` decides: ``allow`` serves the request unlimited, ``deny`` refuses it
with 503. The outage is logged once when it starts and once when it ends, and counted
(``errors``, shown on /metrics).

An admission's figures (``_standing``: per dimension, the limit with the least left) travel as a
``RateStanding``, on the ``Reservation`` and on a refusal; the transport writes them as the
``x-ratelimit-*`` headers (``gateway/api/exchange.py`` ``rate_limit_headers``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import structlog

from gateway.engine.auth import Principal
from gateway.engine.telemetry import NOOP_OBSERVER, Observer
from gateway.kernel import pricing
from gateway.kernel.errors import QuotaExceeded, RateLimited, RateStanding, RateWindow, ServiceUnavailable
from gateway.kernel.ids import new_id
from gateway.kernel.settings import Budget, BudgetWindow, KeyLimits, Settings, TenantSettings, micros
from state.limits.base import WINDOWED, Check, CheckKind, Limiter, Outcome
from state.redis_lean import NotSent

log = structlog.get_logger("gateway.engine.limits")

Period = str | BudgetWindow  # a budget's period: "day", "month", or a window
_BUDGETS = (CheckKind.BUDGET, CheckKind.MONEY)
_FOREVER_MS = 10 * 365 * 86_400_000  # "until" of a window that has ended: it never renews

# a check's counter (its name's last part: a key's or its tenant's) → the ``limit`` of its refusal
_LIMIT_NAMES = {
    "rpm": "requests_per_minute",
    "tpm": "tokens_per_minute",
    "conc": "concurrent_requests",
    "ws": "websocket_connections",
}
_WHAT = {"rpm": "requests per minute", "tpm": "tokens per minute", "conc": "concurrent requests"}
# a lease outlives its request's deadline by this much (the hooks and the last sends after the call)
LEASE_MARGIN_SECONDS = 60.0
_MAX_PENDING = 10_000  # compensations waiting for the limiter: past this, new ones are given up
_RETRY_FIRST, _RETRY_MAX = 0.05, 2.0  # seconds between a compensation's tries


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
    """What an admission charged; ``settle_soon`` corrects and releases it (once)."""

    tenant: str
    checks: list[Check]
    rid: str
    tokens: int
    lease_ms: int
    standing: RateStanding | None  # None: no per-minute limit applies
    cost: int = 0  # micro-units charged against the budgets in money
    settled: bool = False


@dataclass(slots=True, frozen=True)
class BudgetUse:
    """One budget as it stands (``TenantLimiter.budget_use``). ``unit``: tokens, or micros
    (micro-units of the currency); ``limit`` 0: a start–end window that is not open;
    ``resets_in_ms`` None: a window that has ended."""

    scope: str  # key | tenant
    unit: str  # tokens | micros
    limit: int
    used: int
    label: str  # as a refusal names it
    resets_in_ms: int | None


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
        self.socket_seconds = settings.limits.ws_connection_seconds + settings.limits.ws_drain_seconds
        self.close_seconds = max(1.0, 2 * settings.state.timeout_seconds)
        self._clock = clock or time.time
        self.errors = 0  # limiter calls that failed (shown on /metrics)
        self._pending: set[asyncio.Task[None]] = set()
        # (tenant, key name) → its checks, labels, until when, and the key's limits and budget
        self._cache: dict[
            tuple[str, str | None],
            tuple[list[Check], list[str], float, KeyLimits | None, Budget | None],
        ] = {}
        self.currency = settings.currency
        # (tenant, a budget check's name) → its period, for the refusal's "renews in"
        self._periods: dict[tuple[str, str], Period] = {}
        self.down = False
        self._abandoning = False

    def _tenant(self, name: str) -> TenantSettings:
        return self.settings.tenants.get(name) or TenantSettings()

    # -- which limits ----------------------------------------------------------------------------
    def checks(self, principal: Principal) -> tuple[list[Check], list[str]]:
        """The counters a request of ``principal`` is admitted against, and what each one is (for
        the refusal's message); cached per key until the budget's period ends, or until the key
        comes with other limits or another budget (a key changed without a reload)."""
        ck = (principal.tenant, principal.key_name)  # a name names one key of a tenant (settings)
        hit = self._cache.get(ck)
        if (
            hit is not None
            and self._clock() < hit[2]
            and hit[3] is principal.limits
            and hit[4] is principal.budget
        ):
            return hit[0], hit[1]
        checks, labels, until = self._checks(principal)
        if len(self._cache) >= 10_000:
            self._cache.clear()
        self._cache[ck] = (checks, labels, until, principal.limits, principal.budget)
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
            ("requests_per_minute", CheckKind.REQUESTS, "rpm"),
            ("tokens_per_minute", CheckKind.TOKENS, "tpm"),
            ("concurrent_requests", CheckKind.CONCURRENCY, "conc"),
        ):
            limit = getattr(key, attr) if key is not None else None
            if limit is not None:
                checks.append(Check(kind, f"k:{principal.key_name}:{short}", limit))
                labels.append(f"{_WHAT[short]} of {key_label}: {limit}")
            limit = getattr(tenant.limits, attr)
            if limit is not None:
                checks.append(Check(kind, short, limit))
                labels.append(f"{_WHAT[short]} of {tenant_label}: {limit}")
        for budget, prefix, label in (
            (principal.budget, f"k:{principal.key_name}:", key_label),
            (tenant.budget, "", tenant_label),
        ):
            if budget is not None:
                until = min(
                    until, self._budget_checks(principal.tenant, budget, prefix, label, checks, labels)
                )
        return checks, labels, until

    def _budget_checks(
        self, tenant: str, budget: Budget, prefix: str, label: str, checks: list[Check], labels: list[str]
    ) -> float:
        """The checks of one budget (its tokens, its money); returns when they change (the period
        ends, or a window opens)."""
        name, left_ms, open_ = self._period(budget.period)
        per = _period_text(budget.period)
        if len(self._periods) >= 10_000:
            self._periods.clear()
        # extra: the counter's lifetime (at least the rest of the period)
        for kind, counter, limit, what in (
            (CheckKind.BUDGET, "budget", budget.tokens, f"token budget {per} of {label}: {budget.tokens}"),
            (
                CheckKind.MONEY,
                "money",
                None if budget.amount is None else micros(budget.amount),
                f"budget {per} of {label}: {budget.amount} {self.currency}",
            ),
        ):
            if limit is not None:
                check = Check(kind, f"{prefix}{counter}:{name}", limit if open_ else 0, left_ms)
                checks.append(check)
                labels.append(what)
                self._periods[(tenant, check.name)] = budget.period
        return self._clock() + left_ms / 1000 if left_ms < _FOREVER_MS else math.inf

    def _period(self, period: Period) -> tuple[str, int, bool]:
        """A budget period's counter name, the ms until it ends (a window not open yet: until it
        opens), and whether it is open (a ``start``–``end`` window may not be)."""
        at = self._clock()
        if isinstance(period, BudgetWindow):
            if period.seconds is not None:
                n = int(at // period.seconds)
                return f"s{period.seconds}:{n}", max(1, int(((n + 1) * period.seconds - at) * 1000)), True
            assert period.start is not None and period.end is not None  # BudgetWindow._one_form
            start, end = period.start.timestamp(), period.end.timestamp()
            name = f"w{int(start)}-{int(end)}"
            if at < start:
                return name, max(1, int((start - at) * 1000)), False
            if at >= end:
                return name, _FOREVER_MS, False
            return name, max(1, int((end - at) * 1000)), True
        now = dt.datetime.fromtimestamp(at, dt.UTC)
        if period == "day":
            start_d = now.replace(hour=0, minute=0, second=0, microsecond=0)
            end_d = start_d + dt.timedelta(days=1)
            name = start_d.strftime("%Y-%m-%d")
        else:
            start_d = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            end_d = (start_d + dt.timedelta(days=32)).replace(day=1)
            name = start_d.strftime("%Y-%m")
        return name, max(1, int((end_d - now).total_seconds() * 1000)), True

    def wants_tokens(self, checks: list[Check]) -> bool:
        """Whether an admission against ``checks`` needs its token estimate (a money budget
        prices it)."""
        return any(c.kind in (CheckKind.TOKENS, CheckKind.BUDGET, CheckKind.MONEY) for c in checks)

    @staticmethod
    def wants_money(checks: list[Check]) -> bool:
        return any(c.kind is CheckKind.MONEY for c in checks)

    # -- admission ---------------------------------------------------------------------------------
    async def reserve(
        self,
        principal: Principal,
        checks: list[Check],
        labels: list[str],
        tokens: int,
        *,
        seconds: float,
        cost: int = 0,
    ) -> Reservation | None:
        """Admit and charge, or raise the refusal. None: no limit applies, or the limiter is down
        and ``on_limiter_error`` is allow. ``seconds``: how long the request may run (its
        deadline): its lease, if one is taken, lasts that plus ``LEASE_MARGIN_SECONDS``.

        An admission whose outcome this caller never learns (it is cancelled while the call is in
        flight, the call times out or its connection drops) may still run on the server: it is
        released in the background (``_compensate``), never leaving a charge behind."""
        if not checks:
            return None
        rid = new_id("lim")
        lease_ms = int((seconds + LEASE_MARGIN_SECONDS) * 1000)
        tenant = principal.tenant
        try:
            out = await self.limiter.admit(tenant, checks, rid, tokens, lease_ms, cost)
        except NotSent:  # it never left: nothing to undo
            self._unavailable()
            return None
        except ServiceUnavailable:
            self._compensate(lambda: self.limiter.release(tenant, checks, rid, tokens, cost), lease_ms)
            self._unavailable()
            return None
        except BaseException:  # cancelled (the client left, a shutdown): the answer is lost
            self._compensate(lambda: self.limiter.release(tenant, checks, rid, tokens, cost), lease_ms)
            raise
        self._ok()
        standing = _standing(checks, out)
        if out.failed is not None:
            check = checks[out.failed]
            if check.kind in _BUDGETS:  # when the period ends (check.extra may be from earlier)
                period = self._periods.get((tenant, check.name), "day")
                check = replace(check, extra=self._period(period)[1])
            self.observer.rate_limited(tenant, _limit_name(check))
            raise _refusal(check, labels[out.failed], out, tokens, standing, cost, self.currency)
        return Reservation(tenant, checks, rid, tokens, lease_ms, standing, cost)

    def _unavailable(self) -> None:
        """The limiter could not answer: refused (deny), or served unlimited (allow)."""
        self._failed()
        if self.on_error == "deny":
            raise ServiceUnavailable(
                "The rate limiter is unavailable, so this request was not admitted; retry shortly."
            )

    async def settle_soon(self, res: Reservation, actual: int, actual_cost: int = 0) -> None:
        """Correct the charge to ``actual`` tokens and ``actual_cost`` micro-units and release the
        lease, once. When the limiter is remote the response does not wait for the round trip (a
        settlement only lowers a charge or releases a lease, so the next request seeing it a moment
        late is refused at worst, never admitted wrongly), and a settlement that fails is sent
        again while the limiter is down (a settlement applies at most once:
        ``state/limits/base.py``). Safe to call from a cancelled task: it never waits on the
        network."""
        if res.settled:
            return
        res.settled = True
        lim, delta, money = self.limiter, actual - res.tokens, actual_cost - res.cost
        if not lim.remote:
            await lim.settle(res.tenant, res.checks, res.rid, delta, money)
            return

        def again() -> Awaitable[None]:
            return lim.settle(res.tenant, res.checks, res.rid, delta, money)

        def done(ok: bool) -> None:
            if ok:
                self._ok()
            else:
                self._compensate(again, res.lease_ms)

        if not lim.settle_nowait(res.tenant, res.checks, res.rid, delta, done, money):
            self._compensate(again, res.lease_ms)

    def _compensate(self, call: Callable[[], Awaitable[None]], lease_ms: int) -> None:
        """Run ``call`` (a release or a settlement) in the background, again and again while the
        limiter cannot answer, until it lands or the lease it is about has expired anyway."""
        if len(self._pending) >= _MAX_PENDING:
            self._abandon("too_many")
            return
        task = asyncio.ensure_future(self._until_done(call, lease_ms / 1000))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _until_done(self, call: Callable[[], Awaitable[None]], seconds: float) -> None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + seconds
        pause = _RETRY_FIRST
        while True:
            try:
                await call()
            except ServiceUnavailable:
                if loop.time() + pause >= give_up:
                    self._abandon("deadline")
                    return
                await asyncio.sleep(pause)
                pause = min(pause * 2, _RETRY_MAX)
            else:
                self._ok()
                return

    def _abandon(self, why: str) -> None:
        """Logged once until the limiter answers again (an outage may abandon many)."""
        if not self._abandoning:
            self._abandoning = True
            log.warning("limiter_compensation_abandoned", reason=why)

    async def aclose(self) -> None:
        """Give the compensations in flight a moment (``close_seconds``) to land, then stop."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=self.close_seconds)
            for task in list(self._pending):
                task.cancel()
        await self.limiter.aclose()

    async def open_socket(self, principal: Principal) -> Reservation | None:
        """A WebSocket connection's lease (tenants.<name>.limits.websocket_connections), for the
        connection's lifetime (its age limit and the drain)."""
        limit = self._tenant(principal.tenant).limits.websocket_connections
        if limit is None:
            return None
        check = Check(CheckKind.CONCURRENCY, "ws", limit)
        label = f"open WebSocket connections of tenant '{principal.tenant}': {limit}"
        return await self.reserve(principal, [check], [label], 0, seconds=self.socket_seconds)

    # -- reading -----------------------------------------------------------------------------------
    async def budget_use(self, principal: Principal) -> list[BudgetUse]:
        """Every budget a request of ``principal`` is checked against (its key's, its tenant's; a
        ``Principal(tenant)`` without a key: the tenant's alone), as it stands now: read by an
        admission that charges nothing (and is settled at once), so it is the same counter on
        every replica. Raises ServiceUnavailable when the limiter cannot answer."""
        checks, labels = self.checks(principal)
        kept = [n for n, c in enumerate(checks) if c.kind in _BUDGETS]
        if not kept:
            return []
        budgets = [checks[n] for n in kept]
        rid = new_id("lim")
        out = await self.limiter.admit(principal.tenant, budgets, rid, 0, int(LEASE_MARGIN_SECONDS * 1000), 0)
        await self.limiter.settle(principal.tenant, budgets, rid, 0, 0)
        return [
            BudgetUse(
                scope="key" if c.name.startswith("k:") else "tenant",
                unit="micros" if c.kind is CheckKind.MONEY else "tokens",
                limit=c.limit,
                used=used,
                label=labels[n],
                resets_in_ms=c.extra if c.extra < _FOREVER_MS else None,
            )
            for n, c, used in zip(kept, budgets, out.used, strict=True)
        ]

    # -- outages ---------------------------------------------------------------------------------
    def _failed(self) -> None:
        self.errors += 1
        self.observer.limiter_error()
        if not self.down:
            self.down = True
            log.warning("limiter_unavailable", on_limiter_error=self.on_error)

    def _ok(self) -> None:
        self._abandoning = False
        if self.down:
            self.down = False
            log.info("limiter_available")


def _limit_name(check: Check) -> str:
    if check.kind in _BUDGETS:
        return "budget"
    return _LIMIT_NAMES.get(check.name.rpartition(":")[2], "_other")


def _standing(checks: list[Check], out: Outcome) -> RateStanding | None:
    """Whenever a per-minute limit applies: for requests and for tokens, the limit with the least
    left (the key's or the tenant's); None for a dimension no limit applies to."""
    best: dict[CheckKind, RateWindow] = {}
    for i in range(len(out.used)):
        c = checks[i]
        if c.kind in WINDOWED:
            left = c.limit - out.used[i]
            have = best.get(c.kind)
            if have is None or left < have.remaining:
                best[c.kind] = RateWindow(c.limit, left if left > 0 else 0, out.reset_ms[i])
    if not best and not any(c.kind in WINDOWED for c in checks):
        return None
    return RateStanding(best.get(CheckKind.REQUESTS), best.get(CheckKind.TOKENS))


def _period_text(period: Period) -> str:
    if not isinstance(period, BudgetWindow):
        return f"per {period}"
    if period.seconds is not None:
        return f"per {period.seconds} s"
    assert period.start is not None and period.end is not None
    return f"from {_utc(period.start)} to {_utc(period.end)}"


def _utc(at: dt.datetime) -> str:
    return at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _refusal(
    check: Check,
    label: str,
    out: Outcome,
    tokens: int,
    standing: RateStanding | None,
    cost: int = 0,
    currency: str = "USD",
) -> RateLimited:
    never = out.retry_ms < 0
    retry = 60.0 if never else max(1.0, math.ceil(out.retry_ms / 1000))
    if check.kind in _BUDGETS:
        money = check.kind is CheckKind.MONEY
        renews = check.extra < _FOREVER_MS
        retry = max(1.0, math.ceil(check.extra / 1000)) if renews else 86_400.0
        if check.limit == 0:  # a start–end window that is not open
            when = f"it opens in {reset_text(check.extra)}" if renews else "it has ended"
            msg = f"The {label} is not open: {when}."
        elif never:
            asked = (
                f"worst-case cost of {pricing.text(cost)} {currency} exceeds"
                if money
                else f"estimated {tokens} tokens exceed"
            )
            msg = f"This request's {asked} the {label}; send less input or a lower max_output_tokens."
        else:
            what = "Budget" if money else "Token budget"
            msg = f"{what} exhausted: {label}; it renews in {reset_text(check.extra)}."
            if not renews:
                msg = f"{what} exhausted: {label}."
        return QuotaExceeded(msg, retry_after=retry, standing=standing)
    if never:
        msg = (
            f"This request's estimated {tokens} tokens exceed the limit on {label}; send less input "
            "or a lower max_output_tokens."
        )
    else:
        msg = f"Rate limit reached for {label}. Retry in {reset_text(out.retry_ms)}."
    return RateLimited(msg, retry_after=retry, standing=standing)
