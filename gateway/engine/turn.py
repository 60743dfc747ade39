"""One turn: upstream request → adapter deltas → ResponseBuilder events, transport-agnostic.

``Turn.open()`` starts the upstream call and waits for its first delta, retrying and falling back
(on retryable failures, before any output) so that failures before the first event surface as
ordinary errors. ``Turn.events()`` then yields spec events to the end, persisting a ``store: true``
response before its terminal event is sent. Allowed-tools enforcement lives here, once.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from adapters.base import UpstreamRequest
from adapters.deltas import Delta, Finish, ToolCallArgsDelta, ToolCallStart
from gateway.engine.builder import ResponseBuilder
from gateway.engine.routing import Route, Router
from gateway.kernel.errors import GatewayError, ServerError, UpstreamError
from gateway.kernel.settings import RetrySettings
from state.base import ResponseStore, StoredResponse

log = structlog.get_logger("gateway.engine.turn")
Event = dict[str, Any]


@dataclass(slots=True)
class TurnResult:
    """What a finished turn leaves for the caller (logs, the WebSocket cache)."""

    status: str = "in_progress"
    provider: str = ""
    usage: dict[str, Any] | None = None
    error: GatewayError | None = None
    output: list[dict[str, Any]] = field(default_factory=list)


def allowed_tool_names(tool_choice: Any, tools: list[dict[str, Any]]) -> set[str] | None:
    """Names a call may use; None means any offered tool."""
    if tool_choice == "none":
        return set()
    if isinstance(tool_choice, dict):
        if tool_choice.get("type") == "allowed_tools":
            if tool_choice.get("mode") == "none":
                return set()
            return {t["name"] for t in tool_choice.get("tools", [])}
        if tool_choice.get("type") == "function":
            return {tool_choice["name"]}
    return {t["name"] for t in tools}


def _backoff(attempt: int, retry: RetrySettings, retry_after: float | None) -> float:
    if retry_after is not None:
        return min(retry_after, retry.retry_after_cap)
    return random.uniform(0, min(retry.backoff_max, retry.backoff_base * 2**attempt))


class Turn:
    def __init__(
        self,
        *,
        request: UpstreamRequest,
        route: Route,
        router: Router,
        resource: dict[str, Any],
        store: ResponseStore,
        stored: StoredResponse | None,
        max_events: int,
        on_done: Callable[[TurnResult], None] | None = None,
    ) -> None:
        self.request = request
        self.route = route
        self.router = router
        self.builder = ResponseBuilder(resource)
        self.store = store
        self.stored = stored  # filled in and persisted at the end when store=true
        self.max_events = max_events
        self.result = TurnResult(provider=route.provider)
        self._stream: AsyncIterator[Delta] | None = None
        self._first: Delta | None = None
        self._allowed = allowed_tool_names(request.tool_choice, request.tools)
        self._dropped: set[int | str] = set()
        self._on_done = on_done

    # -- opening, with retries and fallbacks ------------------------------------------------------
    async def open(self) -> None:
        routes = [self.route]
        for name in self.route.fallbacks:
            try:
                routes.append(self.router.resolve(name))
            except GatewayError:
                continue
        last: UpstreamError | None = None
        for route in routes:
            settings = self.router.providers[route.provider]
            for attempt in range(settings.retry.attempts + 1):
                self.request.model = route.upstream_model
                stream = route.adapter.stream(self.request)
                try:
                    self._first = await anext(stream)
                except StopAsyncIteration:
                    self._first = None
                except UpstreamError as exc:
                    await _close(stream)
                    last = exc
                    log.warning(
                        "upstream_failed",
                        provider=route.provider,
                        attempt=attempt + 1,
                        code=exc.code,
                        upstream_status=exc.upstream_status,
                        retryable=exc.retryable,
                    )
                    if not exc.retryable:
                        raise
                    if attempt < settings.retry.attempts:
                        await asyncio.sleep(_backoff(attempt, settings.retry, exc.retry_after))
                    continue
                except BaseException:
                    await _close(stream)
                    raise
                self._stream = stream
                if route is not self.route:
                    log.info("fallback_used", model=self.route.model, fallback=route.model)
                self.result.provider = route.provider
                return
            log.warning("route_exhausted", model=route.model, provider=route.provider)
        assert last is not None
        raise last

    # -- streaming -------------------------------------------------------------------------------
    async def events(self) -> AsyncIterator[Event]:
        """Every event of the response, ending with exactly one terminal event."""
        b = self.builder
        count = 0
        try:
            for ev in b.start():
                yield ev
            try:
                if self._first is not None:
                    for ev in self._feed(self._first):
                        yield ev
                        count += 1
                    self._first = None
                if self._stream is not None:
                    async for delta in self._stream:
                        for ev in self._feed(delta):
                            yield ev
                            count += 1
                        if count > self.max_events:
                            raise UpstreamError(
                                "The response exceeded the gateway's event limit.",
                                code="event_limit_exceeded",
                            )
                terminal = b.finish()
            except GatewayError as exc:
                log.warning("turn_failed", code=exc.code, provider=self.result.provider)
                terminal = b.fail(exc)
                self.result.error = exc
            except Exception as exc:  # an adapter bug must still end the stream cleanly
                log.exception("turn_crashed", provider=self.result.provider)
                err = ServerError("The gateway failed while producing this response.")
                terminal = b.fail(err)
                self.result.error = err
                del exc
            if self.stored is not None and self.result.error is None:
                try:
                    self.stored.resource = b.resource
                    await self.store.put(self.stored)
                except GatewayError as exc:
                    # The answer exists but cannot be kept: fail rather than hand out a dangling id.
                    terminal[-1:] = b.revoke(exc)
                    self.result.error = exc
            for ev in terminal:
                yield ev
        finally:
            await self.close()
            status = b.resource["status"]
            self.result.status = "cancelled" if status == "in_progress" else status  # the client left
            self.result.usage = b.resource.get("usage")
            self.result.output = b.resource["output"]
            if self._on_done is not None:
                self._on_done(self.result)

    def _feed(self, delta: Delta) -> list[Event]:
        kind = type(delta)
        if kind is ToolCallStart:
            if self._allowed is not None and delta.name not in self._allowed:  # type: ignore[union-attr]
                self._dropped.add(delta.key)  # type: ignore[union-attr]
                log.warning("disallowed_tool_call_dropped", provider=self.result.provider)
                return []
        elif kind is ToolCallArgsDelta:
            if delta.key in self._dropped:  # type: ignore[union-attr]
                return []
        elif kind is Finish and self._dropped and delta.reason == "tool_calls":  # type: ignore[union-attr]
            delta = Finish("stop")
        return self.builder.feed(delta)

    async def close(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await _close(stream)


async def _close(stream: AsyncIterator[Delta]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:
            log.debug("adapter_close_failed")
