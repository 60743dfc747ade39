"""The engine's telemetry interface: what the turn, the store and the limiter report (``Observer``:
metrics) and the spans they open (``Tracer``: tracing). Both are no-ops by default and cost about a
method call; the app installs real ones (``gateway/observability/``), and the tracer names the spans'
GenAI attributes (``gateway/observability/genai.py``): the engine passes its routes and deployments.

Nothing here (and nothing a caller passes) may carry message content: spans get ids, names,
counts, codes and timings only.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING

from gateway.kernel.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamRejected,
    UpstreamTimeout,
)

if TYPE_CHECKING:
    from gateway.engine.routing import Deployment, Route

Attr = str | bool | int | float | list[str]


def upstream_outcome(exc: BaseException | None) -> str:
    """A bounded outcome of one upstream attempt: ok, rate_limited, timeout, connect_error,
    rejected, server_error, error or cancelled."""
    if exc is None:
        return "ok"
    if isinstance(exc, UpstreamRateLimited):
        return "rate_limited"
    if isinstance(exc, UpstreamTimeout):
        return "timeout"
    if isinstance(exc, UpstreamConnectError):
        return "connect_error"
    if isinstance(exc, UpstreamRejected):
        return "rejected"
    if isinstance(exc, UpstreamError):
        status = exc.upstream_status
        return "server_error" if status is not None and status >= 500 else "error"
    if not isinstance(exc, Exception):  # CancelledError, GeneratorExit: the client went away
        return "cancelled"
    return "error"


class Observer:
    """The engine's metrics sink (a no-op; ``gateway.observability.observer.Metrics`` is the real one)."""

    def upstream_attempt(self, deployment: Deployment, outcome: str, seconds: float) -> None:
        """One upstream attempt ended (``outcome``: see ``upstream_outcome``)."""

    def upstream_retry(self, deployment: Deployment) -> None:
        """A try on ``deployment`` failed retryably and the route tries again (the same deployment or
        another)."""

    def fallback(self, primary: Route, fallback: Route) -> None:
        """The turn moved on to a fallback route."""

    def first_token(self, primary: Route, deployment: Deployment, seconds: float) -> None:
        """A streamed turn's first delta arrived ``seconds`` after the turn began opening
        (``primary``: the model asked for; ``deployment``: the one that answered, maybe a
        fallback's)."""

    def store_op(self, op: str, seconds: float, failed: bool) -> None:
        """One call to the response store."""

    def rate_limited(self, tenant: str, limit: str) -> None:
        """A tenancy limit refused a request (``limit``: requests_per_minute, tokens_per_minute,
        concurrent_requests, budget, websocket_connections)."""

    def limiter_error(self) -> None:
        """A call to the tenancy limits' limiter failed."""

    def spend(self, tenant: str, model: str, micros: int) -> None:
        """A turn of ``tenant`` on ``model`` cost ``micros`` micro-units of the currency."""

    def compaction(self, kind: str) -> None:
        """A context was compacted (``kind``: compact | truncation)."""

    def mcp_call(self, server_label: str, outcome: str, seconds: float, *, list_tools: bool = False) -> None:
        """One call to an MCP server ended (``outcome``: ok | error | cancelled); ``list_tools``:
        the listing of its tools, else a tool call."""


class Span:
    """A no-op span: what the engine may tell one. Entering makes it the current span (children
    and log lines see it); leaving ends it."""

    __slots__ = ()
    recording = False

    def set(self, key: str, value: Attr | None) -> None:
        pass

    def update(self, attributes: Mapping[str, Attr | None]) -> None:
        pass

    def fail(self, code: str | None) -> None:
        """Mark the span an error (``error.type``: the gateway's error code, never a message)."""

    def end(self) -> None:
        pass

    def trace_headers(self) -> dict[str, str] | None:
        """The W3C ``traceparent``/``tracestate`` naming this span, for the upstream call."""
        return None

    def __enter__(self) -> Span:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        pass


NOOP_SPAN = Span()


class Tracer:
    """A no-op tracer (``gateway.observability.tracing.OtelTracer`` is the real one): every span is
    ``NOOP_SPAN``."""

    enabled = False

    def server(
        self, name: str, carrier: Mapping[str, str] | None, attributes: Mapping[str, Attr | None]
    ) -> Span:
        """A request's (or a WebSocket turn's) span, the child of the client's ``traceparent`` in
        ``carrier`` (its request headers) when it sent one."""
        return NOOP_SPAN

    def child(self, name: str, attributes: Mapping[str, Attr | None], *, client: bool = False) -> Span:
        """A span under the current one (``client``: an outgoing call)."""
        return NOOP_SPAN

    def call_span(self, route: Route, deployment: Deployment, number: int, *, fallback: bool) -> Span:
        """An upstream call's client span under the current one, with its GenAI attributes
        (``number``: 0 for the first try on ``route``; ``fallback``: ``route`` is a fallback's)."""
        return NOOP_SPAN


NOOP_OBSERVER = Observer()
NOOP_TRACER = Tracer()
