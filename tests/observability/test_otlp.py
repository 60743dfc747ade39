"""End to end through OTLP/HTTP: ``python -m gateway serve`` configured only by the standard OTEL_*
variables exports its spans to a receiver on loopback (POST /v1/traces, protobuf, decoded with
opentelemetry-proto), and its JSON log lines carry the trace and span ids."""

from __future__ import annotations

import http.server
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.api.helpers import cli_env, serve_cli, wait_until_up
from tests.harness import free_port
from tests.observability.helpers import CLIENT_SPAN_ID, CLIENT_TRACE_ID, TRACEPARENT

PROMPT = "PROMPT-otlp-violet-kangaroo"


class Receiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: every decoded export request, with its path and headers."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.exports: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []
        self.content_types: list[str] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) of every span received."""
        out = []
        for export in list(self.exports):
            for rs in export.resource_spans:
                resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    out += [(resource, span) for span in ss.spans]
        return out


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        self.server.paths.append(self.path)
        self.server.content_types.append(self.headers.get("content-type", ""))
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            self.server.exports.append(request)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None
    return out


def test_spans_reach_an_otlp_receiver_and_log_lines_name_them(receiver: Receiver) -> None:
    port = free_port()
    env = cli_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        OTEL_SERVICE_NAME="gateway-e2e",
        OTEL_BSP_SCHEDULE_DELAY="50",
    )
    proc = serve_cli(port, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        wait_until_up(proc, port)
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/responses",
            json={"model": "mock", "input": PROMPT},
            headers=TRACEPARENT,
            timeout=30,
        )
        assert r.status_code == 200
        deadline = time.monotonic() + 30
        while not any(s.name == "POST /v1/responses" for _, s in receiver.spans()):
            assert time.monotonic() < deadline, "no span reached the receiver"
            time.sleep(0.05)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert set(receiver.paths) == {"/v1/traces"}
    assert receiver.content_types[0] == "application/x-protobuf"
    spans = receiver.spans()
    resource, server = next((res, s) for res, s in spans if s.name == "POST /v1/responses")
    assert resource["service.name"] == "gateway-e2e"
    assert server.trace_id.hex() == CLIENT_TRACE_ID and server.parent_span_id.hex() == CLIENT_SPAN_ID
    a = attributes(server)
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "mock"
    assert a["gen_ai.response.id"] == r.json()["id"]
    assert a["gen_ai.usage.output_tokens"] == r.json()["usage"]["output_tokens"]
    attempt = next(s for _, s in spans if s.name == "chat mock")
    assert attempt.parent_span_id == server.span_id
    assert PROMPT not in str([s for _, s in spans])
    # the access-log line of the request names its span
    lines = [orjson.loads(line) for line in err.splitlines() if line.startswith("{")]
    request = next(line for line in lines if line.get("event") == "request")
    assert request["trace_id"] == CLIENT_TRACE_ID
    assert request["span_id"] == server.span_id.hex()
    started = next(line for line in lines if line.get("event") == "gateway_started")
    assert started["tracing"] is True and "trace_id" not in started  # outside any span
