"""The one turn runner, for every transport: open → events → drain → the end-of-turn hooks.

``Turn.run(emit)`` opens the upstream call and waits for its first delta, retrying and falling
back along the route (on retryable failures, before any output), so that a failure before the first
event raises an ordinary ``GatewayError`` and nothing was emitted. Otherwise every spec event goes
to ``emit`` (SSE frames, WebSocket messages; nothing for a JSON answer, which reads the result),
ending with exactly one terminal event.

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
import dataclasses
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import structlog

from adapters.base import UpstreamRequest
from adapters.deltas import Delta, Finish, ItemDone, ToolCallArgsDelta, ToolCallStart, Usage
from gateway.engine.builder import ResponseBuilder
from gateway.engine.context import Context
from gateway.engine.routing import Route
from gateway.kernel.errors import GatewayError, ServerError, UpstreamError
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
    provider that answered, usage, the final ResponseResource, and the error it failed with.
    ``started``: its first event was produced (False: it failed while opening)."""

    route: Route
    context: Context
    resource: dict[str, Any]
    request_id: str | None = None
    status: str = "in_progress"
    provider: str = ""
    usage: dict[str, Any] | None = None
    error: GatewayError | None = None
    started: bool = False

    @property
    def ended(self) -> bool:
        """The response completed or came back incomplete: it exists and may be kept."""
        return self.status in _ENDED

    @property
    def output(self) -> list[dict[str, Any]]:
        output: list[dict[str, Any]] = self.resource["output"]
        return output


TurnHook = Callable[[TurnResult], Awaitable[None] | None]


def _backoff(attempt: int, retry: RetrySettings, retry_after: float | None) -> float:
    if retry_after is not None:
        return min(retry_after, retry.retry_after_cap)
    return random.uniform(0, min(retry.backoff_max, retry.backoff_base * 2**attempt))


