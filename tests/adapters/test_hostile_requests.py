"""A tenant's model name never steers the upstream request: through the gateway (under uvicorn) to a
raw Gemini server on loopback that records the request line it receives, a pass-through name that
tries to climb out of ``models/`` (``..``), drop the method (``#``), add a query (``?key=``) or add
a method of its own (``:``) arrives as one escaped path segment, so the request line is exactly
``POST /v1beta/models/<escaped>:generateContent``; a name that cannot be a model name (spaces,
control characters, non-ASCII, too long) is a 400 naming ``model`` before any upstream call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import httpx
import orjson
import pytest

from tests.fakes.server import LoopbackServer, serve_raw
from tests.harness import ServedApp
from tests.ws.helpers import assert_envelope, run_turn, serve, ws_connect

KEY = "AIza-OPERATOR-KEY-0123456789"
REPLY = {
    "candidates": [
        {"content": {"parts": [{"text": "ok"}], "role": "model"}, "finishReason": "STOP", "index": 0}
    ],
    "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 1, "totalTokenCount": 4},
    "responseId": "r1",
}


@dataclass
class RecordingGemini:
    """Every request line received, and the raw server answering each with one Gemini reply (an
    SSE chunk for ``alt=sse``, else JSON)."""

    lines: list[bytes] = field(default_factory=list)
    heads: list[list[bytes]] = field(default_factory=list)  # each request's header lines

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, _, rest = head.partition(b"\r\n")
                self.lines.append(line)
                self.heads.append(rest.rstrip(b"\r\n").split(b"\r\n"))
                length = next(
                    (
                        int(h.split(b":", 1)[1])
                        for h in rest.split(b"\r\n")
                        if h.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                data = orjson.dumps(REPLY)
                if b"alt=sse" in line:
                    body, kind = b"data: " + data + b"\r\n\r\n", b"text/event-stream"
                else:
                    body, kind = data, b"application/json"
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: "
                    + kind
                    + b"\r\ncontent-length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture(scope="module")
async def upstream() -> AsyncIterator[tuple[RecordingGemini, LoopbackServer]]:
    recorder = RecordingGemini()
    async with serve_raw(recorder.handle) as server:
        yield recorder, server


@pytest.fixture(scope="module")
def gateway(upstream: tuple[RecordingGemini, LoopbackServer]) -> Iterator[ServedApp]:
    _, server = upstream
    settings = {
        "providers": {
            "gem": {"kind": "gemini", "base_url": f"{server.url}/v1beta", "api_key": KEY},
            # the operator's headers, named in another case than the adapter's own
            "gem2": {
                "kind": "gemini",
                "base_url": f"{server.url}/v1beta",
                "api_key": KEY,
                "headers": {"X-Goog-Api-Key": "AIza-OTHER-KEY", "Accept": "application/json"},
            },
        },
        "models": {},
    }
    with serve(settings) as served:
        yield served


@pytest.fixture
def recorder(upstream: tuple[RecordingGemini, LoopbackServer]) -> RecordingGemini:
    upstream[0].lines.clear()
    upstream[0].heads.clear()
    return upstream[0]


async def _create(gateway: ServedApp, model: str, *, stream: bool = False) -> httpx.Response:
    body = orjson.dumps({"model": model, "input": "hi", "stream": stream})
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as c:
        return await c.post("/v1/responses", content=body, headers={"content-type": "application/json"})


ESCAPED = [
    ("gem/../../v1/files", "models/..%2F..%2Fv1%2Ffiles"),
    ("gem/gemini-2.0-flash#", "models/gemini-2.0-flash%23"),
    ("gem/gemini-2.0-flash?key=attacker", "models/gemini-2.0-flash%3Fkey%3Dattacker"),
    ("gem/x:streamGenerateContent?alt=sse&", "models/x%3AstreamGenerateContent%3Falt%3Dsse%26"),
    ("gem/%2e%2e", "models/%252e%252e"),
    ("gem/gemini-2.0-flash", "models/gemini-2.0-flash"),
    ("gem/models/gemini-2.0-flash-001", "models/gemini-2.0-flash-001"),
    ("gem/tunedModels/my-tuned_model.v2", "tunedModels/my-tuned_model.v2"),
    ("gem/tunedModels/../../v1/files", "tunedModels/..%2F..%2Fv1%2Ffiles"),
]


@pytest.mark.parametrize(("model", "path"), ESCAPED)
async def test_a_model_name_is_one_escaped_path_segment(
    gateway: ServedApp, recorder: RecordingGemini, model: str, path: str
) -> None:
    response = await _create(gateway, model)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == model
    assert recorder.lines == [f"POST /v1beta/{path}:generateContent HTTP/1.1".encode()]


async def test_a_streamed_request_escapes_the_name_too(gateway: ServedApp, recorder: RecordingGemini) -> None:
    response = await _create(gateway, "gem/../x#?key=k", stream=True)
    assert response.status_code == 200, response.text
    assert "response.completed" in response.text
    assert recorder.lines == [
        b"POST /v1beta/models/..%2Fx%23%3Fkey%3Dk:streamGenerateContent?alt=sse HTTP/1.1"
    ]


@pytest.mark.parametrize(
    "model",
    [
        "gem/gemini pro",
        "gem/gemini\x00pro",
        "gem/gemini\tpro",
        "gem/gemini\r\nx-goog-api-key: stolen",
        "gem/gemini\x7f",
        "gem/gémini",
        "gem/" + "m" * 300,
        " gem/gemini",
    ],
)
async def test_what_cannot_be_a_model_name_is_refused(
    gateway: ServedApp, recorder: RecordingGemini, model: str
) -> None:
    response = await _create(gateway, model)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_value"
    assert error["param"] == "model"
    assert model not in error["message"]  # the name is not echoed (it may carry anything)
    assert recorder.lines == []


async def test_compaction_refuses_the_same_names(gateway: ServedApp, recorder: RecordingGemini) -> None:
    body = orjson.dumps({"model": "gem/a b", "input": "hi"})
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as c:
        response = await c.post(
            "/v1/responses/compact", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "model"
    assert recorder.lines == []


async def test_a_websocket_turn_gets_the_same_rule(gateway: ServedApp, recorder: RecordingGemini) -> None:
    async with ws_connect(gateway) as ws:
        events = await run_turn(ws, model="gem/a\x00b", input="hi")
        assert_envelope(events[-1], 400, "invalid_value", "model")
        assert recorder.lines == []
        events = await run_turn(ws, model="gem/../../v1/files", input="hi")
        assert events[-1]["type"] == "response.completed"
    assert recorder.lines == [
        b"POST /v1beta/models/..%2F..%2Fv1%2Ffiles:streamGenerateContent?alt=sse HTTP/1.1"
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_config_header_replaces_the_adapters_own_in_any_case(
    gateway: ServedApp, recorder: RecordingGemini, stream: bool
) -> None:
    """A header is sent once: the operator's ``X-Goog-Api-Key`` replaces the adapter's
    ``x-goog-api-key`` (two keys on one request before), its ``Accept`` the adapter's ``accept``."""
    response = await _create(gateway, "gem2/gemini-2.0-flash", stream=stream)
    assert response.status_code == 200, response.text
    (head,) = recorder.heads
    pairs = [h.split(b":", 1) for h in head]
    names = [name.lower() for name, _ in pairs]
    assert len(names) == len(set(names)), head
    sent = {name.lower(): value.strip() for name, value in pairs}
    assert sent[b"x-goog-api-key"] == b"AIza-OTHER-KEY"
    assert sent[b"accept"] == b"application/json"
