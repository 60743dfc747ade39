"""Tracing through the real app and a fake upstream, spans exported to memory: one span per HTTP
request, WebSocket turn and compaction with the GenAI attributes; one child per upstream attempt
(retries and fallbacks visible) and per store call; the client's traceparent is honoured and the
attempt's is sent upstream; no prompt or answer text in any span."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.engine.telemetry import NOOP_TRACER
from gateway.kernel.settings import Settings
from gateway.observability.tracing import wanted
from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.fakes.server import unused_port
from tests.harness import ServedApp
from tests.helpers import TWO_TENANTS, A, fake_fixtures
from tests.observability.helpers import (
    CLIENT_SPAN_ID,
    CLIENT_TRACE_ID,
    TRACEPARENT,
    assert_never_said,
    by_trace,
    serve_traced,
)
from tests.ws.helpers import run_turn, ws_connect

fake_server, fake = fake_fixtures(FakeOpenAIChat)
PROMPT = "PROMPT-purple-elephant-42"
ANSWER = "ANSWER-tangerine-submarine-7"
INSTRUCTIONS = "INSTRUCTIONS-quiet-harbour"


@pytest.fixture(scope="module")
def traced(fake_server: FakeOpenAIChat) -> Iterator[tuple[ServedApp, InMemorySpanExporter]]:
    settings = {
        "providers": {
            "up": {"kind": "openai-chat", "base_url": fake_server.base_url, "retry": {"attempts": 0}},
            "dead": {
                "kind": "openai-chat",
                "base_url": f"http://127.0.0.1:{unused_port()}/v1",
                "retry": {"attempts": 1, "backoff_base": 0.01},
            },
        },
        "models": {
            "m": {"provider": "up", "upstream_model": "fake-llm"},
            "small": {"provider": "up", "upstream_model": "fake-llm", "context_window": 2000},
            "flaky": {"provider": "dead", "upstream_model": "x", "fallbacks": ["m"]},
        },
        "auth": {"api_keys": [{**TWO_TENANTS["api_keys"][0], "name": "ci-key"}]},
    }
    with serve_traced(settings) as pair:
        yield pair


@pytest.fixture
def exporter(traced: tuple[ServedApp, InMemorySpanExporter]) -> InMemorySpanExporter:
    traced[1].clear()
    return traced[1]


async def finished(exporter: InMemorySpanExporter, name: str, count: int = 1) -> list[ReadableSpan]:
    """Every exported span, once ``count`` spans named ``name`` have ended (a server span ends just
    after its response is sent)."""
    for _ in range(200):
        spans = list(exporter.get_finished_spans())
        if sum(s.name == name for s in spans) >= count:
            return spans
        await asyncio.sleep(0.02)
    raise AssertionError(f"no span {name!r}: {[s.name for s in exporter.get_finished_spans()]}")


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def parent_id(span: ReadableSpan) -> int | None:
    """The span id of ``span``'s parent (None: a root span)."""
    return span.parent.span_id if span.parent is not None else None


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def post(s: ServedApp, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(base_url=s.base_url, timeout=30) as c:
        return await c.post("/v1/responses", json=body, headers={**A, **(headers or {})})


async def test_an_http_request_is_one_span_under_the_clients_trace(
    traced: tuple[ServedApp, InMemorySpanExporter], exporter: InMemorySpanExporter, fake: FakeOpenAIChat
) -> None:
    fake.add(Reply.text(ANSWER))
    r = await post(traced[0], {"model": "m", "input": PROMPT, "instructions": INSTRUCTIONS}, TRACEPARENT)
    assert r.status_code == 200 and ANSWER in r.text
    spans = await finished(exporter, "POST /v1/responses")
    server = one(spans, "POST /v1/responses")
    assert server.kind is SpanKind.SERVER
    assert server.context.trace_id == int(CLIENT_TRACE_ID, 16)
    assert parent_id(server) == int(CLIENT_SPAN_ID, 16)
    a = attrs(server)
    body = r.json()
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "m"
    assert a["gen_ai.response.model"] == "m"
    assert a["gen_ai.response.id"] == body["id"]
    assert a["gen_ai.usage.input_tokens"] == body["usage"]["input_tokens"]
    assert a["gen_ai.usage.output_tokens"] == body["usage"]["output_tokens"]
    assert list(a["gen_ai.response.finish_reasons"]) == ["stop"]
    assert a["gateway.tenant"] == "a" and a["gateway.api_key.name"] == "ci-key"
    assert a["gen_ai.provider.name"] == "openai" and a["gateway.provider"] == "up"
    assert a["gateway.status"] == "completed"
    assert server.status.status_code is not StatusCode.ERROR

    attempt = one(spans, "chat fake-llm")
    assert attempt.kind is SpanKind.CLIENT and parent_id(attempt) == server.context.span_id
    b = attrs(attempt)
    assert b["gen_ai.provider.name"] == "openai" and b["gen_ai.request.model"] == "fake-llm"
    assert b["gateway.deployment"] == "up" and b["gateway.attempt"] == 1 and b["gateway.fallback"] is False
    # the upstream call carries the attempt's span as its parent
    sent = fake.requests[-1].headers["traceparent"]
    assert sent == f"00-{CLIENT_TRACE_ID}-{attempt.context.span_id:016x}-01"
    store = one(spans, "state put")
    assert parent_id(store) == server.context.span_id and attrs(store)["db.operation.name"] == "put"
    assert_never_said(spans, PROMPT, ANSWER, INSTRUCTIONS, "sk-a")


async def test_without_a_traceparent_the_request_starts_a_trace(
    traced: tuple[ServedApp, InMemorySpanExporter], exporter: InMemorySpanExporter, fake: FakeOpenAIChat
) -> None:
    fake.add(Reply.text(ANSWER))
    r = await post(traced[0], {"model": "m", "input": PROMPT, "stream": True, "store": False})
    assert r.status_code == 200 and ANSWER.split("-")[1] in r.text
    spans = await finished(exporter, "POST /v1/responses")
    server = one(spans, "POST /v1/responses")
    assert server.parent is None
    assert fake.requests[-1].headers["traceparent"].split("-")[1] == f"{server.context.trace_id:032x}"
    assert_never_said(spans, PROMPT, ANSWER)


async def test_retries_and_fallbacks_are_spans_of_their_own(
    traced: tuple[ServedApp, InMemorySpanExporter], exporter: InMemorySpanExporter, fake: FakeOpenAIChat
) -> None:
    fake.add(Reply.text(ANSWER))
    r = await post(traced[0], {"model": "flaky", "input": PROMPT, "store": False}, TRACEPARENT)
    assert r.status_code == 200
    spans = by_trace(await finished(exporter, "POST /v1/responses"), int(CLIENT_TRACE_ID, 16))
    server = one(spans, "POST /v1/responses")
    attempts = sorted((s for s in spans if s.kind is SpanKind.CLIENT), key=lambda s: s.start_time or 0)
    seen = [
        (
            attrs(s)["gateway.deployment"],
            attrs(s)["gateway.attempt"],
            attrs(s)["gateway.fallback"],
            s.status.status_code,
        )
        for s in attempts
    ]
    assert seen == [
        ("dead", 1, False, StatusCode.ERROR),
        ("dead", 2, False, StatusCode.ERROR),
        ("up", 1, True, StatusCode.UNSET),
    ]
    assert attrs(attempts[0])["error.type"] == "upstream_connect_error"
    assert all(parent_id(s) == server.context.span_id for s in attempts)
    assert attrs(server)["gateway.provider"] == "up"


async def test_an_upstream_failure_marks_the_request_span(
    traced: tuple[ServedApp, InMemorySpanExporter], exporter: InMemorySpanExporter, fake: FakeOpenAIChat
) -> None:
    fake.add(Reply.error(500))
    r = await post(traced[0], {"model": "m", "input": PROMPT})
    assert r.status_code == 502
    spans = await finished(exporter, "POST /v1/responses")
    server = one(spans, "POST /v1/responses")
    assert server.status.status_code is StatusCode.ERROR
    assert attrs(server)["error.type"] == "upstream_error"
    assert one(spans, "chat fake-llm").status.status_code is StatusCode.ERROR
    assert_never_said(spans, PROMPT)


async def test_a_websocket_turn_is_one_span(
    traced: tuple[ServedApp, InMemorySpanExporter], exporter: InMemorySpanExporter, fake: FakeOpenAIChat
) -> None:
    fake.add(Reply.text(ANSWER), Reply.text(ANSWER))
    async with ws_connect(traced[0], additional_headers={**A, **TRACEPARENT}) as ws:
        first = await run_turn(ws, model="m", input=PROMPT)
        assert first[-1]["type"] == "response.completed"
        second = await run_turn(ws, model="m", input=PROMPT, previous_response_id=first[-1]["response"]["id"])
        assert second[-1]["type"] == "response.completed"
    spans = await finished(exporter, "websocket response.create", 2)
    turns = [s for s in spans if s.name == "websocket response.create"]
    assert {attrs(t)["gen_ai.response.id"] for t in turns} == {
        first[-1]["response"]["id"],
        second[-1]["response"]["id"],
    }
    for t in turns:
        assert t.context.trace_id == int(CLIENT_TRACE_ID, 16)
        assert attrs(t)["gateway.transport"] == "websocket" and attrs(t)["gateway.tenant"] == "a"
        assert any(s.kind is SpanKind.CLIENT and parent_id(s) == t.context.span_id for s in spans)
    assert_never_said(spans, PROMPT, ANSWER)


async def test_a_compaction_is_one_span_with_its_summarizing_call(
    traced: tuple[ServedApp, InMemorySpanExporter], exporter: InMemorySpanExporter, fake: FakeOpenAIChat
) -> None:
    fake.add(Reply.text(ANSWER))
    talk = [
        {"type": "message", "role": "user" if n % 2 == 0 else "assistant", "content": f"{PROMPT} {n} " * 12}
        for n in range(8)
    ]
    async with httpx.AsyncClient(base_url=traced[0].base_url, timeout=30) as c:
        r = await c.post("/v1/responses/compact", json={"model": "small", "input": talk}, headers=A)
    assert r.status_code == 200, r.text
    spans = await finished(exporter, "POST /v1/responses/compact")
    span = one(spans, "POST /v1/responses/compact")
    assert attrs(span)["gen_ai.operation.name"] == "compact"
    assert attrs(span)["gen_ai.response.id"] == r.json()["id"]
    attempt = one(spans, "chat fake-llm")
    assert parent_id(attempt) == span.context.span_id
    assert_never_said(spans, PROMPT, ANSWER)


async def test_other_routes_are_spans_named_by_their_route(
    traced: tuple[ServedApp, InMemorySpanExporter], exporter: InMemorySpanExporter, fake: FakeOpenAIChat
) -> None:
    fake.add(Reply.text(ANSWER))
    created = (await post(traced[0], {"model": "m", "input": PROMPT})).json()
    async with httpx.AsyncClient(base_url=traced[0].base_url, timeout=30) as c:
        got = await c.get(f"/v1/responses/{created['id']}", headers={**A, **TRACEPARENT})
        assert got.status_code == 200 and ANSWER in got.text
        assert (await c.get("/v1/responses/resp_nope", headers=A)).status_code == 404
        assert (await c.get("/healthz")).status_code == 200
    name = "GET /v1/responses/{response_id}"
    spans = await finished(exporter, name, 2)
    read, missing = sorted((s for s in spans if s.name == name), key=lambda s: s.start_time or 0)
    assert read.kind is SpanKind.SERVER and read.context.trace_id == int(CLIENT_TRACE_ID, 16)
    assert attrs(read)["http.response.status_code"] == 200 and attrs(read)["http.route"] == name[4:]
    assert attrs(missing)["http.response.status_code"] == 404
    store = [s for s in spans if s.name == "state get" and parent_id(s) == read.context.span_id]
    assert len(store) == 1
    assert not any("healthz" in s.name for s in spans)  # probes get no span
    assert not any(created["id"] in s.name for s in spans)  # ids never name a span
    assert_never_said(spans, PROMPT, ANSWER)


def test_tracing_is_off_unless_configured() -> None:
    off = Settings()
    assert not wanted(off, {})
    assert wanted(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert wanted(off, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert wanted(off, {"OTEL_TRACES_EXPORTER": "otlp"})
    assert not wanted(off, {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"})
    assert not wanted(off, {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"})
    assert wanted(Settings(tracing={"endpoint": "http://127.0.0.1:4318"}), {})
    assert not wanted(Settings(tracing={"enabled": False}), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"})
    assert not wanted(Settings(tracing={"enabled": True}), {"OTEL_SDK_DISABLED": "true"})
    with pytest.raises(ValueError):
        Settings(tracing={"endpoint": "collector:4318"})
    with pytest.raises(ValueError):
        Settings(tracing={"sample_ratio": 2})


def test_off_the_sdk_is_never_imported() -> None:
    import subprocess

    code = (
        "import sys\n"
        "from gateway.app import create_app\n"
        "from gateway.kernel.settings import Settings\n"
        "app = create_app(Settings())\n"
        # (redis-py imports the SDK's metrics package itself: the trace SDK and exporter are ours)
        "ours = ('opentelemetry.sdk.trace', 'opentelemetry.exporter')\n"
        "sdk = any(m.startswith(ours) for m in sys.modules)\n"
        "print(type(app.state.tracer).__name__, sdk)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [type(NOOP_TRACER).__name__, "False"]
