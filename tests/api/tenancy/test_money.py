"""Spend in money (gateway/kernel/pricing.py, gateway/engine/usage.py, gateway/engine/limits.py):
the ledger's cost is exactly the sum over the responses of their usage times their model's prices
(over HTTP JSON, SSE and WebSocket, in process and in a real Redis), ``x-gateway-cost``,
``gateway_spend_total``, budgets in money per key and per tenant refused as ``insufficient_quota``,
a burst against a $1 budget on two replicas sharing one Redis, and ``check-config``'s warning."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from decimal import ROUND_FLOOR, Decimal
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.kernel import pricing
from gateway.kernel.settings import Settings
from tests.api.helpers import ROOT, parse_sse, serve_cli, wait_until_up
from tests.fakes.anthropic import FakeAnthropic, PromptCache
from tests.fakes.openai_chat import FakeOpenAIChat, Reply, usage_chunk
from tests.harness import free_port
from tests.redis_server import delete_prefix, redis_url, unique_prefix
from tests.ws.helpers import run_turn, serve, ws_connect

A1 = {"Authorization": "Bearer sk-a1"}
A2 = {"Authorization": "Bearer sk-a2"}
B = {"Authorization": "Bearer sk-b"}
ADMIN = {"Authorization": "Bearer sk-admin"}
# awkward decimals, so that a turn's exact cost is rarely a whole micro-unit
UP_PRICE = {"input": "0.333333", "cached_input": "0.1", "output": "1.234567", "reasoning": "2.000001"}
MOCK_PRICE = {"input": "3", "output": "15.5"}


def exact_micros(price: dict[str, str], usage: dict[str, Any]) -> int:
    """The test's own reading of the rule: the exact cost of ``usage``, rounded down to the
    micro-unit (Decimal arithmetic, independent of gateway/kernel/pricing.py)."""
    p = {k: Decimal(v) for k, v in price.items()}
    inp, out = usage["input_tokens"], usage["output_tokens"]
    cached = usage["input_tokens_details"]["cached_tokens"]
    reasoning = usage["output_tokens_details"]["reasoning_tokens"]
    exact = (
        (inp - cached) * p["input"]
        + cached * p.get("cached_input", p["input"])
        + (out - reasoning) * p["output"]
        + reasoning * p.get("reasoning", p["output"])
    ) / 1_000_000
    return int((exact * 1_000_000).to_integral_value(rounding=ROUND_FLOOR))


def settings(fake: FakeOpenAIChat, **extra: Any) -> dict[str, Any]:
    return {
        "auth": {
            "api_keys": [
                {"key": "sk-a1", "tenant": "a", "name": "a-one"},
                {"key": "sk-a2", "tenant": "a", "name": "a-two"},
                {"key": "sk-b", "tenant": "b", "name": "b-one"},
            ]
        },
        "admin": {"api_keys": [{"key": "sk-admin", "name": "ops"}]},
        "providers": {
            "up": {
                "kind": "openai-chat",
                "base_url": fake.base_url,
                "retry": {"attempts": 0},
                "pass_through": False,
            }
        },
        "models": {
            "mock": {"provider": "mock", "price": MOCK_PRICE},
            "up-model": {"provider": "up", "price": UP_PRICE},
            "free-model": {"provider": "up"},
        },
        "tenants": {"a": {"cost_header": True}},
        **extra,
    }


@pytest.fixture(scope="module")
async def fake() -> AsyncIterator[FakeOpenAIChat]:
    async with FakeOpenAIChat.serve() as f:
        yield f


@pytest.fixture(params=["memory", "redis"])
def state(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    if request.param == "memory":
        yield {}
        return
    p = unique_prefix()
    yield {"state": {"redis_url": redis_url(), "key_prefix": p}}
    delete_prefix(redis_url(), p)


def reply(i: int) -> Reply:
    r = Reply.text(f"Answer {i}.", usage=None)
    r.chunks.append(usage_chunk(1000 + 37 * i, 200 + 11 * i, cached=13 * i, reasoning=7 * i))
    return r


PRICES = {"mock": MOCK_PRICE, "up-model": UP_PRICE, "free-model": {"input": "0", "output": "0"}}


async def test_the_ledger_cost_is_the_sum_of_usage_times_prices(
    fake: FakeOpenAIChat, state: dict[str, Any]
) -> None:
    fake.reset()
    for i in range(40):
        fake.add(reply(i))
    expected: dict[tuple[str, str], int] = {}  # (tenant, model) → micro-units
    with serve(settings(fake, **state)) as gw:

        def tally(tenant: str, model: str, usage: dict[str, Any]) -> int:
            cost = exact_micros(PRICES[model], usage)
            expected[(tenant, model)] = expected.get((tenant, model), 0) + cost
            return cost

        async with httpx.AsyncClient(base_url=gw.base_url, timeout=20) as c:
            for headers, tenant in ((A1, "a"), (A2, "a"), (B, "b")):
                for model in ("up-model", "mock", "free-model"):
                    body = {"model": model, "input": "what does it cost?"}
                    r = await c.post("/v1/responses", headers=headers, json=body)
                    assert r.status_code == 200, r.text
                    cost = tally(tenant, model, r.json()["usage"])
                    if tenant == "a":  # cost_header: the JSON answer carries its own cost
                        assert r.headers["x-gateway-cost"] == pricing.text(cost)
                    else:
                        assert "x-gateway-cost" not in r.headers
                    r = await c.post("/v1/responses", headers=headers, json={**body, "stream": True})
                    assert "x-gateway-cost" not in r.headers  # sent before the turn ends: never
                    events = [orjson.loads(d) for _, d in parse_sse(r.content) if d != "[DONE]"]
                    assert events[-1]["type"] == "response.completed"
                    tally(tenant, model, events[-1]["response"]["usage"])
                async with ws_connect(gw, additional_headers=headers) as ws:
                    for model in ("up-model", "mock"):
                        done = await run_turn(ws, model=model, input="over the socket", store=False)
                        assert done[-1]["type"] == "response.completed"
                        tally(tenant, model, done[-1]["response"]["usage"])
            assert expected[("a", "up-model")] > 0 and expected[("a", "free-model")] == 0
            r = await c.get("/v1/usage", headers=ADMIN)
            report = r.json()
            assert report["currency"] == "USD"
            got = {(row["tenant"], row["model"]): row["cost_micros"] for row in report["data"]}
            assert got == expected
            for row in report["data"]:
                assert Decimal(row["cost"]) * 1_000_000 == row["cost_micros"]
            assert report["totals"]["cost_micros"] == sum(expected.values())
            assert report["totals"]["cost"] == pricing.text(sum(expected.values()))
            # a client key reads its own tenant's, by key too
            mine = (await c.get("/v1/usage", headers=A1, params={"group_by": "key"})).json()
            assert sum(row["cost_micros"] for row in mine["data"]) == sum(
                v for (t, _), v in expected.items() if t == "a"
            )
            metrics = (await c.get("/metrics", headers=ADMIN)).text
        spend = [line for line in metrics.splitlines() if line.startswith("gateway_spend_total{")]
        line = next(x for x in spend if 'tenant="b"' in x and 'model="up-model"' in x)
        assert float(line.rsplit(" ", 1)[1]) == pytest.approx(expected[("b", "up-model")] / 1e6)


async def test_key_and_tenant_budgets_in_money(fake: FakeOpenAIChat, state: dict[str, Any]) -> None:
    fake.reset()
    fake.default = reply(3)  # 1111 in (39 cached), 233 out (21 reasoning): 0.000658 USD
    cfg = settings(fake, **state)
    cfg["auth"]["api_keys"][0]["budget"] = {"amount": "0.002", "period": "day"}
    cfg["tenants"]["a"]["budget"] = {"amount": "0.004", "period": "month"}
    per = exact_micros(
        UP_PRICE,
        {
            "input_tokens": 1111,
            "output_tokens": 233,
            "input_tokens_details": {"cached_tokens": 39},
            "output_tokens_details": {"reasoning_tokens": 21},
        },
    )
    with serve(cfg) as gw:
        async with httpx.AsyncClient(base_url=gw.base_url, timeout=20) as c:

            async def until_refused(headers: dict[str, str]) -> tuple[int, httpx.Response]:
                for n in range(50):
                    body = {"model": "up-model", "input": "hi", "max_output_tokens": 300}
                    r = await c.post("/v1/responses", headers=headers, json=body)
                    if r.status_code != 200:
                        return n, r
                    await asyncio.sleep(0.05)  # the settlement lands beside the answer
                raise AssertionError("never refused")

            ok, refused = await until_refused(A1)
            assert refused.status_code == 429, refused.text
            err = refused.json()["error"]
            assert err["code"] == "insufficient_quota" and err["type"] == "too_many_requests"
            assert "budget per day of this API key (a-one): 0.002 USD" in err["message"]
            assert 1 <= ok and ok * per <= 2000
            more, refused = await until_refused(A2)  # the tenant's budget, shared by its keys
            assert "budget per month of tenant 'a': 0.004 USD" in refused.json()["error"]["message"]
            assert (ok + more) * per <= 4000
            assert (
                await c.post("/v1/responses", headers=B, json={"model": "up-model", "input": "hi"})
            ).status_code == 200
            spent = (await c.get("/v1/usage", headers=A1)).json()["totals"]["cost_micros"]
            assert spent == (ok + more) * per
            # an unpriced model costs nothing, so a spent money budget still admits it
            r = await c.post("/v1/responses", headers=A1, json={"model": "free-model", "input": "hi"})
            assert r.status_code == 200 and r.headers["x-gateway-cost"] == "0.000000"


# -- a burst on two replicas sharing one Redis -------------------------------------------------------
@pytest.fixture
def replicas() -> Iterator[list[str]]:
    p = unique_prefix()
    env = {
        **os.environ,
        "GATEWAY_STATE__REDIS_URL": redis_url(),
        "GATEWAY_STATE__KEY_PREFIX": p,
        "GATEWAY_AUTH__API_KEYS": orjson.dumps([{"key": "sk-b", "tenant": "b"}]).decode(),
        "GATEWAY_TENANTS": orjson.dumps({"b": {"budget": {"amount": "1.00", "period": "day"}}}).decode(),
        # $0.0001 per input token, $0.002 per output token
        "GATEWAY_MODELS": orjson.dumps(
            {"mock": {"provider": "mock", "price": {"input": "100", "output": "2000"}}}
        ).decode(),
    }
    ports = [free_port(), free_port()]
    procs = [serve_cli(port, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for port in ports]
    try:
        for proc, port in zip(procs, ports, strict=True):
            wait_until_up(proc, port)
        yield [f"http://127.0.0.1:{port}" for port in ports]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        delete_prefix(redis_url(), p)


async def test_a_burst_never_overspends_a_one_dollar_budget(replicas: list[str]) -> None:
    price = {"input": "100", "output": "2000"}
    async with httpx.AsyncClient(timeout=30) as c:

        async def one(i: int) -> httpx.Response:
            body = {"model": "mock", "input": "x" * 4000, "max_output_tokens": 40, "store": False}
            return await c.post(replicas[i % 2] + "/v1/responses", headers=B, json=body)

        rs = await asyncio.gather(*(one(i) for i in range(30)))
        ok = [r for r in rs if r.status_code == 200]
        refused = [r for r in rs if r.status_code == 429]
        assert ok and refused and len(ok) + len(refused) == 30
        assert {r.json()["error"]["code"] for r in refused} == {"insufficient_quota"}
        assert all("budget per day of tenant 'b': 1.00 USD" in r.json()["error"]["message"] for r in refused)
        costs = [exact_micros(price, r.json()["usage"]) for r in ok]
        # one request's worst case: its input (the mock counts a few tokens more than the gateway's
        # estimate: its JSON) at the input price plus max_output_tokens at the output price
        worst = max(r.json()["usage"]["input_tokens"] for r in ok) * 100 + 40 * 2000
        assert 3 <= len(ok) and sum(costs) <= 1_000_000 + worst
        await asyncio.sleep(0.5)  # the ledger's writes land beside the answers
        report = (await c.get(replicas[0] + "/v1/usage", headers=B)).json()
        assert report["totals"]["cost_micros"] == sum(costs)
        assert report["totals"]["requests"] == len(ok)


def test_check_config_flags_unpriced_models_when_money_budgets_apply(tmp_path: Path) -> None:
    cfg: dict[str, Any] = {
        "providers": {"up": {"kind": "openai-chat", "base_url": "http://127.0.0.1:9/v1"}},
        "models": {
            "priced": {"provider": "up", "price": {"input": "1", "output": "2"}},
            "bare": {"provider": "up"},
        },
        "tenants": {"a": {"budget": {"amount": "10"}}},
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(orjson.dumps(cfg).decode())  # JSON is YAML
    run = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", "--config", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stderr
    assert "models.bare.price" in run.stderr and "models.priced" not in run.stderr
    assert "providers.up.pass_through" in run.stderr
    # without a budget in money, nothing to flag
    assert Settings(**{**cfg, "tenants": {}}).unpriced() == []


async def test_cache_writes_are_priced_apart() -> None:
    """Anthropic's cache writes are part of input_tokens, which the Responses usage does not name:
    priced at ``cache_write`` all the same (the fake's own prompt-cache accounting, replayed)."""
    price = {"input": "1", "cached_input": "0.1", "cache_write": "1.25", "output": "5"}
    async with FakeAnthropic.serve() as fake:
        cfg = {
            "providers": {"an": {"kind": "anthropic", "base_url": fake.base_url, "api_key": "sk-up"}},
            "models": {"claude": {"provider": "an", "upstream_model": "claude-x", "price": price}},
            "tenants": {"default": {"cost_header": True}},
        }
        with serve(cfg) as gw:
            async with httpx.AsyncClient(base_url=gw.base_url, timeout=20) as c:
                answers, previous = [], None
                for text in ("first question", "second question", "third question"):
                    body = {"model": "claude", "input": text, "previous_response_id": previous}
                    r = await c.post("/v1/responses", json={**body, "instructions": "Be careful. " * 50})
                    assert r.status_code == 200, r.text
                    answers.append(r)
                    previous = r.json()["id"]
                report = (await c.get("/v1/usage")).json()
        replay = PromptCache()
        p = {k: Decimal(v) for k, v in price.items()}
        total = 0
        for r, rec in zip(answers, fake.requests, strict=True):
            accounted = replay.account(rec.body)
            assert accounted is not None
            uncached, read, written = accounted
            u = r.json()["usage"]
            assert u["input_tokens"] == uncached + read + written
            assert u["input_tokens_details"]["cached_tokens"] == read
            exact = uncached * p["input"] + read * p["cached_input"] + written * p["cache_write"]
            exact += u["output_tokens"] * p["output"]
            micros = int(exact.to_integral_value(rounding=ROUND_FLOOR))  # per million: micro-units
            assert r.headers["x-gateway-cost"] == pricing.text(micros)
            total += micros
        first = PromptCache().account(fake.requests[0].body)
        assert first is not None and first[2] > 0  # the first turn wrote the cache
        assert report["totals"]["cost_micros"] == total
