"""The usage ledger: its totals are the sum of the ``usage`` the gateway returned to its clients,
over HTTP JSON, SSE, WebSocket and /v1/responses/compact alike (in process and in a real Redis);
GET /v1/usage's parameters, tenant scoping and admin keys."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.api.helpers import parse_sse
from tests.compact.helpers import conversation
from tests.fakes.openai_chat import FakeOpenAIChat, Reply, usage_chunk
from tests.harness import ServedApp
from tests.redis_server import RedisServer, delete_prefix, redis_url, unique_prefix
from tests.ws.helpers import run_turn, serve, ws_connect

A1 = {"Authorization": "Bearer sk-a1"}
A2 = {"Authorization": "Bearer sk-a2"}
B = {"Authorization": "Bearer sk-b"}
ADMIN = {"Authorization": "Bearer sk-admin"}
METRICS = ("input_tokens", "output_tokens", "total_tokens")


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
        "providers": {"up": {"kind": "openai-chat", "base_url": fake.base_url, "retry": {"attempts": 0}}},
        "models": {"mock": {"provider": "mock"}, "up-model": {"provider": "up"}},
        "compaction": {"keep_recent_items": 1},
        **extra,
    }


def upstream_reply() -> Reply:
    """A text answer whose usage has cached and reasoning parts (parts of input and output)."""
    reply = Reply.text("Answer from upstream.", usage=None)
    reply.chunks.append(usage_chunk(40, 12, cached=30, reasoning=5))
    return reply


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


class Tally:
    """What the clients were returned, per (tenant, key, model)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, str], dict[str, int]] = {}

    def add(
        self, tenant: str, key: str, model: str, usage: dict[str, Any] | None, *, error: bool = False
    ) -> None:
        row = self.rows.setdefault(
            (tenant, key, model),
            {"requests": 0, "errors": 0, **dict.fromkeys(METRICS, 0), "cached": 0, "reasoning": 0},
        )
        row["requests"] += 1
        row["errors"] += int(error)
        u = usage or {}
        for m in METRICS:
            row[m] += u.get(m, 0)
        row["cached"] += (u.get("input_tokens_details") or {}).get("cached_tokens", 0)
        row["reasoning"] += (u.get("output_tokens_details") or {}).get("reasoning_tokens", 0)

    def total(self, tenant: str, **match: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for (t, key, model), row in self.rows.items():
            if t == tenant and all({"key": key, "model": model}[k] == v for k, v in match.items()):
                for name, n in row.items():
                    out[name] = out.get(name, 0) + n
        return out


def as_tally(report_row: dict[str, Any]) -> dict[str, int]:
    return {
        "requests": report_row["requests"],
        "errors": report_row["errors"],
        **{m: report_row[m] for m in METRICS},
        "cached": report_row["input_tokens_details"]["cached_tokens"],
        "reasoning": report_row["output_tokens_details"]["reasoning_tokens"],
    }


async def traffic(gw: ServedApp, fake: FakeOpenAIChat) -> Tally:
    """Mixed traffic of two tenants (three keys, two models) over every transport; the tally of
    the usage each client was returned."""
    fake.reset()
    fake.default = upstream_reply()
    tally = Tally()
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=20) as c:
        for headers, tenant, key in ((A1, "a", "a-one"), (A2, "a", "a-two"), (B, "b", "b-one")):
            for model in ("mock", "up-model"):
                # HTTP JSON
                r = await c.post("/v1/responses", headers=headers, json={"model": model, "input": "hi there"})
                assert r.status_code == 200, r.text
                tally.add(tenant, key, model, r.json()["usage"])
                # SSE
                body: dict[str, Any] = {"model": model, "input": "stream it, please", "stream": True}
                r = await c.post("/v1/responses", headers=headers, json=body)
                events = [orjson.loads(d) for _, d in parse_sse(r.content) if d != "[DONE]"]
                terminal = events[-1]
                assert terminal["type"] == "response.completed", terminal
                tally.add(tenant, key, model, terminal["response"]["usage"])
            # an upstream failure: one request, one error, no tokens returned
            fake.add(Reply.error(500))
            r = await c.post("/v1/responses", headers=headers, json={"model": "up-model", "input": "x"})
            assert r.status_code == 502, r.text
            tally.add(tenant, key, "up-model", None, error=True)
            # a refusal before any turn (unknown model) is not a request of the ledger
            r = await c.post("/v1/responses", headers=headers, json={"model": "nope", "input": "x"})
            assert r.status_code == 400
            # compaction: its summarizing call's usage is what the client gets, counted once
            body = {"model": "up-model", "input": conversation(4)}
            r = await c.post("/v1/responses/compact", headers=headers, json=body)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["input_tokens"] == 40
            tally.add(tenant, key, "up-model", r.json()["usage"])
            # WebSocket: a chain of two turns on the connection, one per model
            async with ws_connect(gw, additional_headers=headers) as ws:
                first = await run_turn(ws, model="mock", input="over the socket", store=False)
                assert first[-1]["type"] == "response.completed"
                tally.add(tenant, key, "mock", first[-1]["response"]["usage"])
                prev = first[-1]["response"]["id"]
                second = await run_turn(ws, model="up-model", input="again", previous_response_id=prev)
                assert second[-1]["type"] == "response.completed"
                tally.add(tenant, key, "up-model", second[-1]["response"]["usage"])
    return tally


