"""The embedded default answers JSON and SSE over real sockets."""

from __future__ import annotations

import httpx
import orjson

from tests.api.helpers import parse_sse
from tests.harness import ServedApp


async def test_json_response(gateway: ServedApp) -> None:
    async with httpx.AsyncClient(base_url=gateway.base_url) as c:
        r = await c.post("/v1/responses", json={"model": "mock", "input": "Hi there"})
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "completed"
    assert body["output"][0]["content"][0]["text"] == "Hello! You said: Hi there"
    assert len(body) == 31


async def test_sse_response(gateway: ServedApp) -> None:
    async with httpx.AsyncClient(base_url=gateway.base_url) as c:
        r = await c.post("/v1/responses", json={"model": "mock", "input": "Hi", "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    frames = parse_sse(r.content)
    assert frames[-1] == ("", "[DONE]")
    events = [orjson.loads(d) for _, d in frames[:-1]]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for (name, _), ev in zip(frames, events, strict=False):
        assert name == ev["type"]
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.completed"
