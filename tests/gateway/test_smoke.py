"""The embedded default answers JSON and SSE over real sockets."""

from __future__ import annotations

import httpx
import orjson

from tests.harness import ServedApp


def parse_sse(raw: bytes) -> list[tuple[str, str]]:
    """(event name, data) per frame, strictly: LF endings, one data line per event."""
    assert b"\r" not in raw
    frames = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        lines = block.split("\n")
        event = next((ln[7:] for ln in lines if ln.startswith("event: ")), "")
        data = [ln[6:] for ln in lines if ln.startswith("data: ")]
        assert len(data) == 1, block
        frames.append((event, data[0]))
    return frames


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