class Turn:
    """One response in the making. Made by ``Gateway.prepare``; run once."""

    __slots__ = (
        "_allowed",
        "_cut",
        "_decided",
        "_dropped",
        "_first",
        "_hooks",
        "_hooks_done",
        "_reading",
        "_stop",
        "_stream",
        "_task",
        "builder",
        "max_events",
        "rate_headers",
        "request",
        "result",
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
    ) -> None:
        self.request = request
        self.builder = ResponseBuilder(resource, error_event=error_event)
        self.max_events = max_events
        self.result = TurnResult(
            route=route, context=context, resource=resource, request_id=request_id, provider=route.provider
        )
        self._stream: AsyncIterator[Delta] | None = None
        self._first: Delta | None = None
        self._allowed = parse_tool_choice(request.tool_choice).permitted(request.tools)
        self._dropped: set[int | str] = set()
        self._hooks: list[TurnHook] = []
        self._hooks_done = False
        self._stop: str | None = None  # a stop was asked for, with this incomplete_details.reason
        self._decided = False  # the stream loop is over: a stop can no longer change the outcome
        self._reading = False  # the relay is awaiting the upstream's next delta
        self._cut = False  # the stop cancelled that await
        self._task: asyncio.Task[Any] | None = None
        # the x-ratelimit-* headers of the admission (gateway/engine/limits.py), for the transport
        self.rate_headers: dict[str, str] = {}

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
            if self._reading and self._task is not None and not self.builder.call_open:
                self._cut = True
                self._task.cancel()  # the await on the upstream; caught in _events
        return True

    # -- the runner ------------------------------------------------------------------------------
    async def run(
        self, emit: Emit | None = None, *, opened: Callable[[], Awaitable[None]] | None = None
    ) -> TurnResult:
        """Open, then relay every event to ``emit``; ``opened`` is awaited once the upstream has
        answered, before the first event (an SSE response sends its headers there). Raises the
        ``GatewayError`` of a turn that fails before its first event; otherwise returns the result."""
        try:
            try:
                await self._open()
            except GatewayError as exc:
                self.result.error = exc
                self.result.status = "failed"
                await self._end()
                raise
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
        """The first delta, along the route: each provider's retries, then each fallback, all
        within the primary route's ``timeouts.total`` (backoff and Retry-After included: a wait
        that would overrun it is not made, and the last error is raised instead). Adapters bound
        each call by what is left of the request's ``deadline`` (``UpstreamRequest.seconds_left``)."""
        primary = self.result.route
        deadline = time.monotonic() + primary.total_seconds
        self.request.deadline = deadline  # the turn's own request: no other turn sees it
        last: UpstreamError | None = None
        for route in (primary, *primary.fallbacks):
            request = self.request
            if request.model != route.upstream_model:
                request = dataclasses.replace(request, model=route.upstream_model)
            for attempt in range(route.retry.attempts + 1):
                stream = route.adapter.stream(request)
                try:
                    self._first = await anext(stream)
                except StopAsyncIteration:
                    self._first = None
                except UpstreamError as exc:
                    await _close(stream)
                    last = exc
                    log.warning(
                        "upstream_failed",
                        request_id=self.result.request_id,
                        provider=route.provider,
                        attempt=attempt + 1,
                        code=exc.code,
                        upstream_status=exc.upstream_status,
                        retryable=exc.retryable,
                    )
                    if not exc.retryable:
                        raise
                    if attempt < route.retry.attempts:
                        wait = _backoff(attempt, route.retry, exc.retry_after)
                        if time.monotonic() + wait >= deadline:
                            raise  # the retry could not finish in time: the client hears now
                        await asyncio.sleep(wait)
                    continue
                except BaseException:
                    await _close(stream)
                    raise
                self._stream = stream
                if route is not primary:
                    log.info(
                        "fallback_used",
                        request_id=self.result.request_id,
                        model=primary.model,
                        fallback=route.model,
                    )
                self.result.provider = route.provider
                return
            log.warning(
                "route_exhausted",
                request_id=self.result.request_id,
                model=route.model,
                provider=route.provider,
            )
        assert last is not None
        raise last

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
            for ev in b.start():
                yield ev
            stopped = False
            try:
                if self._first is not None:
                    first, self._first = self._first, None
                    if self._stop is not None and self._stops_before(first):
                        stopped = True
                    else:
                        for ev in self._feed(first):
                            yield ev
                            count += 1
                if self._stream is not None and not stopped:
                    if self._stop is not None and not b.call_open:
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
                                    code="event_limit_exceeded",
                                )
                            if self._stop is not None and not b.call_open:
                                stopped = True
                                break
                            self._reading = True
            except asyncio.CancelledError:
                if not self._own_cut():
                    raise
                stopped = True
            finally:
                self._reading = False
                self._decided = True
            if stopped:
                await self._close()  # cancel the upstream call before the end-of-turn hooks
                assert self._stop is not None
                terminal = b.interrupt(self._stop)
            else:
                terminal = b.finish()
        except GatewayError as exc:
            log.warning("turn_failed", request_id=res.request_id, code=exc.code, provider=res.provider)
            terminal = b.fail(exc)
            res.error = exc
        except Exception:  # an adapter bug must still end the stream cleanly
            log.exception("turn_crashed", request_id=res.request_id, provider=res.provider)
            err = ServerError("The gateway failed while producing this response.")
            terminal = b.fail(err)
            res.error = err
        res.status = b.resource["status"]
        res.usage = b.resource.get("usage")

        def revoke(exc: GatewayError) -> None:
            # A promise the turn cannot keep (it could not be stored): fail rather than hand out
            # a dangling id. The remaining hooks then see the failure.
            terminal[-1:] = b.revoke(exc)
            res.error = exc
            res.status = "failed"

        await self._end(revoke if res.ended else None)
        for ev in terminal:
            yield ev

    def _stops_before(self, delta: Delta) -> bool:
        """A stop is pending: whether to end before ``delta`` (only an open call's own deltas pass)."""
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


async def _relay(events: AsyncGenerator[Event, None], emit: Emit) -> None:
    """Every event to ``emit``. An event the transport cannot encode (a TypeError or ValueError
    from the serializer) fails the response in the builder, so the client still gets its terminal
    event; a client that left raises out as usual."""
    try:
        event = await anext(events)
        while True:
            try:
                await emit(event)
            except (TypeError, ValueError):
                log.exception("event_encoding_failed", event_type=event.get("type"))
                event = await events.athrow(ServerError("The gateway failed while encoding this response."))
                continue
            event = await anext(events)
    except StopAsyncIteration:
        return


async def _close(stream: AsyncIterator[Delta]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:
            log.debug("adapter_close_failed")
