"""Tenancy limits and budgets (gateway/engine/limits.py, state/limits/): in process and in a real
Redis, one gateway and two gateway processes sharing one Redis, refusals, headers, outages."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.exceptions import InvalidStatus

from gateway.api.exchange import UNLIMITED
from gateway.engine.limits import reset_text
from tests.api.helpers import serve_cli, wait_until_up
from tests.harness import ServedApp, free_port, serve_gateway
from tests.redis_server import delete_prefix, redis_url, unique_prefix
from tests.ws.helpers import run_turn, serve, ws_connect

A = {"Authorization": "Bearer sk-a"}
A2 = {"Authorization": "Bearer sk-a2"}
B = {"Authorization": "Bearer sk-b"}


def config(backend: str, prefix: str, **tenants: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "auth": {
            "api_keys": [
                {"key": "sk-a", "tenant": "a", "name": "a-one"},
                {"key": "sk-a2", "tenant": "a", "name": "a-two", "limits": {"requests_per_minute": 1}},
                {"key": "sk-b", "tenant": "b"},
            ]
        },
        "tenants": tenants,
    }
    if backend == "redis":
        cfg["state"] = {"redis_url": redis_url(), "key_prefix": prefix}
    return cfg


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    p = unique_prefix()
    yield request.param, p
    if request.param == "redis":
        delete_prefix(redis_url(), p)  # responses, usage and the limit counters: <prefix>:{<tenant>}:...


async def post(s: ServedApp, headers: dict[str, str], **body: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=s.base_url, timeout=20) as c:
        return await c.post("/v1/responses", headers=headers, json={"model": "mock", "input": "hi", **body})


def test_reset_text_is_openais_format() -> None:
    assert [reset_text(ms) for ms in (20, 1000, 6000, 1500, 60_000, 61_000, 3_723_000)] == [
        "20ms",
        "1s",
        "6s",
        "1.5s",
        "1m0s",
        "1m1s",
        "1h2m3s",
    ]


async def test_requests_per_minute_refused_with_headers(backend: tuple[str, str]) -> None:
    cfg = config(*backend, a={"limits": {"requests_per_minute": 3}})
    with serve_gateway(cfg) as s:
        oks = [await post(s, A) for _ in range(3)]
        assert [r.status_code for r in oks] == [200, 200, 200]
        assert oks[0].headers["x-ratelimit-limit-requests"] == "3"
        assert [r.headers["x-ratelimit-remaining-requests"] for r in oks] == ["2", "1", "0"]
        assert re.fullmatch(r"1m[01](\.\d+)?s", oks[0].headers["x-ratelimit-reset-requests"])
        r = await post(s, A, stream=True)  # over SSE: an ordinary 429 before the stream
        assert r.status_code == 429
        assert r.headers["content-type"] == "application/json"
        assert 1 <= int(r.headers["retry-after"]) <= 61
        err = r.json()["error"]
        assert err["code"] == "rate_limit_exceeded" and err["type"] == "too_many_requests"
        assert "requests per minute of tenant 'a': 3" in err["message"]
        assert r.headers["x-ratelimit-remaining-requests"] == "0"
        assert (await post(s, B)).status_code == 200  # another tenant is not affected


SIX = [f"x-ratelimit-{w}-{dim}" for w in ("limit", "remaining", "reset") for dim in ("requests", "tokens")]


async def test_every_limited_answer_carries_all_six_headers(backend: tuple[str, str]) -> None:
    """A key with only a request limit (a-two: 1 per minute): its answer and its 429 carry the
    token headers too, read as unlimited (UNLIMITED, reset 0s); a refusal by the request limit
    still reports the token limit that does apply, as it stands."""
    cfg = config(*backend, b={"limits": {"tokens_per_minute": 5000, "requests_per_minute": 1}})
    with serve_gateway(cfg) as s:
        for r in (await post(s, A2), await post(s, A2, stream=True)):
            assert [h for h in SIX if h in r.headers] == SIX, r.headers
            assert r.headers["x-ratelimit-limit-tokens"] == str(UNLIMITED)
            assert r.headers["x-ratelimit-remaining-tokens"] == str(UNLIMITED)
            assert r.headers["x-ratelimit-reset-tokens"] == "0s"
        assert r.status_code == 429 and r.headers["x-ratelimit-remaining-requests"] == "0"
        ok = await post(s, B, max_output_tokens=100)
        assert ok.status_code == 200
        refused = await post(s, B, max_output_tokens=100)
        assert refused.status_code == 429 and "requests per minute" in refused.json()["error"]["message"]
        assert [h for h in SIX if h in refused.headers] == SIX
        assert refused.headers["x-ratelimit-limit-tokens"] == "5000"
        spent = ok.json()["usage"]["total_tokens"]
        assert refused.headers["x-ratelimit-remaining-tokens"] == str(5000 - spent)
        assert refused.headers["x-ratelimit-reset-requests"] != "0s"


async def test_key_limit_is_stricter_than_the_tenants(backend: tuple[str, str]) -> None:
    cfg = config(*backend, a={"limits": {"requests_per_minute": 100}})
    with serve_gateway(cfg) as s:
        assert (await post(s, A2)).headers["x-ratelimit-remaining-requests"] == "0"
        r = await post(s, A2, stream=True)
        assert r.status_code == 429
        assert "this API key (a-two)" in r.json()["error"]["message"]
        ok = await post(s, A, stream=True)  # the tenant's other key still has room
        assert ok.status_code == 200 and ok.headers["x-ratelimit-remaining-requests"] == "98"
        assert ok.headers["content-type"].startswith("text/event-stream")


async def test_tokens_settle_back_to_the_real_usage(backend: tuple[str, str]) -> None:
    cfg = config(*backend, a={"limits": {"tokens_per_minute": 5000}})
    with serve_gateway(cfg) as s:
        first = await post(s, A, max_output_tokens=4000, store=False)
        assert first.status_code == 200
        reserved = 5000 - int(first.headers["x-ratelimit-remaining-tokens"])
        assert reserved >= 4000
        # without the settlement a second 4000-token reservation would not fit
        second = await post(s, A, max_output_tokens=4000, store=False)
        assert second.status_code == 200, second.text
        usage = first.json()["usage"]
        spent = usage["input_tokens"] + usage["output_tokens"]
        assert 5000 - int(second.headers["x-ratelimit-remaining-tokens"]) == spent + reserved
        too_big = await post(s, A, max_output_tokens=6000)
        assert too_big.status_code == 429
        assert "exceed the limit on tokens per minute" in too_big.json()["error"]["message"]


async def test_budget_exhausted_is_insufficient_quota(backend: tuple[str, str]) -> None:
    cfg = config(*backend, a={"budget": {"tokens": 300, "period": "month"}})
    with serve_gateway(cfg) as s:
        assert (await post(s, A, max_output_tokens=100)).status_code == 200  # settles to ~10
        for _ in range(20):
            r = await post(s, A, max_output_tokens=100)
            if r.status_code != 200:
                break
        assert r.status_code == 429
        assert r.json()["error"]["code"] == "insufficient_quota"
        assert "token budget per month of tenant 'a': 300" in r.json()["error"]["message"]
        assert int(r.headers["retry-after"]) >= 1


async def test_concurrency_lease_released_after_each_request(backend: tuple[str, str]) -> None:
    cfg = config(*backend, a={"limits": {"concurrent_requests": 1}})
    with serve_gateway(cfg) as s:
        for _ in range(3):  # each released at its end (JSON, SSE, and a failed prepare)
            assert (await post(s, A)).status_code == 200
            assert (await post(s, A, stream=True)).status_code == 200
            bad = await post(s, A, previous_response_id="resp_missing")
            assert bad.status_code == 404 or bad.status_code == 400


async def test_websocket_turn_refused_keeps_the_socket(backend: tuple[str, str]) -> None:
    cfg = config(*backend, a={"limits": {"tokens_per_minute": 1000, "websocket_connections": 1}})
    with serve(cfg) as s:
        async with ws_connect(s, additional_headers=A) as ws:
            refused = await run_turn(ws, model="mock", input="hi", max_output_tokens=5000)
            assert refused[-1]["type"] == "error" and refused[-1]["status"] == 429
            assert refused[-1]["error"]["code"] == "rate_limit_exceeded"
            done = await run_turn(ws, model="mock", input="hi", max_output_tokens=100)
            assert done[-1]["type"] == "response.completed"
            with pytest.raises(InvalidStatus) as info:  # a second socket of the tenant
                async with ws_connect(s, additional_headers=A):
                    pass
            assert info.value.response.status_code == 429
            assert "retry-after" in info.value.response.headers
        for _ in range(50):  # released on close
            try:
                async with ws_connect(s, additional_headers=A) as ws:
                    done = await run_turn(ws, model="mock", input="hi", max_output_tokens=100)
                    assert done[-1]["type"] == "response.completed"
                break
            except InvalidStatus:
                await asyncio.sleep(0.05)
        else:
            pytest.fail("the WebSocket lease was not released")


@pytest.mark.parametrize("mode", ["allow", "deny"])
async def test_limiter_outage(mode: str) -> None:
    cfg = config("memory", "", a={"limits": {"requests_per_minute": 5}})
    cfg["state"] = {"redis_url": f"redis://127.0.0.1:{free_port()}/0", "timeout_seconds": 0.5}
    cfg["limits"] = {"on_limiter_error": mode}
    cfg["admin"] = {"api_keys": [{"key": "sk-admin"}]}  # /metrics wants one when auth is on
    with serve_gateway(cfg) as s:
        rs = [await post(s, A, store=False) for _ in range(3)]
        assert [r.status_code for r in rs] == [200 if mode == "allow" else 503] * 3
        if mode == "deny":
            assert rs[0].json()["error"]["code"] == "service_unavailable"
        assert (await post(s, B, store=False)).status_code == 200  # no limits: never asks
        async with httpx.AsyncClient(base_url=s.base_url) as c:
            metrics = (await c.get("/metrics", headers={"Authorization": "Bearer sk-admin"})).text
        assert "gateway_limiter_errors_total 3.0" in metrics


# -- two replicas, one Redis ---------------------------------------------------------------------
@pytest.fixture
def replicas() -> Iterator[list[str]]:
    p = unique_prefix()
    keys = [{"key": "sk-a", "tenant": "a"}]
    tenants = {"a": {"limits": {"requests_per_minute": 10}}, "b": {"budget": {"tokens": 5000}}}
    keys.append({"key": "sk-b", "tenant": "b"})
    env = {
        **os.environ,
        "GATEWAY_STATE__REDIS_URL": redis_url(),
        "GATEWAY_STATE__KEY_PREFIX": p,
        "GATEWAY_AUTH__API_KEYS": orjson.dumps(keys).decode(),
        "GATEWAY_TENANTS": orjson.dumps(tenants).decode(),
    }
    ports = [free_port(), free_port()]
    procs = [serve_cli(port, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for port in ports]
    try:
        for proc, port in zip(procs, ports, strict=True):
            wait_until_up(proc, port)
        yield [f"http://127.0.0.1:{port}/v1/responses" for port in ports]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        delete_prefix(redis_url(), p)


async def test_two_replicas_share_the_limits(replicas: list[str]) -> None:
    async with httpx.AsyncClient(timeout=30) as c:

        async def one(i: int, headers: dict[str, str], **body: Any) -> httpx.Response:
            return await c.post(
                replicas[i % 2], headers=headers, json={"model": "mock", "input": "hi", **body}
            )

        rs = await asyncio.gather(*(one(i, A) for i in range(20)))
        codes = sorted(r.status_code for r in rs)
        assert codes == [200] * 10 + [429] * 10
        assert {r.json()["error"]["code"] for r in rs if r.status_code == 429} == {"rate_limit_exceeded"}

        # a burst against a 5000-token budget, each request spending ~1000: never overspent
        big = "x" * 4000
        rs = await asyncio.gather(
            *(one(i, B, input=big, max_output_tokens=50, store=False) for i in range(30))
        )
        ok = [r for r in rs if r.status_code == 200]
        refused = [r for r in rs if r.status_code == 429]
        assert ok and refused and len(ok) + len(refused) == 30
        assert {r.json()["error"]["code"] for r in refused} == {"insufficient_quota"}
        spent = sum(r.json()["usage"]["total_tokens"] for r in ok)
        assert 3000 <= spent <= 5000
