"""The one turn runner, for every transport: open → events → drain → the end-of-turn hooks.

``Turn.run(emit)`` opens the upstream call and waits for its first delta, retrying and falling
back along the route (on retryable failures, before any output), so that a failure before the first
event raises an ordinary ``GatewayError`` and nothing was emitted. An upstream that refuses the
context as too long gets it once more, shorter, when the turn has a ``refit`` (truncation "auto").
Otherwise every spec event goes to ``emit`` (SSE frames, WebSocket messages; nothing for a JSON
answer, which reads the result), ending with exactly one terminal event.

The end-of-turn hooks run exactly once per turn, whatever its outcome (completed, incomplete,
failed before or after its first event, cancelled because the client left), in the order they
were added, with the ``TurnResult``. When the turn reached a terminal state they run before its
terminal event is emitted, so a hook that cannot keep its promise (the store write) may raise a
``GatewayError``: the terminal event becomes ``response.failed`` and the later hooks see the
failure. The log line, metrics, the store write and the WebSocket cache hang here.

Allowed-tools enforcement lives here, once. So does stopping early (``Turn.stop``, steering):
the relay loop checks for a stop between deltas and ends the response at a safe boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import structlog

from adapters.base import Applies, UpstreamRequest
from adapters.deltas import Delta, Finish, ItemDone, TextDelta, ToolCallArgsDelta, ToolCallStart, Usage
from gateway.engine.balance import Lease
from gateway.engine.builder import ResponseBuilder, ResponseState
from gateway.engine.context import Context
from gateway.engine.hosted import HostedTools, function_name, receipt, upstream_items
from gateway.engine.routing import Deployment, Route
from gateway.engine.telemetry import (
    NOOP_OBSERVER,
    NOOP_TRACER,
    Observer,
    Span,
    Tracer,
    upstream_outcome,
)
from gateway.kernel.errors import ErrorCode, GatewayError, RateStanding, ServerError, UpstreamError
from gateway.kernel.items import output_as_input
from gateway.kernel.settings import RetrySettings
from gateway.kernel.tool_choice import parse_tool_choice

log = structlog.get_logger("gateway.engine.turn")
Event = dict[str, Any]
Emit = Callable[[Event], Awaitable[None]]

_ENDED = frozenset({"completed", "incomplete"})
# While a function call is open these still belong to it (or add no output): a stop waits for them.
_CALL_PARTS = (ToolCallArgsDelta, Usage, Finish, ItemDone)


@dataclass(slots=True)
class TurnResult:
    """What a turn leaves: its final status (completed | incomplete | failed | cancelled), the
    provider and the deployment that answered (or were tried last), usage, the final
    ResponseResource, and the error it failed with. ``started``: its first event was produced
    (False: it failed while opening)."""

    route: Route
    context: Context
    resource: dict[str, Any]
    request_id: str | None = None
    status: str = "in_progress"
    provider: str = ""
    deployment: str = ""  # its name (gateway/engine/routing.py Deployment.name): a metrics label
    usage: dict[str, Any] | None = None
    cache_write_tokens: int = 0  # of usage's input tokens, those that wrote a prompt cache (priced apart)
    error: GatewayError | None = None
    started: bool = False
    published: bool = False  # a background response, stored as it stands: kept however it ends

    @property
    def ended(self) -> bool:
        """The response completed or came back incomplete: it exists and may be kept."""
        return self.status in _ENDED

    @property
    def output(self) -> list[dict[str, Any]]:
        output: list[dict[str, Any]] = self.resource["output"]
        return output


TurnHook = Callable[[TurnResult], Awaitable[None] | None]


@dataclass(slots=True)
class UpstreamCall:
    """One try of a turn on one deployment, from its request until it ends: the balancer's record
    of it (``lease``, balance.py), its ``upstream_attempt`` sample and its span, each closed once,
    by ``close`` (or ``failed``, for a try that failed before its first delta)."""

    deployment: Deployment
    request: UpstreamRequest  # as sent: the deployment's model, the span's traceparent
    lease: Lease
    span: Span
    observer: Observer
    number: int  # the try's place on its route, from 0
    start: float = dataclasses.field(default_factory=time.perf_counter)
    closed: bool = False

    def close(self, outcome: str, failure: str | None = None) -> None:
        """The try is over with ``outcome`` (``upstream_outcome``); ``failure``: what the span's
        error says unless the outcome is ok. Once: a second close does nothing."""
        if self.closed:
            return
        self.closed = True
        self.lease.end()
        self.observer.upstream_attempt(self.deployment, outcome, time.perf_counter() - self.start)
        if outcome != "ok":
            self.span.fail(failure)
        self.span.end()

    def failed(self, exc: UpstreamError, request_id: str | None) -> None:
        """The try failed before its first delta: the balancer hears of it, then it closes."""
        self.lease.failed(exc)
        self.close(upstream_outcome(exc), exc.code)
        deployment = self.deployment
        log.warning(
            "upstream_failed",
            request_id=request_id,
            provider=deployment.provider,
            deployment=deployment.name,
            attempt=self.number + 1,
            code=exc.code,
            upstream_status=exc.upstream_status,
            retryable=exc.retryable,
        )


def _backoff(attempt: int, retry: RetrySettings, retry_after: float | None) -> float:
    if retry_after is not None:
        return min(retry_after, retry.retry_after_cap)
    return random.uniform(0, min(retry.backoff_max, retry.backoff_base * 2**attempt))


class Turn:
    """One response in the making. Made by ``Gateway.prepare``; run once."""

    __slots__ = (
        "_allowed",
        "_call",
        "_cancel",
        "_cut",
        "_decided",
        "_dropped",
        "_first",
        "_hooks",
        "_hooks_done",
        "_hosting",
        "_label",
        "_opening",
        "_reading",
        "_round_start",
        "_rounds",
        "_stop",
        "_stream",
        "_task",
        "affinity",
        "builder",
        "compaction",
        "hosted",
        "max_events",
        "observer",
        "rate_standing",
        "refit",
        "request",
        "result",
        "tracer",
    )

    def __init__(
        self,
        *,
        request: UpstreamRequest,
        route: Route,
        context: Context,
        resource: dict[str, Any],
        max_events: int,
        error_event: bool = True,
        request_id: str | None = None,
        affinity: str | None = None,
        observer: Observer = NOOP_OBSERVER,
        tracer: Tracer = NOOP_TRACER,
    ) -> None:
        self.request = request
        self.affinity = affinity  # the key that keeps related turns on one deployment (balance.py)
        self.observer = observer
        self.tracer = tracer
        self.builder = ResponseBuilder(resource, error_event=error_event)
        self.max_events = max_events
        self.result = TurnResult(
            route=route, context=context, resource=resource, request_id=request_id, provider=route.provider
        )
        self._stream: AsyncIterator[Delta] | None = None
        self._call: UpstreamCall | None = None  # the try that answered, until its stream ends
        self._label: contextvars.Token[Any] | None = None  # undoes the log lines' deployment field
        self._first: Delta | None = None
        self._allowed = parse_tool_choice(request.tool_choice).permitted(request.tools)
        self._dropped: set[int | str] = set()
        self._hooks: list[TurnHook] = []
        self._hooks_done = False
        # a compaction item sealed before sampling (inline compaction), announced first
        self.compaction: dict[str, Any] | None = None
        # a stop was asked for: with this incomplete_details.reason, or a failure (``abort``)
        self._stop: str | GatewayError | None = None
        self._cancel = False  # the stop is a cancellation (``cancel``: a background response's)
        self._decided = False  # the stream loop is over: a stop can no longer change the outcome
        self._opening = False  # the turn is opening: awaiting the upstream's first delta (or a backoff)
        self._reading = False  # the relay is awaiting the upstream's next delta
        self._cut = False  # the stop cancelled that await
        self._task: asyncio.Task[Any] | None = None
        # the request's hosted tools (MCP servers, hosted.py), or None; their calls run between
        # upstream calls, while ``_hosting``; ``_round_start``: the current call's first output
        self.hosted: HostedTools | None = None
        self._hosting = False
        self._round_start = 0
        self._rounds = 0  # upstream calls made after the first (hosted tools' rounds)
        # the admission's per-minute figures (gateway/engine/limits.py): the transport's x-ratelimit-*
        self.rate_standing: RateStanding | None = None
        # truncation "auto": a shorter context after the upstream's context overflow, or None
        # (orchestrator.py ``Refit``); used once, then dropped
        self.refit: Callable[[Context, UpstreamError], Context | None] | None = None

    @property
    def route(self) -> Route:
        return self.result.route

    def on_end(self, hook: TurnHook) -> None:
        """Run ``hook`` at the end of the turn (see the module docstring)."""
        self._hooks.append(hook)

    def stop(self, reason: str = "steered") -> bool:
        """Ask the response to end early, at its next safe boundary, as ``incomplete`` with
        ``reason`` (``ResponseBuilder.interrupt``): at once between text deltas, or while the relay
        waits on the upstream; a function call's arguments are never cut, the call finishes first.
        The upstream call is then cancelled. Asked before generation began, it takes effect at the
        first delta. False: too late, the response's outcome is already decided."""
        if self._decided:
            return False
        if self._stop is None:
            self._stop = reason
            if not self.builder.call_open:
                self._cut_wait()
        return True

    def abort(self, error: GatewayError) -> bool:
        """End the response now as ``failed`` with ``error`` (the gateway's drain deadline has
        come): at once while the relay waits on the upstream (its first delta too: the response
        then starts, to fail at once), else at its next delta, a function call's arguments
        included; then the upstream call is cancelled and the client gets the error and
        ``response.failed``. False: too late, the outcome is already decided."""
        if self._decided:
            return False
        self._stop = error
        self._cut_wait(opening=True)
        return True

    def cancel(self) -> bool:
        """End the response now as ``cancelled`` (its client cancelled a background response), as
        ``abort`` ends it failed: at once while waiting on the upstream, else at its next delta;
        the upstream call is cancelled, the end-of-turn hooks run, then ``response.cancelled``.
        False: too late, the outcome is already decided."""
        if self._decided:
            return False
        self._stop, self._cancel = "cancelled", True
        self._cut_wait(opening=True)
        return True

    def _cut_wait(self, opening: bool = False) -> None:
        """Cancel the await on the upstream: the relay's, and with ``opening`` the opening's."""
        waiting = self._reading or (opening and (self._opening or self._hosting))
        if waiting and self._task is not None and not self._cut:
            self._cut = True
            self._task.cancel()  # the await on the upstream; caught in _events

    def _stop_now(self) -> bool:
        """A stop is pending that need not wait for anything (no call open, or a failure)."""
        stop = self._stop
        return stop is not None and (
            not self.builder.call_open or self._cancel or isinstance(stop, GatewayError)
        )

    async def discard(self, error: GatewayError | None) -> None:
        """End a prepared turn that will not run: failed with ``error`` (refused after all), or
        cancelled (None: a queued background response); its end-of-turn hooks run once, nothing
        was sent upstream."""
        self.result.error = error
        self.result.status = "failed" if error is not None else "cancelled"
        await self._end()

    # -- the runner ------------------------------------------------------------------------------
    async def run(
        self,
        emit: Emit | None = None,
        *,
        opened: Callable[[], Awaitable[None]] | None = None,
        announce: bool = False,
    ) -> TurnResult:
        """Open, then relay every event to ``emit``; ``opened`` is awaited once the upstream has
        answered, before the first event (an SSE response sends its headers there). Raises the
        ``GatewayError`` of a turn that fails before its first event; otherwise returns the result.
        ``announce``: ``response.created`` and ``response.in_progress`` go to ``emit`` before the
        upstream is opened (a background response's readers see it at once), not after."""
        try:
            self._task = asyncio.current_task()
            if announce and emit is not None and self.builder.state is not ResponseState.IN_PROGRESS:
                for ev in self.builder.start():
                    await emit(ev)
            self._opening = True
            try:
                await self._open()
            except asyncio.CancelledError:
                if not self._own_cut():
                    raise
                # aborted while opening: the response starts, and fails at once (``_events``)
            except GatewayError as exc:
                self.result.error = exc
                self.result.status = "failed"
                await self._end()
                raise
            finally:
                self._opening = False
            if opened is not None:
                await opened()
            async with aclosing(self._events()) as events:
                if emit is None:
                    async for _ in events:
                        pass
                else:
                    await _relay(events, emit)
            return self.result
        finally:
            await self._close()
            if not self._hooks_done:  # cancelled: the client left, or the gateway is shutting down
                res = self.result
                status = self.builder.resource["status"]
                res.status = "cancelled" if status == "in_progress" else status
                res.usage = self.builder.resource.get("usage")
                res.cache_write_tokens = self.builder.cache_write_tokens
                await self._end()

    async def _end(self, revoke: Callable[[GatewayError], None] | None = None) -> None:
        """The end-of-turn hooks, once, in order. ``revoke``: how a hook's GatewayError turns the
        unsent terminal event into a failure (only a completed or incomplete turn has one)."""
        if self._hooks_done:
            return
        self._hooks_done = True
        cancelled = False
        for hook in self._hooks:
            try:
                pending = hook(self.result)
                if pending is not None:  # an async hook
                    await pending
            except GatewayError as exc:
                if revoke is None:
                    log.warning("turn_hook_failed", code=exc.code, request_id=self.result.request_id)
                    continue
                revoke(exc)
                revoke = None
            except asyncio.CancelledError:
                # Cancelled mid-hook (the client left while the response was being stored): the
                # later hooks (the log line) still run, then the cancellation goes on.
                cancelled = True
                self.result.status = "cancelled"
                revoke = None
            except Exception:
                log.exception("turn_hook_failed", request_id=self.result.request_id)
        if cancelled:
            raise asyncio.CancelledError

    # -- opening, with retries and fallbacks ------------------------------------------------------
    async def _open(self) -> None:
        """The first delta, along the route: its deployments, then each fallback's, all within the
        primary route's ``total_seconds`` (backoff and Retry-After included: a wait that would
        overrun it is not made, and the last error is raised instead). Each route gets ``tries``
        tries: the balancer chooses the deployment of each (balance.py), a deployment not yet tried
        in this turn right away, one tried already after the provider's backoff. Adapters bound
        each call by what is left of the request's ``deadline`` (``UpstreamRequest.seconds_left``)."""
        primary = self.result.route
        began = time.perf_counter()
        deadline = time.monotonic() + primary.total_seconds
        self.request.deadline = deadline  # the turn's own request: no other turn sees it
        last: UpstreamError | None = None
        for route in (primary, *primary.fallbacks):
            if route is not primary:
                self.observer.fallback(primary, route)
            balancer = route.deployment_balancer
            tried: set[int] = set()
            index = balancer.pick(self.affinity)
            tries, number = route.tries, 0
            while number < tries:
                call = self._try(route, index, number, route is not primary)
                number += 1
                stream = call.deployment.adapter.stream(call.request)
                try:
                    self._first = await anext(stream)
                except StopAsyncIteration:
                    self._first = None
                except UpstreamError as exc:
                    await _close(stream)
                    call.failed(exc, self.result.request_id)
                    last = exc
                    if self._refitted(exc, deadline):
                        tries += 1  # the same deployment again, at once: a try of its own
                        continue
                    if not exc.retryable:
                        raise
                    tried.add(index)
                    if number < tries:
                        index = balancer.pick(self.affinity, tried)
                        await self._before_retry(call, exc, index in tried, deadline)
                    continue
                except BaseException as exc:
                    await _close(stream)
                    call.close(upstream_outcome(exc), getattr(exc, "code", None) or type(exc).__name__)
                    raise
                call.lease.opened()
                self._stream, self._call = stream, call
                # the resource states what was applied (a getattr: a runtime Protocol check costs
                # ~20 us a turn)
                applied: Applies | None = getattr(call.deployment.adapter, "applied", None)
                if applied is not None:
                    self.builder.resource.update(applied(call.request))
                if call.request.stream and self._rounds == 0:  # the response's first token only
                    self.observer.first_token(primary, call.deployment, time.perf_counter() - began)
                if route is not primary:
                    log.info(
                        "fallback_used",
                        request_id=self.result.request_id,
                        model=primary.model,
                        fallback=route.model,
                    )
                return
            log.warning(
                "route_exhausted",
                request_id=self.result.request_id,
                model=route.model,
                provider=route.provider,
            )
        assert last is not None
        raise last

    def _refitted(self, exc: UpstreamError, deadline: float) -> bool:
        """The upstream refused the context as too long and ``refit`` (truncation "auto") made it
        shorter: the request now carries the shorter context. Once per turn, within ``deadline``."""
        refit = self.refit
        if refit is None or exc.code != ErrorCode.CONTEXT_LENGTH_EXCEEDED or time.monotonic() >= deadline:
            return False
        self.refit = None
        before = self.result.context
        fitted = refit(before, exc)
        if fitted is None:
            return False
        self.result.context = fitted
        approved = [output_as_input(i) for i in self.hosted.approved] if self.hosted is not None else []
        self.request = dataclasses.replace(self.request, items=upstream_items(fitted.transcript + approved))
        log.info(
            "context_refitted",
            request_id=self.result.request_id,
            reported=exc.prompt_tokens,
            limit=exc.context_limit,
            items_before=len(before.transcript),
            items_after=len(fitted.transcript),
        )
        return True

    def _try(self, route: Route, index: int, number: int, fallback: bool) -> UpstreamCall:
        """Start try ``number`` on the route's deployment ``index``: the request as that deployment
        takes it, the log lines' deployment field, the span, and the balancer's record."""
        deployment = route.deployments[index]
        request = self.request
        if request.model != deployment.upstream_model:
            request = dataclasses.replace(request, model=deployment.upstream_model)
        self.result.provider, self.result.deployment = deployment.provider, deployment.name
        # the upstream_call lines the adapter writes carry the deployment too
        bound = structlog.contextvars.bind_contextvars(deployment=deployment.name)
        if self._label is None:
            self._label = bound["deployment"]
        span = self.tracer.call_span(route, deployment, number, fallback=fallback)
        if span.recording:  # the upstream call names its span (W3C traceparent)
            request = dataclasses.replace(request, trace_headers=span.trace_headers())
        lease = route.deployment_balancer.lease(index)
        return UpstreamCall(deployment, request, lease, span, self.observer, number)

    async def _before_retry(
        self, call: UpstreamCall, exc: UpstreamError, again: bool, deadline: float
    ) -> None:
        """Another deployment is tried right away; ``again`` (the same one) after the backoff. A
        retry that could not finish by ``deadline`` is not made: ``exc`` is raised, the client
        hears now."""
        deployment = call.deployment
        wait = _backoff(call.number, deployment.retry, exc.retry_after) if again else 0.0
        if time.monotonic() + wait >= deadline:
            raise exc
        self.observer.upstream_retry(deployment)
        if wait:
            await asyncio.sleep(wait)

    # -- streaming -------------------------------------------------------------------------------
    async def _events(self) -> AsyncGenerator[Event, None]:
        """Every event of the response, ending with exactly one terminal event; the end-of-turn
        hooks run between the terminal state and the terminal event."""
        b = self.builder
        res = self.result
        res.started = True
        count = 0
        self._task = asyncio.current_task()
        try:
            if b.state is not ResponseState.IN_PROGRESS:  # not announced already
                for ev in b.start():
                    yield ev
            if self.compaction is not None:
                for ev in b.compaction(self.compaction):
                    yield ev
            if self.hosted is not None:
                for item in self.hosted.announced:
                    for ev in b.announce(item):
                        yield ev
                self._round_start = len(b.resource["output"])
            stopped = False
            try:
                while True:  # one upstream call; more while the model calls hosted tools
                    if self._first is not None:
                        first, self._first = self._first, None
                        if self._stop is not None and self._stops_before(first):
                            stopped = True
                        else:
                            for ev in self._feed(first):
                                yield ev
                                count += 1
                    if self._stream is None and self._first is None and self._stop is not None:
                        stopped = True  # aborted before the upstream's first delta: nothing was opened
                    elif self._stream is not None and not stopped:
                        if self._stop is not None and self._stop_now():
                            stopped = True
                        else:
                            self._reading = True
                            async for delta in self._stream:
                                self._reading = False
                                if self._stop is not None and self._stops_before(delta):
                                    stopped = True
                                    break
                                for ev in self._feed(delta):
                                    yield ev
                                    count += 1
                                if count > self.max_events:
                                    raise UpstreamError(
                                        "The response exceeded the gateway's event limit.",
                                        code=ErrorCode.EVENT_LIMIT_EXCEEDED,
                                    )
                                if self._stop is not None and self._stop_now():  # no call per delta
                                    stopped = True
                                    break
                                self._reading = True
                            self._reading = False
                    if stopped or self.hosted is None:
                        break
                    # the model's calls to hosted tools: executed, then the upstream is called again
                    for ev in b.end_round():
                        yield ev
                    parked = b.parked()
                    if not parked:
                        break
                    async for ev in self._execute(parked):
                        yield ev
                        count += 1
                    if self._stop is not None:  # a stop waits for the calls, not for another round
                        stopped = True
                        break
                    if b.handoff:  # the client answers a call (its own function, an approval)
                        break
                    await self._next_call()
            except asyncio.CancelledError:
                if not self._own_cut():
                    raise
                stopped = True
            finally:
                self._reading = False
                self._decided = True
            terminal = await self._stopped() if stopped else b.finish()
        except GatewayError as exc:
            log.warning("turn_failed", request_id=res.request_id, code=exc.code, provider=res.provider)
            terminal = self._failed(exc)
        except Exception:  # an adapter bug must still end the stream cleanly
            log.exception("turn_crashed", request_id=res.request_id, provider=res.provider)
            terminal = self._failed(ServerError("The gateway failed while producing this response."))
        res.status = b.resource["status"]
        res.usage = b.resource.get("usage")
        res.cache_write_tokens = b.cache_write_tokens

        def revoke(exc: GatewayError) -> None:
            # A promise the turn cannot keep (it could not be stored): fail rather than hand out
            # a dangling id. The remaining hooks then see the failure.
            terminal[-1:] = b.revoke(exc)
            res.error = exc
            res.status = "failed"

        await self._end(revoke if res.ended else None)
        for ev in terminal:
            yield ev

    def use_hosted(self, hosted: HostedTools) -> None:
        """Run the model's calls to ``hosted``'s tools within this response (gateway/engine/hosted.py):
        their function tools are offered upstream, and the items made before the turn (listings,
        approved calls) are its first output."""
        self.hosted = hosted
        self.builder.hosted = hosted.functions
        request = self.request
        if hosted.approved:  # the approved calls' results follow the calls in the context
            approved = [output_as_input(i) for i in hosted.approved]
            request = dataclasses.replace(
                request, items=upstream_items(self.result.context.transcript + approved)
            )
        self.request = dataclasses.replace(request, tools=request.tools + hosted.tools)
        self._allowed = self._allowed | frozenset(hosted.functions)

    async def _execute(self, parked: list[tuple[int, Event]]) -> AsyncGenerator[Event, None]:
        """Execute the parked hosted calls in output order, each closed with its outcome. A
        cancellation or an abort cuts the call in progress (``_hosting``); a steer waits for them."""
        hosted = self.hosted
        assert hosted is not None
        b = self.builder
        for index, item in parked:
            if self._stop is not None and (self._cancel or isinstance(self._stop, GatewayError)):
                return  # the rest stay parked: fail() or cancel() leaves them incomplete
            function = hosted.functions[function_name(item["server_label"], item["name"])]
            self._hosting = True
            try:
                result = await hosted.call(function, item["arguments"], item["id"])
            finally:
                self._hosting = False
            for ev in b.hosted_done(index, receipt(result)):
                yield ev

    async def _next_call(self) -> None:
        """The upstream again, with what the model made since its last call (its reasoning, text
        and the hosted calls with their results, as function calls) appended to the request."""
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await _close(stream)
        if self._call is not None:  # that call answered in full
            call, self._call = self._call, None
            call.close("ok")
        self.refit = None  # a refit would drop what the earlier calls made
        self._rounds += 1
        b = self.builder
        output = b.resource["output"]
        made = [output_as_input(i) for i in output[self._round_start :]]
        self._round_start = len(output)
        self.request = dataclasses.replace(self.request, items=self.request.items + upstream_items(made))
        b.next_round()
        self._opening = True
        try:
            await self._open()
        finally:
            self._opening = False

    async def _stopped(self) -> list[Event]:
        """The terminal events of a stop: the upstream call is cancelled first (before the
        end-of-turn hooks), then the response ends incomplete (steering) or failed (``abort``)."""
        await self._close()
        stop = self._stop
        assert stop is not None
        if isinstance(stop, GatewayError):
            log.warning("turn_aborted", request_id=self.result.request_id, code=stop.code)
            return self._failed(stop)
        if self._cancel:
            return self.builder.cancel()
        return self.builder.interrupt(stop)

    def _failed(self, error: GatewayError) -> list[Event]:
        terminal = self.builder.fail(error)
        self.result.error = error
        return terminal

    def _stops_before(self, delta: Delta) -> bool:
        """A stop is pending: whether to end before ``delta`` (only an open call's own deltas pass,
        and not even those for a failure)."""
        if self._cancel or isinstance(self._stop, GatewayError):
            return True
        return not (self.builder.call_open and isinstance(delta, _CALL_PARTS))

    def _own_cut(self) -> bool:
        """A CancelledError while awaiting the upstream: True if it is only the stop's own cut;
        False for a real cancellation (the client left, the gateway is going), which goes on."""
        task = self._task
        if not self._cut or task is None:
            return False
        self._cut = False
        return task.uncancel() == 0  # > 0: cancelled by someone else as well

    def _feed(self, delta: Delta) -> list[Event]:
        if type(delta) is TextDelta:  # the per-token hot path: nothing of allowed-tools applies
            return self.builder.feed(delta)
        match delta:
            case ToolCallStart(key=key, name=name):
                if name not in self._allowed:
                    self._dropped.add(key)
                    log.warning("disallowed_tool_call_dropped", provider=self.result.provider)
                    return []
            case ToolCallArgsDelta(key=key) if key in self._dropped:
                return []
            case Finish(reason="tool_calls") if self._dropped:
                delta = Finish("stop")
        return self.builder.feed(delta)

    async def _close(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await _close(stream)
        if self._call is not None:
            call, self._call = self._call, None
            err = self.result.error
            if isinstance(err, UpstreamError):
                outcome = upstream_outcome(err)
            else:
                # still in progress here: cancelled (run's finally marks it so after closing)
                outcome = "cancelled" if self.result.status in ("in_progress", "cancelled") else "ok"
            call.close(outcome, err.code if err is not None else outcome)
        if self._label is not None:
            label, self._label = self._label, None
            with contextlib.suppress(ValueError):  # closed from another context: nothing to undo
                structlog.contextvars.reset_contextvars(deployment=label)


class Warmup(Turn):
    """A ``generate: false`` turn: the same runner and end-of-turn hooks, but no upstream is
    opened; the response completes with empty output and zero usage."""

    __slots__ = ()

    async def _open(self) -> None:
        self._first = Usage(input_tokens=0, output_tokens=0)


async def _relay(events: AsyncGenerator[Event, None], emit: Emit) -> None:
    """Every event to ``emit``. An event the transport cannot encode (a TypeError or ValueError
    from the serializer) fails the response in the builder, so the client still gets its terminal
    event; a client that left raises out as usual."""
    step = events.__anext__  # bound once: one call per event
    try:
        event = await step()
        while True:
            try:
                await emit(event)
            except (TypeError, ValueError):
                log.exception("event_encoding_failed", event_type=event.get("type"))
                event = await events.athrow(ServerError("The gateway failed while encoding this response."))
                continue
            event = await step()
    except StopAsyncIteration:
        return


async def _close(stream: AsyncIterator[Delta]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:
            log.debug("adapter_close_failed")
