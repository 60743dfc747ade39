"""/metrics: Prometheus text counting requests by transport, model and status, tokens and latency;
label values come from routed models only, so clients cannot mint series."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest
from websockets.sync.client import connect

from gateway.metrics import MAX_MODEL_LABELS, Metrics
from tests.harness import ServedApp, serve_gateway


@pytest.fixture(scope="module")
def served() -> Iterator[ServedApp]:
    """Its own gateway, not the shared ``gateway``: the counts asserted here start at zero."""
    with serve_gateway() as s:
        yield s


def series(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


async def test_requests_tokens_and_latency_are_counted(served: ServedApp) -> None:
    async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
        ok = await c.post("/v1/responses", json={"model": "mock", "input": "hi"})
        assert ok.status_code == 200
        bogus = "no-such-model-" + "x" * 5000
        assert (await c.post("/v1/responses", json={"model": bogus, "input": "hi"})).status_code == 400
        stream = await c.post("/v1/responses", json={"model": "mock", "input": "hi", "stream": True})
        assert stream.status_code == 200
        compacted = await c.post("/v1/responses/compact", json={"model": "mock", "input": "hi"})
        assert compacted.status_code == 200
        with connect(served.ws_url + "/v1/responses", proxy=None) as ws:
            ws.send(orjson.dumps({"type": "response.create", "model": "mock", "input": "hi"}).decode())
            while orjson.loads(ws.recv(timeout=20))["type"] != "response.completed":
                pass
        text = (await c.get("/metrics")).text
    requests = series(text, "gateway_requests_total")
    assert requests['gateway_requests_total{transport="http",model="mock",status="completed"}'] == 2
    assert requests['gateway_requests_total{transport="http",model="-",status="400"}'] == 1
    assert requests['gateway_requests_total{transport="compact",model="mock",status="completed"}'] == 1
    assert requests['gateway_requests_total{transport="websocket",model="mock",status="completed"}'] == 1
    assert "no-such-model" not in text
    usage = ok.json()["usage"]
    tokens = series(text, "gateway_tokens_total")
    assert tokens['gateway_tokens_total{model="mock",direction="input"}'] >= usage["input_tokens"]
    latency = series(text, "gateway_request_seconds_count")
    assert latency["gateway_request_seconds_count"] == sum(requests.values())


def test_model_labels_are_bounded() -> None:
    m = Metrics()
    for n in range(MAX_MODEL_LABELS + 5):
        m.observe("http", f"provider/model-{n}", "completed", 0.01, None)
    m.observe("http", "provider/model-0", "completed", 0.01, None)  # an existing label stays
    labels = {model for _, model, _ in m.requests}
    assert len(labels) == MAX_MODEL_LABELS + 1 and "_other" in labels
    assert m.requests[("http", "provider/model-0", "completed")] == 2
    assert m.requests[("http", "_other", "completed")] == 5
