"""A served gateway's streams against the dated spec's schemas: every SSE and WebSocket event
against the streaming event schema of its ``type``, every response body against ResponseResource (an
unstreamed failure's error against ErrorPayload),
WebSocket error envelopes against WebSocketErrorEvent. Upstreams: the built-in ``mock`` model, and
scripted adapters that send every kind of delta."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest

from adapters.base import UpstreamRequest
from adapters.deltas import Delta
from gateway.kernel.errors import UpstreamError
from tests.api.helpers import parse_sse
from tests.engine.helpers import BUILDER_EVENTS, SCENARIOS
from tests.harness import ServedApp, serve_gateway
from tests.schema import assert_event, assert_schema
from tests.ws.helpers import install, run_turn, ws_connect


class Script:
    """An adapter that sends ``deltas``, then raises ``error`` if one is given."""

    def __init__(self, deltas: list[Delta], error: UpstreamError | None = None) -> None:
        self.deltas = deltas
        self.error = error

    async def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
        for d in self.deltas:
            yield d
        if self.error is not None:
            raise self.error

    async def aclose(self) -> None:
        return None


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
BODIES: dict[str, dict[str, Any]] = {
    "mock text": {"model": "mock", "input": "Hi there"},
    "mock tool call": {"model": "mock", "input": "Weather?", "tools": [WEATHER]},
    "mock incomplete": {"model": "mock", "input": "q" * 200, "max_output_tokens": 16},
    **{f"script {name}": {"model": f"script-{name}", "input": "go"} for name in SCENARIOS},
    "script broken": {"model": "script-broken", "input": "go"},
}


@pytest.fixture(scope="module")
def served() -> Iterator[ServedApp]:
    with serve_gateway() as app:
        for name, deltas in SCENARIOS.items():
            install(app, f"script-{name}", Script(deltas))
        broken = SCENARIOS["reasoning"][:4]
        install(app, "script-broken", Script(broken, UpstreamError("The upstream broke mid-stream.")))
        yield app


def check_events(events: list[dict[str, Any]]) -> None:
    for event in events:
        assert_event(event)
    assert events[-1]["type"] in ("response.completed", "response.incomplete", "response.failed")


@pytest.mark.parametrize("case", list(BODIES))
async def test_sse_events_and_stored_resource_match_the_schema(served: ServedApp, case: str) -> None:
    async with httpx.AsyncClient(base_url=served.base_url, timeout=30) as c:
        r = await c.post("/v1/responses", json={**BODIES[case], "stream": True})
        assert r.status_code == 200
        frames = parse_sse(r.content)
        assert frames[-1] == ("", "[DONE]")
        events = [orjson.loads(data) for _, data in frames[:-1]]
        check_events(events)
        final = events[-1]["response"]
        assert_schema("ResponseResource", final)
        if final["status"] != "failed":
            stored = await c.get(f"/v1/responses/{final['id']}")
            assert stored.status_code == 200, stored.text
            assert_schema("ResponseResource", stored.json())


@pytest.mark.parametrize("case", list(BODIES))
async def test_json_responses_match_the_schema(served: ServedApp, case: str) -> None:
    async with httpx.AsyncClient(base_url=served.base_url, timeout=30) as c:
        r = await c.post("/v1/responses", json=BODIES[case])
    if case == "script broken":  # unstreamed, a failure is an HTTP error reply
        assert r.status_code == 502
        assert_schema("ErrorPayload", r.json()["error"])
    else:
        assert r.status_code == 200
        assert_schema("ResponseResource", r.json())


async def test_websocket_events_match_the_schema(served: ServedApp) -> None:
    emitted: set[str] = set()
    async with ws_connect(served) as ws:
        for body in BODIES.values():
            events = await run_turn(ws, **body)
            check_events(events)
            assert_schema("ResponseResource", events[-1]["response"])
            emitted |= {e["type"] for e in events}
        envelope = (await run_turn(ws, model="no-such-model", input="x"))[-1]
        assert_schema("WebSocketErrorEvent", envelope)
    # on a WebSocket a failed turn sends response.failed alone: every other builder event went out
    assert emitted == BUILDER_EVENTS - {"error"}
