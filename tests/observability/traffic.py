"""The traffic the metrics tests send, and reading a scrape: a gateway with providers ``up`` (a
fake Chat Completions upstream) and ``dead`` (nothing listens; ``flaky`` falls back to ``m``), two
tenants (``b`` limited to 3 requests a minute) and an admin key."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.openai_chat import FakeOpenAIChat, Reply, usage_chunk
from tests.fakes.server import unused_port
from tests.harness import ServedApp
from tests.helpers import TWO_TENANTS, A, B
from tests.ws.helpers import run_turn, ws_connect

ADMIN = {"Authorization": "Bearer sk-admin"}


def settings_for(fake: FakeOpenAIChat, **extra: Any) -> dict[str, Any]:
    """Provider ``up`` (the fake) and ``dead`` (nothing listens); ``flaky`` falls back to ``m``."""
    return {
        "providers": {
            "up": {"kind": "openai-chat", "base_url": fake.base_url, "retry": {"attempts": 0}},
            "dead": {
                "kind": "openai-chat",
                "base_url": f"http://127.0.0.1:{unused_port()}/v1",
                "retry": {"attempts": 1, "backoff_base": 0.01},
                "timeouts": {"connect": 2},
            },
        },
        "models": {
            "m": {"provider": "up", "upstream_model": "fake-llm"},
            "flaky": {"provider": "dead", "upstream_model": "x", "fallbacks": ["m"]},
        },
        "auth": TWO_TENANTS,
        "admin": {"api_keys": [{"key": "sk-admin"}]},
        "tenants": {"b": {"limits": {"requests_per_minute": 3}}},
        **extra,
    }


def scrape(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict[str, Any], family: str, sample: str | None = None, **labels: str) -> float:
    """The sum of ``family``'s samples named ``sample`` (default: the family) matching ``labels``."""
    name = sample or family
    return sum(
        s.value
        for s in families[family].samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


async def drive(served: ServedApp, fake: FakeOpenAIChat) -> dict[str, Any]:
    """JSON, SSE, a retried call and its fallback, a refused model, an upstream rejection, a
    compaction, a tenant over its limit, a stored read and a WebSocket turn; returns the families
    of a scrape taken while the socket was open."""
    async with httpx.AsyncClient(base_url=served.base_url, timeout=30) as c:
        fake.add(Reply(chunks=[*Reply.text("cached answer").chunks[:-1], usage_chunk(20, 9, cached=5)]))
        ok = await c.post("/v1/responses", headers=A, json={"model": "m", "input": "hi"})
        assert ok.status_code == 200
        stream = await c.post("/v1/responses", headers=A, json={"model": "m", "input": "hi", "stream": True})
        assert stream.status_code == 200 and b"response.completed" in stream.content
        # the primary's provider refuses connections: one retry, then the fallback answers
        fell = await c.post(
            "/v1/responses", headers=A, json={"model": "flaky", "input": "hi", "stream": True}
        )
        assert fell.status_code == 200 and b"response.completed" in fell.content
        bogus = "no-such-model-" + "x" * 5000
        assert (
            await c.post("/v1/responses", headers=A, json={"model": bogus, "input": "hi"})
        ).status_code == 400
        fake.add(Reply.error(400))
        rejected = await c.post("/v1/responses", headers=A, json={"model": "m", "input": "hi"})
        assert rejected.status_code == 400
        compacted = await c.post("/v1/responses/compact", headers=A, json={"model": "m", "input": "hi"})
        assert compacted.status_code == 200
        statuses = [
            (
                await c.post("/v1/responses", headers=B, json={"model": "m", "input": "x", "store": False})
            ).status_code
            for _ in range(4)
        ]
        assert statuses == [200, 200, 200, 429]
        got = await c.get(f"/v1/responses/{ok.json()['id']}", headers=A)
        assert got.status_code == 200
        async with ws_connect(served, additional_headers=A) as ws:
            done = await run_turn(ws, model="m", input="hi")
            assert done[-1]["type"] == "response.completed"
            during = scrape((await c.get("/metrics", headers=ADMIN)).text)
        assert value(during, "gateway_websocket_connections") == 1
    return during