async def usage(gw: ServedApp, headers: dict[str, str], **params: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=10) as c:
        return await c.get("/v1/usage", headers=headers, params=params)


async def test_the_ledger_totals_are_the_usage_returned_to_clients(
    fake: FakeOpenAIChat, state: dict[str, Any]
) -> None:
    with serve(settings(fake, **state)) as gw:
        tally = await traffic(gw, fake)
        assert tally.total("a")["cached"] > 0 and tally.total("a")["reasoning"] > 0
        for headers, tenant in ((A1, "a"), (A2, "a"), (B, "b")):
            report = (await usage(gw, headers)).json()
            assert report["tenant"] == tenant and report["group_by"] == "model"
            assert as_tally(report["totals"]) == tally.total(tenant)
            assert {row["tenant"] for row in report["data"]} == {tenant}
            for row in report["data"]:
                assert as_tally(row) == tally.total(tenant, model=row["model"])
            by_key = (await usage(gw, headers, group_by="key")).json()
            for row in by_key["data"]:
                assert as_tally(row) == tally.total(tenant, key=row["key"])
            assert {row["key"] for row in by_key["data"]} == {k for t, k, _ in tally.rows if t == tenant}
            by_day = (await usage(gw, headers, group_by="day")).json()
            [day] = by_day["data"]
            assert day["day"] == report["start"] == report["end"]
            assert as_tally(day) == tally.total(tenant)
        # total_tokens is input + output: cached and reasoning are parts of them, never added
        t = tally.total("a")
        assert t["total_tokens"] == t["input_tokens"] + t["output_tokens"]
        # the admin key: every tenant, or the one it names
        everyone = (await usage(gw, ADMIN)).json()
        assert everyone["tenant"] is None
        assert {row["tenant"] for row in everyone["data"]} == {"a", "b"}
        summed = {k: tally.total("a")[k] + tally.total("b")[k] for k in tally.total("a")}
        assert as_tally(everyone["totals"]) == summed
        only_b = (await usage(gw, ADMIN, tenant="b")).json()
        assert only_b["tenant"] == "b" and as_tally(only_b["totals"]) == tally.total("b")


