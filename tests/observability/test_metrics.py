"""/metrics: Prometheus text (scraped and parsed with prometheus_client's own parser) after real
HTTP, SSE, WebSocket, compaction and error traffic through a fake upstream; every family has HELP
text; label values are bounded; the endpoint wants an admin key when auth is on, and moves to a
listener of its own with ``metrics.port``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from gateway.kernel.errors import ErrorCode
from gateway.kernel.settings import Settings
from gateway.observability.families import OTHER
from gateway.observability.observer import Metrics
from tests.fakes.openai_chat import FakeOpenAIChat, smart_reply
from tests.harness import ServedApp, free_port, serve_gateway
from tests.helpers import TWO_TENANTS, A, B, fake_fixtures
from tests.observability.traffic import ADMIN, drive, scrape, settings_for, value
from tests.ws.helpers import ws_connect

fake_server, fake = fake_fixtures(FakeOpenAIChat, responder=smart_reply)
FAMILIES = (
    "gateway_requests",
    "gateway_request_duration_seconds",
    "gateway_time_to_first_token_seconds",
    "gateway_upstream_request_duration_seconds",
    "gateway_upstream_retries",
    "gateway_fallbacks",
    "gateway_tokens",
    "gateway_websocket_connections",
    "gateway_websocket_turns",
    "gateway_rate_limited",
    "gateway_limiter_errors",
    "gateway_state_store_duration_seconds",
    "gateway_state_store_errors",
    "gateway_compactions",
    "process_resident_memory_bytes",
    "process_cpu_seconds",
)


@pytest.fixture(scope="module")
def served(fake_server: FakeOpenAIChat) -> Iterator[ServedApp]:
    """Its own gateway: the counts asserted here start at zero."""
    with serve_gateway(settings_for(fake_server)) as s:
        yield s


async def test_traffic_is_counted_in_every_family(served: ServedApp, fake: FakeOpenAIChat) -> None:
    during = await drive(served, fake)
    assert value(during, "gateway_websocket_connections") == 1  # scraped while the socket was open
    async with httpx.AsyncClient(base_url=served.base_url, timeout=30) as c:
        response = await c.get("/metrics", headers=ADMIN)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    fams = scrape(text)
    for name in FAMILIES:
        assert name in fams, name
    for family in fams.values():
        assert family.documentation, f"{family.name} has no HELP text"
    assert "no-such-model" not in text

    req = "gateway_requests"
    http_ok = {
        "api": "responses",
        "transport": "http",
        "model": "m",
        "provider": "up",
        "tenant": "a",
        "status": "completed",
    }
    assert value(fams, req, "gateway_requests_total", **http_ok, error_code="-") == 2  # JSON, SSE
    # the model asked for, and the provider that answered (the fallback's)
    fallback = {**http_ok, "model": "flaky"}
    assert value(fams, req, "gateway_requests_total", **fallback) == 1
    # a model that is not routed (refused) is _other, never its name or "-"
    assert value(fams, req, "gateway_requests_total", transport="http", model=OTHER, status="400") == 1
    assert not [s for s in fams[req].samples if s.labels.get("model") == "-"]
    assert (
        value(
            fams,
            req,
            "gateway_requests_total",
            model="m",
            status="400",
            error_code="upstream_invalid_request",
        )
        == 1
    )
    assert value(fams, req, "gateway_requests_total", transport="compact", model="m", status="completed") == 1
    assert (
        value(fams, req, "gateway_requests_total", tenant="b", status="429", error_code="rate_limit_exceeded")
        == 1
    )
    assert (
        value(fams, req, "gateway_requests_total", transport="websocket", model="m", status="completed") == 1
    )
    total = value(fams, req, "gateway_requests_total")
    hist = "gateway_request_duration_seconds"
    assert value(fams, hist, hist + "_count") == total
    buckets = [
        float(s.labels["le"]) for s in fams[hist].samples if s.name == hist + "_bucket" and "le" in s.labels
    ]
    assert max(b for b in buckets if b != float("inf")) == 600  # up to ten minutes
    ttft = "gateway_time_to_first_token_seconds"
    assert value(fams, ttft, ttft + "_count", model="m", provider="up") >= 2  # SSE and WebSocket
    assert value(fams, ttft, ttft + "_count", model="flaky", provider="up") == 1  # the fallback's turn

    up = "gateway_upstream_request_duration_seconds"
    assert value(fams, up, up + "_count", provider="dead", deployment="dead", outcome="connect_error") == 2
    assert value(fams, up, up + "_count", provider="up", outcome="ok") >= 6
    assert value(fams, up, up + "_count", provider="up", outcome="rejected") == 1
    assert value(fams, "gateway_upstream_retries", "gateway_upstream_retries_total", provider="dead") == 1
    assert value(fams, "gateway_fallbacks", "gateway_fallbacks_total", model="flaky", fallback="m") == 1

    tok = "gateway_tokens"
    assert value(fams, tok, "gateway_tokens_total", tenant="a", model="m", kind="cached") == 5
    assert value(fams, tok, "gateway_tokens_total", tenant="a", model="m", kind="input") >= 20
    assert value(fams, tok, "gateway_tokens_total", tenant="b", model="m", kind="output") > 0

    assert value(fams, "gateway_websocket_connections") == 0
    assert (
        value(
            fams, "gateway_websocket_turns", "gateway_websocket_turns_total", tenant="a", status="completed"
        )
        == 1
    )
    limited = value(
        fams, "gateway_rate_limited", "gateway_rate_limited_total", tenant="b", limit="requests_per_minute"
    )
    assert limited == 1
    store = "gateway_state_store_duration_seconds"
    assert value(fams, store, store + "_count", op="put") >= 3
    assert value(fams, store, store + "_count", op="get") == 1
    assert value(fams, "gateway_state_store_errors", "gateway_state_store_errors_total") == 0
    assert value(fams, "gateway_compactions", "gateway_compactions_total", kind="compact") == 1
    assert value(fams, "process_resident_memory_bytes") > 0


def test_every_gateway_error_code_is_a_label_even_after_upstream_codes_took_the_extra_room() -> None:
    m = Metrics(Settings())
    for n in range(100):  # codes upstream error bodies named: a bounded number get a label each
        m.observe("http", None, 400, 0.01, None, error_code=f"upstream_code_{n}")
    for code in ErrorCode:
        m.observe("websocket", None, code.status, 0.01, None, error_code=code)
    fams = scrape(m.render().decode())
    labels = {
        s.labels["error_code"]
        for s in fams["gateway_requests"].samples
        if s.labels.get("transport") == "websocket"
    }
    assert labels == {code.value for code in ErrorCode}  # websocket_lane_limit too, which the old list lacked


async def test_refused_websocket_upgrades_are_counted_as_requests(fake_server: FakeOpenAIChat) -> None:
    """A socket refused before the upgrade (no key, a bad key, over the tenant's websocket_connections)
    is a request with its HTTP status and error code, not a WebSocket turn."""
    settings = settings_for(fake_server, tenants={"b": {"limits": {"websocket_connections": 1}}})
    with serve_gateway(settings) as s:
        for headers in ({}, {"Authorization": "Bearer sk-nobody"}):
            with pytest.raises(InvalidStatus) as refused:
                async with ws_connect(s, additional_headers=headers):
                    pass
            assert refused.value.response.status_code == 401
        async with ws_connect(s, additional_headers=B):
            with pytest.raises(InvalidStatus) as refused:
                async with ws_connect(s, additional_headers=B):
                    pass
            assert refused.value.response.status_code == 429
        async with httpx.AsyncClient(base_url=s.base_url, timeout=20) as c:
            fams = scrape((await c.get("/metrics", headers=ADMIN)).text)
    req = "gateway_requests"
    ws = {"transport": "websocket", "model": OTHER, "provider": "-"}
    assert value(fams, req, "gateway_requests_total", **ws, status="401", error_code="invalid_api_key") == 2
    assert (
        value(
            fams,
            req,
            "gateway_requests_total",
            **ws,
            tenant="b",
            status="429",
            error_code="rate_limit_exceeded",
        )
        == 1
    )
    assert value(fams, req, "gateway_requests_total") == 3
    hist = "gateway_request_duration_seconds"
    assert value(fams, hist, hist + "_count", transport="websocket") == 3
    assert value(fams, "gateway_websocket_turns", "gateway_websocket_turns_total") == 0


async def test_metrics_need_an_admin_key_when_auth_is_on(served: ServedApp) -> None:
    async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
        assert (await c.get("/metrics")).status_code == 401
        refused = await c.get("/metrics", headers=A)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied"
        assert (await c.get("/metrics", headers=ADMIN)).status_code == 200
    with serve_gateway() as s:  # no client keys: open, as every other route
        async with httpx.AsyncClient(timeout=20) as c:
            assert (await c.get(s.base_url + "/metrics")).status_code == 200


async def test_a_metrics_port_moves_metrics_off_the_public_listener(fake_server: FakeOpenAIChat) -> None:
    port = free_port()
    with serve_gateway(settings_for(fake_server, metrics={"port": port})) as s:
        async with httpx.AsyncClient(timeout=20) as c:
            assert (
                await c.post(s.base_url + "/v1/responses", headers=A, json={"model": "m", "input": "hi"})
            ).status_code == 200
            public = await c.get(s.base_url + "/metrics", headers=ADMIN)
            assert public.status_code == 404
            private = await c.get(f"http://127.0.0.1:{port}/metrics")
    assert private.status_code == 200
    fams = scrape(private.text)
    assert value(fams, "gateway_requests", "gateway_requests_total", model="m", status="completed") == 1
    with pytest.raises(httpx.ConnectError):  # closed with the app
        async with httpx.AsyncClient(timeout=5) as c:
            await c.get(f"http://127.0.0.1:{port}/metrics")


def test_metrics_settings_are_validated() -> None:
    for bad in ({"port": 0}, {"port": 70000}, {"prot": 9464}, {"max_pass_through_models": -1}):
        with pytest.raises(ValueError):
            Settings(metrics=bad)
    assert Settings(metrics={"port": 9464}).metrics.port == 9464


def test_label_values_are_bounded() -> None:
    settings = Settings(
        providers={"p": {"kind": "openai-chat", "base_url": "http://127.0.0.1:1/v1", "pass_through": True}},
        models={"m": {"provider": "p"}},
        auth=TWO_TENANTS,
        metrics={"max_pass_through_models": 3},
    )
    m = Metrics(settings)
    for n in range(10):
        m.observe("http", f"p/model-{n}", "completed", 0.01, None, tenant="a", provider="p")
    m.observe(
        "http", "m", "completed", 0.01, None, tenant="intruder", provider="nope", error_code="Bad Code!"
    )
    m.observe("carrier-pigeon", "m", 999, 0.01, None, tenant="a", provider="p", error_code="x" * 100)
    fams = scrape(m.render().decode())
    samples = [s for s in fams["gateway_requests"].samples if s.name == "gateway_requests_total"]
    models = {s.labels["model"] for s in samples}
    assert models == {"p/model-0", "p/model-1", "p/model-2", OTHER, "m"}
    assert sum(s.value for s in samples if s.labels["model"] == OTHER) == 7
    odd = next(s for s in samples if s.labels["tenant"] == OTHER)
    assert odd.labels["provider"] == OTHER and odd.labels["error_code"] == OTHER
    weird = next(s for s in samples if s.labels["transport"] == OTHER)
    assert weird.labels["status"] == OTHER and weird.labels["error_code"] == OTHER
