"""Tenancy: ``retention: none`` (nothing of a conversation is persisted: a real Redis, watched with
MONITOR, sees only counters), tenant model allow-lists combined with the key's on every route, and
the admin section's validation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from gateway.kernel.settings import ConfigError, load_settings
from tests.api.helpers import parse_sse
from tests.harness import ServedApp
from tests.redis_server import Monitor, delete_prefix, redis_url, unique_prefix
from tests.ws.helpers import assert_envelope, run_turn, serve, ws_connect

SECRET = "ultramarine-7731"  # the no-retention tenant's conversation
KEPT = "vermilion-2209"  # the standard tenant's, which is stored
N = {"Authorization": "Bearer sk-n"}
S = {"Authorization": "Bearer sk-s"}


def retention_settings(**extra: Any) -> dict[str, Any]:
    return {
        "auth": {"api_keys": [{"key": "sk-n", "tenant": "n"}, {"key": "sk-s", "tenant": "s"}]},
        "tenants": {"n": {"retention": "none"}},
        "models": {"mock": {"provider": "mock"}},
        "compaction": {"keep_recent_items": 1},
        **extra,
    }


@pytest.fixture
def redis_state() -> Iterator[dict[str, Any]]:
    p = unique_prefix()
    yield {"redis_url": redis_url(), "key_prefix": p}
    delete_prefix(redis_url(), p)


async def no_retention_traffic(gw: ServedApp) -> None:
    """Every way a ``retention: none`` tenant talks to the gateway."""
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=20) as c:
        # store omitted: treated as false, and the response says so
        r = await c.post("/v1/responses", headers=N, json={"model": "mock", "input": f"my word is {SECRET}"})
        assert r.status_code == 200, r.text
        plain = r.json()
        assert plain["store"] is False and SECRET in orjson.dumps(plain["output"]).decode()
        # store: true explicitly is refused, never silently dropped
        body = {"model": "mock", "input": SECRET, "store": True}
        r = await c.post("/v1/responses", headers=N, json=body)
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == "store" and err["code"] == "store_not_allowed"
        # SSE, store: false
        body = {"model": "mock", "input": f"stream {SECRET}", "stream": True, "store": False}
        r = await c.post("/v1/responses", headers=N, json=body)
        events = [orjson.loads(d) for _, d in parse_sse(r.content) if d != "[DONE]"]
        assert events[-1]["type"] == "response.completed" and events[-1]["response"]["store"] is False
        # nothing was kept: the stored-response routes and a continuation over HTTP find nothing
        for rid in (plain["id"], events[-1]["response"]["id"]):
            assert (await c.get(f"/v1/responses/{rid}", headers=N)).status_code == 404
            assert (await c.get(f"/v1/responses/{rid}/input_items", headers=N)).status_code == 404
            assert (await c.delete(f"/v1/responses/{rid}", headers=N)).status_code == 404
        body = {"model": "mock", "input": "and?", "previous_response_id": plain["id"]}
        r = await c.post("/v1/responses", headers=N, json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found"
        # compaction
        conv = [{"type": "message", "role": "user", "content": f"{SECRET} {n}"} for n in range(4)]
        r = await c.post("/v1/responses/compact", headers=N, json={"model": "mock", "input": conv})
        assert r.status_code == 200, r.text
    # WebSocket: the connection-local chain still works; store: true is refused there too
    async with ws_connect(gw, additional_headers=N) as ws:
        first = await run_turn(ws, model="mock", input=f"socket {SECRET}")
        assert first[-1]["type"] == "response.completed"
        assert first[-1]["response"]["store"] is False
        second = await run_turn(
            ws, model="mock", input="continue", previous_response_id=first[-1]["response"]["id"]
        )
        assert second[-1]["type"] == "response.completed", second[-1]
        refused = await run_turn(ws, model="mock", input=SECRET, store=True)
        assert_envelope(refused[-1], 400, "store_not_allowed", "store")


async def test_a_no_retention_tenant_sends_redis_only_counters(redis_state: dict[str, Any]) -> None:
    with serve(retention_settings(state=redis_state)) as gw:
        monitor = Monitor(redis_url())
        try:
            await no_retention_traffic(gw)
            async with httpx.AsyncClient(base_url=gw.base_url, timeout=20) as c:
                # a standard tenant in the same gateway is stored: proof that MONITOR sees content
                r = await c.post("/v1/responses", headers=S, json={"model": "mock", "input": KEPT})
                assert r.status_code == 200
                assert (await c.get(f"/v1/responses/{r.json()['id']}", headers=S)).status_code == 200
                report = (await c.get("/v1/usage", headers=N)).json()
        finally:
            seen = monitor.stop()
    assert KEPT.encode() in seen
    assert SECRET.encode() not in seen
    assert redis_state["key_prefix"].encode() + b":{n}:u:" in seen  # its counters did go there
    # JSON, SSE, compaction and two WebSocket turns; the refusals never became turns
    assert report["totals"]["requests"] == 5


async def test_retention_in_process_too() -> None:
    with serve(retention_settings()) as gw:
        await no_retention_traffic(gw)


# -- model allow-lists --------------------------------------------------------------------------

ALLOW = {
    "auth": {
        "api_keys": [
            {"key": "sk-narrow", "tenant": "t", "models": ["m2", "m3"]},
            {"key": "sk-wide", "tenant": "t"},
            {"key": "sk-free", "tenant": "u"},
        ]
    },
    "tenants": {"t": {"models": ["mock", "m2"]}},
    "models": {"mock": {"provider": "mock"}, "m2": {"provider": "mock"}, "m3": {"provider": "mock"}},
    "compaction": {"keep_recent_items": 1},
}
NARROW = {"Authorization": "Bearer sk-narrow"}  # key [m2, m3] ∩ tenant [mock, m2] = [m2]
WIDE = {"Authorization": "Bearer sk-wide"}  # the tenant's [mock, m2]
FREE = {"Authorization": "Bearer sk-free"}  # no list: every model


async def test_the_tenant_and_key_allow_lists_both_apply_on_every_route() -> None:
    with serve(ALLOW) as gw:
        async with httpx.AsyncClient(base_url=gw.base_url, timeout=20) as c:
            for headers, allowed in ((NARROW, ["m2"]), (WIDE, ["m2", "mock"]), (FREE, ["m2", "m3", "mock"])):
                listed = (await c.get("/v1/models", headers=headers)).json()
                assert sorted(m["id"] for m in listed["data"]) == allowed
                for model in ("mock", "m2", "m3"):
                    ok = model in allowed
                    body = {"model": model, "input": "hi"}
                    r = await c.post("/v1/responses", headers=headers, json=body)
                    assert (r.status_code == 200) is ok, (headers, model, r.text)
                    if not ok:
                        assert r.json()["error"]["code"] == "model_not_found"
                    conv = [{"type": "message", "role": "user", "content": f"q{n}"} for n in range(3)]
                    r = await c.post(
                        "/v1/responses/compact", headers=headers, json={"model": model, "input": conv}
                    )
                    assert (r.status_code == 200) is ok, (headers, model, r.text)
                async with ws_connect(gw, additional_headers=headers) as ws:
                    for model in ("mock", "m2", "m3"):
                        events = await run_turn(ws, model=model, input="hi", store=False)
                        if model in allowed:
                            assert events[-1]["type"] == "response.completed"
                        else:
                            assert_envelope(events[-1], 400, "model_not_found")


async def test_a_fallback_off_the_allow_list_is_not_used() -> None:
    from gateway.engine.routing import Router
    from gateway.kernel.settings import Settings

    s = Settings(models={"a": {"provider": "mock", "fallbacks": ["b"]}, "b": {"provider": "mock"}})
    router = Router(s)
    assert [f.model for f in router.route("a").fallbacks] == ["b"]
    assert router.route("a", ["a"]).fallbacks == ()


# -- config validation ------------------------------------------------------------------------


def test_an_admin_key_that_is_also_a_client_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"admin\.api_keys\.0: the same key as auth\.api_keys\.0"):
        load_settings(auth={"api_keys": [{"key": "k1", "tenant": "a"}]}, admin={"api_keys": [{"key": "k1"}]})


def test_an_admin_key_given_twice_is_refused() -> None:
    import hashlib

    digest = hashlib.sha256(b"k2").hexdigest()
    with pytest.raises(ConfigError, match=r"admin\.api_keys\.1: the same key as admin\.api_keys\.0"):
        load_settings(admin={"api_keys": [{"key": "k2"}, {"sha256": digest, "name": "other"}]})


def test_a_tenant_allow_list_names_known_models() -> None:
    with pytest.raises(ConfigError, match=r"tenants\.t\.models\.1: unknown model 'nope'"):
        load_settings(models={"mock": {"provider": "mock"}}, tenants={"t": {"models": ["mock", "nope"]}})
