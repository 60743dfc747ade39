"""OpenTelemetry tracing (docs/operations.md, "Tracing"): the SDK behind the engine's ``Tracer`` interface
(``gateway/engine/telemetry.py``), exporting over OTLP/HTTP.

Off unless configured: ``tracing.enabled``/``tracing.endpoint`` in the config, or the standard
environment (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
``OTEL_TRACES_EXPORTER``); ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turn it off.
Off, the engine keeps its no-op tracer and the SDK is never imported.

Each app owns its ``TracerProvider`` (not the process-global one), so that several apps in one
process (the tests) do not share spans. Only W3C trace context is read from clients and sent
upstream (``traceparent``/``tracestate``): a client's baggage never reaches a provider.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway import __version__
from gateway.engine.telemetry import NOOP_TRACER, Attr, Span, Tracer
from gateway.kernel.settings import Settings
from gateway.logs import enable_trace_ids
from gateway.observability.genai import call_span

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

    from gateway.engine.routing import Deployment, Route

_PROPAGATOR = TraceContextTextMapPropagator()
_ON = ("otlp", "console")


def wanted(settings: Settings, env: Mapping[str, str] | None = None) -> bool:
    """Whether tracing is on for ``settings`` in environment ``env`` (default: ``os.environ``)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    cfg = settings.tracing
    if cfg.enabled is not None:
        return cfg.enabled
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter.split(",")[0].strip() in _ON
    return bool(
        cfg.endpoint
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def from_settings(settings: Settings) -> Tracer:
    """The app's tracer: the no-op one unless tracing is wanted, else an ``OtelTracer`` exporting
    in batches (``OTEL_BSP_*``) to the configured exporter."""
    if not wanted(settings):
        return NOOP_TRACER
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    return OtelTracer.build(settings, BatchSpanProcessor(_exporter(settings)))


def _exporter(settings: Settings) -> SpanExporter:
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")[0].strip().lower()
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    endpoint = settings.tracing.endpoint
    # None: the exporter reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, else http://localhost:4318
    return OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces" if endpoint else None)


class OtelSpan(Span):
    """An SDK span behind the engine's ``Span``."""

    __slots__ = ("_failed", "_span", "_token")
    recording = True

    def __init__(self, span: trace.Span) -> None:
        self._span = span
        self._token: object | None = None
        self._failed = False

    def set(self, key: str, value: Attr | None) -> None:
        if value is not None:
            self._span.set_attribute(key, value)

    def update(self, attributes: Mapping[str, Attr | None]) -> None:
        self._span.set_attributes({k: v for k, v in attributes.items() if v is not None})

    def fail(self, code: str | None) -> None:
        self._failed = True
        self._span.set_attribute("error.type", code or "error")
        self._span.set_status(Status(StatusCode.ERROR))

    def end(self) -> None:
        self._span.end()

    def trace_headers(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(self._span))
        return carrier

    def __enter__(self) -> OtelSpan:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # The error's type or code only: an exception's message might quote a request.
        if exc is not None and not self._failed:
            self.fail(getattr(exc, "code", None) or (kind.__name__ if kind else None))
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._token = None
        self._span.end()


class OtelTracer(Tracer):
    """The engine's ``Tracer`` on an SDK ``TracerProvider`` the app owns."""

    enabled = True

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("openresponses-gateway", __version__)
        enable_trace_ids()

    @classmethod
    def build(cls, settings: Settings, *processors: object) -> OtelTracer:
        """A provider with the service's resource (``OTEL_SERVICE_NAME`` and
        ``OTEL_RESOURCE_ATTRIBUTES`` win over the config), the sampler (``OTEL_TRACES_SAMPLER``
        wins over ``tracing.sample_ratio``) and ``processors``."""
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        attrs: dict[str, str] = {"service.version": __version__}
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attrs["service.name"] = settings.tracing.service_name
        sampler = None
        if not os.environ.get("OTEL_TRACES_SAMPLER"):
            sampler = ParentBased(TraceIdRatioBased(settings.tracing.sample_ratio))
        provider = TracerProvider(resource=Resource.create(attrs), sampler=sampler)
        for p in processors:
            provider.add_span_processor(p)  # type: ignore[arg-type]
        return cls(provider)

    def server(
        self, name: str, carrier: Mapping[str, str] | None, attributes: Mapping[str, Attr | None]
    ) -> Span:
        parent = _PROPAGATOR.extract(carrier) if carrier else None
        return OtelSpan(
            self._tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=_clean(attributes))
        )

    def child(self, name: str, attributes: Mapping[str, Attr | None], *, client: bool = False) -> Span:
        kind = SpanKind.CLIENT if client else SpanKind.INTERNAL
        return OtelSpan(self._tracer.start_span(name, kind=kind, attributes=_clean(attributes)))

    def call_span(self, route: Route, deployment: Deployment, number: int, *, fallback: bool) -> Span:
        name, attributes = call_span(route, deployment, number, fallback=fallback)
        return self.child(name, attributes, client=True)

    async def aclose(self) -> None:
        """Export what is pending and stop (it may wait on the exporter: off the loop)."""
        await asyncio.to_thread(self.provider.shutdown)


def _clean(attributes: Mapping[str, Attr | None]) -> dict[str, Attr]:
    return {k: v for k, v in attributes.items() if v is not None}


async def aclose(tracer: Tracer) -> None:
    if isinstance(tracer, OtelTracer):
        await tracer.aclose()