async def test_a_restarted_gateway_reads_the_redis_ledger(fake: FakeOpenAIChat) -> None:
    p = unique_prefix()
    cfg = settings(fake, state={"redis_url": redis_url(), "key_prefix": p})
    try:
        with serve(cfg) as gw:
            async with httpx.AsyncClient(base_url=gw.base_url) as c:
                r = await c.post("/v1/responses", headers=A1, json={"model": "mock", "input": "keep count"})
            returned = r.json()["usage"]
        with serve(cfg) as gw:
            totals = (await usage(gw, A1)).json()["totals"]
        assert totals["requests"] == 1 and totals["input_tokens"] == returned["input_tokens"]
    finally:
        delete_prefix(redis_url(), p)


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"start": "2026-13-01"}, "start"),
        ({"end": "yesterday"}, "end"),
        ({"start": "2026-1-01"}, "start"),
        ({"start": "2026-02-02", "end": "2026-02-01"}, "start"),
        ({"start": "2020-01-01", "end": "2026-01-01"}, "start"),
        ({"group_by": "tenant"}, "group_by"),
        ({"colour": "blue"}, "colour"),
    ],
)
async def test_bad_parameters_are_400_with_the_param(
    fake: FakeOpenAIChat, params: dict[str, str], param: str
) -> None:
    with serve(settings(fake)) as gw:
        r = await usage(gw, A1, **params)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


async def test_tenant_scoping_and_admin_keys(fake: FakeOpenAIChat) -> None:
    with serve(settings(fake)) as gw:
        own = await usage(gw, A1, tenant="a", start="2026-01-01", end="2026-01-31")
        assert own.status_code == 200 and own.json()["data"] == [] and own.json()["totals"]["requests"] == 0
        other = await usage(gw, A1, tenant="b")
        assert other.status_code == 403 and other.json()["error"]["param"] == "tenant"
        assert (await usage(gw, {})).status_code == 401
        assert (await usage(gw, {"Authorization": "Bearer nope"})).status_code == 401
        unknown = await usage(gw, ADMIN, tenant="zz")
        assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "tenant"
        async with httpx.AsyncClient(base_url=gw.base_url) as c:
            # an admin key serves no model, on any route
            r = await c.post("/v1/responses", headers=ADMIN, json={"model": "mock", "input": "x"})
            assert r.status_code == 403 and r.json()["error"]["code"] == "permission_denied"
            assert (await c.get("/v1/models", headers=ADMIN)).status_code == 403
        with pytest.raises(Exception, match="403"):
            async with ws_connect(gw, additional_headers=ADMIN):
                pass


async def test_without_client_keys_the_default_tenant_is_metered_without_a_key_name() -> None:
    with serve({"tenants": {"default": {"models": ["mock"]}}}) as gw:
        async with httpx.AsyncClient(base_url=gw.base_url) as c:
            r = await c.post("/v1/responses", json={"model": "mock", "input": "anonymous"})
            assert r.status_code == 200, r.text
            returned = r.json()["usage"]
            report = (await c.get("/v1/usage", params={"group_by": "key"})).json()
    assert report["tenant"] == "default"
    [row] = report["data"]
    assert row["key"] is None and row["requests"] == 1
    assert row["input_tokens"] == returned["input_tokens"]
    assert row["output_tokens"] == returned["output_tokens"]


async def test_a_down_ledger_loses_the_count_never_the_response() -> None:
    server = RedisServer().start()
    cfg = {"state": {"redis_url": server.url, "timeout_seconds": 0.5}}
    try:
        with serve(cfg) as gw:
            server.stop()
            async with httpx.AsyncClient(base_url=gw.base_url, timeout=10) as c:
                body = {"model": "mock", "input": "still answered", "store": False}
                r = await c.post("/v1/responses", json=body)
                assert r.status_code == 200, r.text
                assert r.json()["status"] == "completed"
                r = await c.post("/v1/responses", json={**body, "stream": True})
                assert b"response.completed" in r.content
                down = await c.get("/v1/usage")
                assert down.status_code == 503 and down.json()["error"]["code"] == "service_unavailable"
    finally:
        server.stop()
