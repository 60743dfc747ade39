"""What the observability tests share: a gateway whose tracer exports to memory, and a scan of
every exported span for text that must never be in one."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.app import create_app
from gateway.kernel.settings import Settings
from gateway.observability.tracing import OtelTracer
from tests.harness import ServedApp

CLIENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = {"traceparent": f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"}


@contextmanager
def serve_traced(settings: dict[str, Any]) -> Iterator[tuple[ServedApp, InMemorySpanExporter]]:
    """The app under uvicorn with tracing on, every span exported to memory as it ends."""
    s = Settings(**settings)
    app = create_app(s)
    exporter = InMemorySpanExporter()
    app.state.tracer = OtelTracer.build(s, SimpleSpanProcessor(exporter))
    served = ServedApp(app).start()
    try:
        yield served, exporter
    finally:
        served.stop()


def everything_said(span: ReadableSpan) -> str:
    """A span's name, attributes, events and links, as one text to search."""
    parts = [span.name, repr(dict(span.attributes or {})), repr(dict(span.resource.attributes))]
    for event in span.events:
        parts += [event.name, repr(dict(event.attributes or {}))]
    for link in span.links:
        parts.append(repr(dict(link.attributes or {})))
    if span.status.description:
        parts.append(span.status.description)
    return "\n".join(parts)


def assert_never_said(spans: list[ReadableSpan], *texts: str) -> None:
    assert spans
    for span in spans:
        said = everything_said(span)
        for text in texts:
            assert text not in said, f"{text!r} in span {span.name}"


def by_trace(spans: list[ReadableSpan], trace_id: int) -> list[ReadableSpan]:
    return [s for s in spans if s.context is not None and s.context.trace_id == trace_id]


DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gateway-dashboard.json"
_METRIC = re.compile(r"\b((?:gateway|process)_[a-z0-9_]+)\b")


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the Grafana dashboard (panel targets and template variables)."""
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", ())]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    return exprs


def metric_names(expr: str) -> set[str]:
    return set(_METRIC.findall(expr))
