"""The orchestrator: turns a validated create request into a ready ``Turn``, in one pass.

Route it (the route carries its fallbacks and retry policy), assemble its context (the chain,
references, opened compaction items, the new input), fit the context into the window (the
injected ``fit_context`` hook), then derive the ResponseResource and the upstream request from one
read of the request (``Echoes``). A ``store: true`` turn's write-ahead record is written once its
context is read, before any upstream spend (``store_health.py``: a store that cannot take it is a
503 with nothing generated); the store write is its first end-of-turn hook. Every turn is
metered by its last (``usage.py``). A ``retention: none`` tenant's turns are never stored. HTTP,
the WebSocket and compaction's summarizing call all come through ``Gateway.prepare``; the engine
knows compaction only through the three injected hooks (``open_compaction``, ``fit_context``, and
``compact_context`` for ``context_management``).

``generate: false`` (a warm-up) is prepared like any turn and run by the same runner and hooks,
as a ``Warmup`` turn that opens no upstream: it is neither compacted nor charged tokens, and counts
against the request-rate and concurrency limits only.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from gateway.engine.auth import Authenticator, Principal
from gateway.engine.background import LEASE_SECONDS
from gateway.engine.context import CompactionOpener, Context, build_context
from gateway.engine.hosted import HostedTools
from gateway.engine.hosted import plan as hosted_plan
from gateway.engine.limits import Reservation, TenantLimiter
from gateway.engine.observed_store import ObservedStore
from gateway.engine.resource import Echoes, new_resource
from gateway.engine.routing import Route, Router
from gateway.engine.store_health import StoreHealth
from gateway.engine.telemetry import NOOP_OBSERVER, NOOP_TRACER, Observer, Tracer
from gateway.engine.turn import Turn, TurnResult, Warmup
from gateway.engine.upstream import upstream_request
from gateway.engine.usage import Meter
from gateway.engine.vkeys import VirtualKeys
from gateway.kernel import pricing
from gateway.kernel.errors import (
    ContextLengthExceeded,
    ErrorCode,
    GatewayError,
    InvalidRequest,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    UpstreamError,
)
from gateway.kernel.estimate import estimate, estimate_bytes, estimate_text
from gateway.kernel.ids import response_id
from gateway.kernel.pricing import FREE, ModelPrice, price_table
from gateway.kernel.settings import Settings
from gateway.kernel.spec.request import CreateResponseBody, FunctionTool, McpTool
from state.background import BackgroundLog, MemoryBackgroundLog
from state.base import ConnectionCache, PendingResponse, ResponseStore, StoredResponse
from state.limits.base import Check, CheckKind, Limiter
from state.limits.memory import MemoryLimiter
from state.usage import MemoryLedger, UsageLedger

if TYPE_CHECKING:
    from adapters.mcp import McpHost

# Admits the request whose context is being compacted, before the summarizing call: its argument is
# the estimate, in tokens, of the compacted context (Gateway.prepare adds the output reservation).
Admit = Callable[[int], Awaitable[None]]


def ended(result: TurnResult) -> None:
    """A background response that did not complete, as it is kept: failed (with its error) or
    cancelled, never left ``in_progress``."""
    res = result.resource
    if res["status"] in ("queued", "in_progress"):
        res["status"] = "cancelled" if result.status == "cancelled" else "failed"
    err = result.error
    if res["status"] == "failed" and res.get("error") is None:
        res["error"] = (err or ServerError("The response ended before it was generated.")).response_error()


# what a request's tokens are charged against (its request count and lease are apart)
_SPEND = (CheckKind.TOKENS, CheckKind.BUDGET, CheckKind.MONEY)


def _only(checks: list[Check], labels: list[str], *kinds: CheckKind) -> tuple[list[Check], list[str]]:
    kept = [n for n, c in enumerate(checks) if c.kind in kinds]
    return [checks[n] for n in kept], [labels[n] for n in kept]


class ContextFitter(Protocol):
    def __call__(
        self, ctx: Context, route: Route, truncation: str, *, reserved: int = 0, window: int | None = None
    ) -> Context: ...


# The share of the upstream's window a re-fit aims at: the estimate's error is not even across a
# context, and the oldest items it drops may be denser or lighter than the average.
REFIT_MARGIN = 0.9


class Refit:
    """``truncation: "auto"`` once more, after the upstream refused the context as too long
    (``Turn``'s ``refit``): the window is cut by the upstream's count over the estimate, so that
    what the upstream counted fits its window (``UpstreamError.context_limit``, else the route's).
    None when the upstream gave no count or nothing more can be dropped: its error stands."""

    __slots__ = ("fit", "observer", "reserved", "route")

    def __init__(self, fit: ContextFitter, route: Route, reserved: int, observer: Observer) -> None:
        self.fit, self.route, self.reserved, self.observer = fit, route, reserved, observer

    def window(self, ctx: Context, exc: UpstreamError) -> int | None:
        """The window, in the estimator's tokens, that the context must fit this time."""
        reported = exc.prompt_tokens
        estimated = ctx.estimated_tokens() + self.reserved
        if not reported or estimated <= 0:
            return None
        limit = min(exc.context_limit or self.route.context_window, self.route.context_window)
        window = int(limit * REFIT_MARGIN * estimated / reported)
        return window if window < estimated else None

    def __call__(self, ctx: Context, exc: UpstreamError) -> Context | None:
        window = self.window(ctx, exc)
        if window is None:
            return None
        try:
            fitted = self.fit(ctx, self.route, "auto", reserved=self.reserved, window=window)
        except ContextLengthExceeded:
            return None
        if fitted is ctx:
            return None
        self.observer.compaction("truncation")
        return fitted


class ContextCompactor(Protocol):
    """``context_management``: the compacted context and the sealed ``compaction`` item to announce,
    or None when the context stays as it is (compact/inline.py). It calls ``admit`` before it
    calls the model (and not when it returns None)."""

    def __call__(
        self,
        gw: Gateway,
        ctx: Context,
        body: CreateResponseBody,
        principal: Principal,
        route: Route,
        *,
        reserved: int = 0,
        request_id: str | None = None,
        admit: Admit,
    ) -> Awaitable[tuple[Context, dict[str, Any]] | None]: ...


class Gateway:
    def __init__(
        self,
        settings: Settings,
        *,
        router: Router,
        store: ResponseStore,
        open_compaction: CompactionOpener | None = None,
        fit_context: ContextFitter | None = None,
        compact_context: ContextCompactor | None = None,
        ledger: UsageLedger | None = None,
        limiter: Limiter | None = None,
        background_log: BackgroundLog | None = None,
        observer: Observer = NOOP_OBSERVER,
        tracer: Tracer = NOOP_TRACER,
        mcp: McpHost | None = None,
        virtual_keys: VirtualKeys | None = None,
    ) -> None:
        self.settings = settings
        self.mcp = mcp  # the MCP client of hosted tools (hosted.py); None: MCP tools refused
        self.router = router
        self.observer = observer  # metrics (gateway/engine/telemetry.py)
        self.tracer = tracer
        self.raw_store = store  # unobserved: what a reload's successor wraps again
        self.store: ResponseStore = ObservedStore(store, observer, tracer)
        self.virtual_keys = virtual_keys  # made through /admin/keys (gateway/engine/vkeys.py)
        self.auth = Authenticator(settings, virtual_keys)
        self.prices = price_table(settings)  # micro-units per million tokens, by model name
        self.meter = Meter(ledger or MemoryLedger(), self.prices, observer, settings.currency)
        self.open_compaction = open_compaction
        self.fit_context = fit_context
        self.compact_context = compact_context
        # observed: a failed check counts in the store's error metric
        self.store_health = StoreHealth(self.store, settings.state.health_recheck_seconds)
        self.limits = TenantLimiter(settings, limiter or MemoryLimiter(), observer=observer)
        # background responses' event logs and leases (gateway/engine/background.py)
        self.background_log: BackgroundLog = background_log or MemoryBackgroundLog()

    def retains(self, tenant: str) -> bool:
        """Whether the tenant's conversations may be stored (``retention: standard``)."""
        t = self.settings.tenants.get(tenant)
        return t is None or t.retention != "none"

    def shows_cost(self, tenant: str) -> bool:
        """Whether the tenant's JSON answers carry ``x-gateway-cost`` (``cost_header``)."""
        t = self.settings.tenants.get(tenant)
        return t is not None and t.cost_header

    def tenants(self) -> list[str]:
        """Every tenant the config names (a key's, a ``tenants:`` entry, ``default`` without keys)."""
        names = {k.tenant for k in self.settings.auth.api_keys or ()} | set(self.settings.tenants)
        if self.virtual_keys is not None:
            names |= self.virtual_keys.tenants()
        return sorted(names if self.auth.enabled else names | {"default"})

    def route(self, model: str, principal: Principal) -> Route:
        return self.router.route(model, principal.models)

    async def admit(self, principal: Principal, route: Route) -> Reservation | None:
        """Admit a request that is not a turn of its own (``/v1/responses/compact``): one request
        and a lease for one call on ``route``, against the tenancy limits; its summarizing call, if
        it makes one, is charged its tokens (``prepare(admitted=True)``). ``limits.settle_soon``
        ends it."""
        checks, labels = _only(*self.limits.checks(principal), CheckKind.REQUESTS, CheckKind.CONCURRENCY)
        return await self.limits.reserve(principal, checks, labels, 0, seconds=route.total_seconds)

    async def context(
        self,
        input_: str | list[Any] | None,
        previous_response_id: str | None,
        principal: Principal,
        cache: ConnectionCache | None = None,
    ) -> Context:
        """The assembled context of a request (its chain, references and opened compaction items)."""
        return await build_context(
            input_=input_,
            previous_response_id=previous_response_id,
            tenant=principal.tenant,
            store=self.store,
            cache=cache,
            open_compaction=self.open_compaction,
            max_depth=self.settings.state.max_chain_depth,
        )

    async def prepare(
        self,
        body: CreateResponseBody,
        principal: Principal,
        *,
        cache: ConnectionCache | None = None,
        streaming: bool = True,
        error_event: bool = True,
        request_id: str | None = None,
        metered: bool = True,
        affinity: str | None = None,
        admitted: bool = False,
        behind: bool = False,
    ) -> Turn:
        """The turn of a validated request (``gateway/engine/validate.py``). ``streaming``: the
        caller relays deltas as they come (SSE, WebSocket); False lets the adapter ask for an
        unstreamed reply. ``error_event``: see ``ResponseBuilder``. ``metered``: False for a turn
        whose caller meters it (compaction's summarizing call). ``affinity``: the key of the
        caller's own turns (a WebSocket connection's ``turn.affinity``), to keep them on one
        deployment; a request's ``prompt_cache_key`` still comes first. ``admitted``: the turn
        serves a request already admitted (a compaction's summarizing call): it is charged only its
        tokens, not one more request or lease.

        A ``background`` request is admitted without its concurrency slot, which it then takes
        (``take_slot``) unless ``behind`` (others of its tenant wait for one already) or the
        tenant has none free: it is then ``queued``, and its runner waits for one
        (gateway/engine/background.py)."""
        assert body.model is not None  # validate.create_request requires it
        route = self.route(body.model, principal)
        store = True if body.store is None else body.store
        background = bool(body.background)
        if background and not self.retains(principal.tenant):
            raise InvalidRequest(
                "This tenant's conversations are not retained (retention: none), and a background "
                "response must be stored: send background: false.",
                param="background",
                code=ErrorCode.STORE_NOT_ALLOWED,
            )
        if not self.retains(principal.tenant):
            # An omitted store (the spec's default true) means false here; an explicit true is
            # refused, so that no client silently loses a response it asked to keep.
            if body.store:
                raise InvalidRequest(
                    "This tenant's conversations are not retained (retention: none): send "
                    "store: false or omit it.",
                    param="store",
                    code=ErrorCode.STORE_NOT_ALLOWED,
                )
            store = False
        if store:
            await self.store_health.require()  # known down: refused at once, before any store read
        warmup = body.generate is False
        ctx = await self.context(body.input, body.previous_response_id, principal, cache)
        echoes = Echoes.of(body)
        rid = self._response_id(body, route, ctx, affinity)
        resource = new_resource(body, response_id=rid, model=route.model, store=store, echoes=echoes)
        if store:
            # The write-ahead record: a store that cannot keep the answer is found out here, before
            # any upstream spend (a compaction call's included), not after it (store_health.py).
            pending = PendingResponse(rid, principal.tenant, resource["created_at"])
            # it lasts as long as the request may (a compacting one makes two upstream calls)
            calls = 2 if body.context_management and not warmup else 1
            await self.store_health.reserve(pending, route.total_seconds * calls)
        # instructions and tool schemas take room in the window too
        reserved = estimate_text(body.instructions)
        if echoes.tools:
            reserved += estimate_bytes(orjson.dumps(echoes.tools))
        # The tenancy limits, last before the upstream call (a refusal costs nothing upstream), or
        # before a compaction's summarizing call (``admit``, which the compactor calls with the
        # estimate of the compacted context): a refused request spends no summary.
        checks, labels = self.limits.checks(principal)
        if background:  # its concurrency slot is taken apart: past the limit it waits, queued
            checks, labels = _only(checks, labels, *_SPEND, CheckKind.REQUESTS)
        if warmup:  # it spends no tokens: only the request-rate and concurrency limits apply
            checks, labels = _only(checks, labels, CheckKind.REQUESTS, CheckKind.CONCURRENCY)
        elif admitted:  # its request is counted and holds the lease: only its tokens are charged
            checks, labels = _only(checks, labels, *_SPEND)
        wants_tokens = self.limits.wants_tokens(checks)
        price = self.prices.get(route.model, FREE) if self.limits.wants_money(checks) else FREE
        held: Reservation | None = None
        charged = False

        async def admit(estimated: int, calls: int = 2) -> None:
            """Admit the request, its context estimated at ``estimated`` tokens; its lease lasts
            ``calls`` upstream calls (the compactor's: the summary's and the answer's)."""
            nonlocal held, charged
            charged = True
            output = body.max_output_tokens or self.limits.output_reservation
            charge = estimated + output if wants_tokens else 0
            cost = pricing.worst_case(price, estimated, output)  # FREE without a money budget: 0
            seconds = route.total_seconds * calls
            held = await self.limits.reserve(principal, checks, labels, charge, seconds=seconds, cost=cost)

        try:
            compaction: dict[str, Any] | None = None
            if body.context_management and not warmup:  # a warm-up makes no upstream call at all
                if self.compact_context is None:
                    raise InvalidRequest(
                        "context_management is not supported by this gateway.", param="context_management"
                    )
                compacted = await self.compact_context(
                    self, ctx, body, principal, route, reserved=reserved, request_id=request_id, admit=admit
                )
                if compacted is not None:
                    ctx, compaction = compacted
            if self.fit_context is not None:
                fitted = self.fit_context(ctx, route, body.truncation or "disabled", reserved=reserved)
                if fitted is not ctx:
                    self.observer.compaction("truncation")
                ctx = fitted
            estimated = ctx.estimated_tokens() + reserved if wants_tokens else 0
            if not charged:
                await admit(estimated, 1)
            hosted = await self._hosted(body, ctx, principal) if not warmup else None
            turn = self._turn(
                body,
                principal,
                route,
                ctx,
                echoes,
                resource,
                store,
                streaming,
                error_event,
                request_id,
                metered,
                affinity,
            )
            turn.compaction = compaction
            if hosted is not None:
                turn.use_hosted(hosted)
            if self.fit_context is not None and body.truncation == "auto" and not warmup:
                turn.refit = Refit(self.fit_context, route, reserved, self.observer)
        except BaseException:  # no turn will end what was taken for it: nothing was sent upstream
            if held is not None:
                await self.limits.settle_soon(held, 0)
            if store:
                await self.store_health.release(principal.tenant, rid)
            raise
        if held is not None:
            turn.rate_standing = held.standing
            turn.on_end(self._settle_hook(held, estimated, price))  # runs whatever the other hooks do
        if background:
            await self._publish(turn, principal, body, behind)
        return turn

    async def _hosted(
        self, body: CreateResponseBody, ctx: Context, principal: Principal
    ) -> HostedTools | None:
        """The request's hosted tools (its MCP servers listed, its approvals executed), or None
        when it names none and approves nothing."""
        found = [(t, n) for n, t in enumerate(body.tools) if isinstance(t, McpTool)] if body.tools else []
        if not found and not (
            isinstance(body.input, list)
            and any(i.get("type") == "mcp_approval_response" for i in ctx.new_items)
        ):
            return None
        return await hosted_plan(
            [t for t, _ in found],
            ctx.transcript,
            ctx.new_items,
            tenant=principal.tenant,
            host=self.mcp,
            settings=self.settings.mcp,
            max_tool_calls=body.max_tool_calls,
            client_functions=[t.name for t in body.tools or () if isinstance(t, FunctionTool)],
            indexes=[n for _, n in found],
            observer=self.observer,
            tracer=self.tracer,
        )

    async def take_slot(self, turn: Turn, principal: Principal) -> None:
        """The background ``turn``'s concurrency slot (released by its end-of-turn hooks); raises
        the refusal (RateLimited) while the tenant has none free."""
        checks, labels = _only(*self.limits.checks(principal), CheckKind.CONCURRENCY)
        slot = await self.limits.reserve(principal, checks, labels, 0, seconds=turn.route.total_seconds)
        if slot is not None:
            turn.on_end(lambda _: self.limits.settle_soon(slot, 0))

    async def _publish(
        self, turn: Turn, principal: Principal, body: CreateResponseBody, behind: bool
    ) -> None:
        """A background response is readable while it runs: stored now with its status, queued or
        in_progress (it replaces the write-ahead record); its end-of-turn store write replaces
        this. A refusal here (the limiter down, a store that cannot take it) ends the turn unrun
        (its hooks release everything)."""
        res = turn.result.resource
        try:
            queued = behind
            if not behind:
                try:
                    await self.take_slot(turn, principal)
                except RateLimited:
                    queued = True
            if queued:
                res["status"] = "queued"
            # the lease first: a reader that sees the response running and no lease takes it for
            # an orphan (its owner died)
            await self.background_log.claim(principal.tenant, res["id"], LEASE_SECONDS)
            try:
                await self.store.put(self._stored(res, principal, body, turn.result.context))
            except ServiceUnavailable:
                self.store_health.report(False)
                raise
        except GatewayError as exc:
            await turn.discard(exc)
            raise
        turn.result.published = True

    @staticmethod
    def _response_id(body: CreateResponseBody, route: Route, ctx: Context, affinity: str | None) -> str:
        """The new response's id. A turn that starts a chain gets one hashing to where it goes
        (its affinity key's deployment, gateway/engine/balance.py), so the chain's later turns
        follow it there through their root's id."""
        if body.previous_response_id is None:
            return route.deployment_balancer.claim(body.prompt_cache_key or affinity or ctx.root, response_id)
        return response_id()

    def _turn(
        self,
        body: CreateResponseBody,
        principal: Principal,
        route: Route,
        ctx: Context,
        echoes: Echoes,
        resource: dict[str, Any],
        store: bool,
        streaming: bool,
        error_event: bool,
        request_id: str | None,
        metered: bool,
        affinity: str | None,
    ) -> Turn:
        # The deployment affinity key (gateway/engine/balance.py): the prompt_cache_key, the
        # caller's, or the chain's root; a turn that starts a chain is its own key (its id).
        key = body.prompt_cache_key or affinity or ctx.root
        rid: str = resource["id"]
        if body.previous_response_id is None:
            key = key or rid
        kind = Warmup if body.generate is False else Turn
        turn = kind(
            request=upstream_request(
                body, echoes, route.upstream_model, ctx, stream=streaming, request_id=request_id
            ),
            route=route,
            context=ctx,
            resource=resource,
            max_events=self.settings.limits.max_events_per_stream,
            error_event=error_event,
            request_id=request_id,
            affinity=key,
            observer=self.observer,
            tracer=self.tracer,
        )
        if store:
            turn.on_end(self._store_hook(self._stored(resource, principal, body, ctx)))
        if metered:
            turn.on_end(self.meter.hook(principal, route.model))
        return turn

    @staticmethod
    def _stored(
        resource: dict[str, Any], principal: Principal, body: CreateResponseBody, ctx: Context
    ) -> StoredResponse:
        return StoredResponse(
            id=resource["id"],
            tenant=principal.tenant,
            model=resource["model"],
            # A compacted turn's window (its first output) supersedes the chain before it: it
            # is stored as the start of a new chain (its resource still echoes the id).
            previous_response_id=None if ctx.compacted else body.previous_response_id,
            input_items=ctx.input_items,
            resource=resource,
            created_at=resource["created_at"],
            stored_at=time.time(),
        )

    def _settle_hook(
        self, held: Reservation, estimated: int, price: ModelPrice
    ) -> Callable[[TurnResult], Awaitable[None]]:
        async def settle(result: TurnResult) -> None:
            usage = result.usage
            if usage:
                actual = int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
                # the ledger's figure (usage.py Meter): what the client was told it used
                cost = pricing.cost(price, usage, result.cache_write_tokens)
            elif result.started:  # cancelled or failed mid-stream: what was produced
                produced = estimate(result.output)
                actual = estimated + produced
                cost = pricing.estimated(price, estimated, produced)
            else:
                actual = estimated
                cost = pricing.estimated(price, estimated, 0)
            await self.limits.settle_soon(held, actual, cost)

        return settle

    def _store_hook(self, stored: StoredResponse) -> Callable[[TurnResult], Awaitable[None]]:
        """The final write: the response replaces its write-ahead record; a turn that ended
        without one (failed, cancelled) drops the record."""

        async def keep(result: TurnResult) -> None:
            if not result.ended:
                if not result.published:
                    await self.store_health.release(stored.tenant, stored.id)
                    return
                ended(result)  # a background response is kept however it ended
            stored.resource = result.resource
            try:
                await self.store.put(stored)
            except ServiceUnavailable:
                self.store_health.report(False)
                raise

        return keep

    async def aclose(self) -> None:
        await self.router.aclose()
        await self.meter.ledger.aclose()
        if self.virtual_keys is not None:
            await self.virtual_keys.aclose()
        await self.store.aclose()
        await self.limits.aclose()
        await self.background_log.aclose()
