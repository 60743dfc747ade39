"""Conversation state over HTTP, against the in-process store and a real Redis."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import redis

from tests.api.helpers import serve_cli, wait_until_up
from tests.harness import ServedApp, free_port, serve_gateway
from tests.helpers import TWO_TENANTS, A, B
from tests.redis_server import RedisServer, delete_prefix, redis_url, stored_bytes, unique_prefix

KEYS = {"auth": TWO_TENANTS}


@pytest.fixture(scope="module")
def prefix() -> Iterator[str]:
    p = unique_prefix()
    yield p
    delete_prefix(redis_url(), p)


@pytest.fixture(scope="module", params=["memory", "redis"])
def served(request: pytest.FixtureRequest, prefix: str) -> Iterator[ServedApp]:
    cfg: dict[str, Any] = dict(KEYS)
    if request.param == "redis":
        cfg["state"] = {"redis_url": redis_url(), "key_prefix": prefix}
    with serve_gateway(cfg) as s:
        yield s


async def call(
    s: ServedApp, method: str, path: str, headers: dict[str, str] = A, **kw: Any
) -> httpx.Response:
    async with httpx.AsyncClient(base_url=s.base_url, timeout=10) as c:
        return await c.request(method, path, headers=headers, **kw)


async def create(s: ServedApp, body: dict[str, Any], headers: dict[str, str] = A) -> dict[str, Any]:
    r = await call(s, "POST", "/v1/responses", headers, json={"model": "mock", **body})
    assert r.status_code == 200, r.text
    return r.json()


async def test_chain_continues_and_echoes_previous_id(served: ServedApp) -> None:
    first = await create(served, {"input": "my colour is cobalt", "instructions": "first"})
    second = await create(served, {"input": "and the next", "previous_response_id": first["id"]})
    assert second["previous_response_id"] == first["id"]
    assert second["instructions"] is None  # not inherited
    third = await create(
        served,
        {
            "previous_response_id": second["id"],
            "input": [{"type": "item_reference", "id": first["output"][0]["id"]}],
        },
    )
    assert third["status"] == "completed"


async def test_unknown_foreign_and_unstored_ids_look_the_same(served: ServedApp) -> None:
    mine = await create(served, {"input": "tenant a"})
    unstored = await create(served, {"input": "not kept", "store": False})
    answers = []
    for rid, headers in ((mine["id"], B), ("resp_doesnotexist", A), (unstored["id"], A)):
        r = await call(
            served,
            "POST",
            "/v1/responses",
            headers,
            json={"model": "mock", "input": "x", "previous_response_id": rid},
        )
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["code"] == "previous_response_not_found" and err["param"] == "previous_response_id"
        answers.append(err["message"].replace(rid, "ID"))
    assert len(set(answers)) == 1


async def test_item_reference_resolves_stored_items_of_the_same_tenant_only(served: ServedApp) -> None:
    first = await create(served, {"input": [{"role": "user", "content": "referenced words"}]})
    items = (await call(served, "GET", f"/v1/responses/{first['id']}/input_items")).json()["data"]
    ref = {"type": "item_reference", "id": items[0]["id"]}
    again = await create(served, {"input": [ref]})
    assert again["output"][0]["content"][0]["text"] == "Hello! You said: referenced words"
    r = await call(served, "POST", "/v1/responses", B, json={"model": "mock", "input": [ref]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "item_not_found"


async def test_read_routes(served: ServedApp) -> None:
    resp = await create(served, {"input": [{"role": "user", "content": f"m{i}"} for i in range(5)]})
    r = await call(served, "GET", f"/v1/responses/{resp['id']}")
    assert r.status_code == 200 and r.json() == resp
    assert (await call(served, "GET", f"/v1/responses/{resp['id']}", B)).status_code == 404
    page = (await call(served, "GET", f"/v1/responses/{resp['id']}/input_items?limit=2")).json()
    assert [i["content"][0]["text"] for i in page["data"]] == ["m4", "m3"]
    assert page["has_more"] is True
    page2 = (
        await call(
            served,
            "GET",
            f"/v1/responses/{resp['id']}/input_items",
            params={"limit": 10, "after": page["last_id"]},
        )
    ).json()
    assert [i["content"][0]["text"] for i in page2["data"]] == ["m2", "m1", "m0"]
    assert page2["has_more"] is False
    asc = (await call(served, "GET", f"/v1/responses/{resp['id']}/input_items?order=asc")).json()
    assert [i["content"][0]["text"] for i in asc["data"]] == ["m0", "m1", "m2", "m3", "m4"]
    assert (await call(served, "GET", f"/v1/responses/{resp['id']}/input_items?limit=0")).status_code == 400
    assert (await call(served, "DELETE", f"/v1/responses/{resp['id']}", B)).status_code == 404
    r = await call(served, "DELETE", f"/v1/responses/{resp['id']}")
    assert r.json() == {"id": resp["id"], "object": "response", "deleted": True}
    assert (await call(served, "GET", f"/v1/responses/{resp['id']}")).status_code == 404


async def test_store_false_is_never_persisted_in_redis(prefix: str) -> None:
    p = prefix + "-zdr"
    client = redis.Redis.from_url(redis_url())
    try:
        with serve_gateway({"state": {"redis_url": redis_url(), "key_prefix": p}}) as s:
            kept = await create(s, {"input": "keep me"}, headers={})
            before = sorted(client.scan_iter(match=f"{p}:*"))
            assert before, "store:true must write"
            secret = "zero-retention-secret-7781"
            r1 = await create(s, {"input": secret, "store": False}, headers={})
            await call(
                s,
                "POST",
                "/v1/responses",
                {},
                json={"model": "mock", "input": secret, "store": False, "stream": True},
            )
            await create(s, {"input": secret, "store": False, "previous_response_id": kept["id"]}, headers={})
            after = sorted(client.scan_iter(match=f"{p}:*"))
            assert after == before
            for key in after:
                blob = stored_bytes(client, key)
                assert secret.encode() not in blob
            assert (await call(s, "GET", f"/v1/responses/{r1['id']}", {})).status_code == 404
    finally:
        client.close()
        delete_prefix(redis_url(), p)


async def test_store_false_is_never_kept_in_memory() -> None:
    with serve_gateway() as s:
        store = s.app.state.gateway.store
        await create(s, {"input": "x", "store": False}, headers={})
        assert len(store) == 0
        await create(s, {"input": "x"}, headers={})
        assert len(store) == 1


async def test_redis_down_fails_fast_and_recovers(prefix: str) -> None:
    server = RedisServer().start()
    try:
        cfg = {
            "state": {
                "redis_url": server.url,
                "key_prefix": prefix,
                "timeout_seconds": 0.5,
                "health_recheck_seconds": 0.1,
            }
        }
        with serve_gateway(cfg) as s:
            first = await create(s, {"input": "before"}, headers={})
            assert (await call(s, "GET", "/readyz", {})).status_code == 200
            server.stop()
            t0 = time.monotonic()
            r = await call(s, "POST", "/v1/responses", {}, json={"model": "mock", "input": "x"})
            assert r.status_code == 503 and r.json()["error"]["code"] == "service_unavailable"
            r = await call(
                s,
                "POST",
                "/v1/responses",
                {},
                json={"model": "mock", "input": "x", "previous_response_id": first["id"], "store": False},
            )
            assert r.status_code == 503
            assert time.monotonic() - t0 < 5
            assert "redis://" not in r.text
            ok = await create(s, {"input": "zero retention still works", "store": False}, headers={})
            assert ok["status"] == "completed"
            # still ready: store: false and WebSocket turns serve, and every replica shares the store
            ready = await call(s, "GET", "/readyz", {})
            assert ready.status_code == 200
            assert ready.json() == {"status": "degraded", "checks": {"state_store": False}}
            assert (await call(s, "GET", "/healthz", {})).status_code == 200
            server.start()
            await asyncio.sleep(0.2)
            again = await create(s, {"input": "after"}, headers={})
            assert again["status"] == "completed"
            ready = await call(s, "GET", "/readyz", {})
            assert ready.status_code == 200 and ready.json()["status"] == "ok"
    finally:
        server.stop()


def test_two_replica_processes_share_one_redis(prefix: str) -> None:
    """Two real gateway processes (the CLI), one Redis: a response made on one continues on the other."""
    p = prefix + "-rep"
    env = {
        **os.environ,
        "GATEWAY_STATE__REDIS_URL": redis_url(),
        "GATEWAY_STATE__KEY_PREFIX": p,
        "GATEWAY_AUTH__API_KEYS": orjson.dumps(TWO_TENANTS["api_keys"]).decode(),
    }
    ports = [free_port(), free_port()]
    procs = [serve_cli(port, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for port in ports]
    try:
        for proc, port in zip(procs, ports, strict=True):
            wait_until_up(proc, port)
        with httpx.Client(timeout=20) as c:
            one, two = (f"http://127.0.0.1:{port}/v1/responses" for port in ports)
            first = (c.post(one, headers=A, json={"model": "mock", "input": "on replica one"})).json()
            r = c.post(
                two,
                headers=A,
                json={"model": "mock", "input": "on replica two", "previous_response_id": first["id"]},
            )
            assert r.status_code == 200 and r.json()["previous_response_id"] == first["id"]
            assert (c.get(f"{two}/{first['id']}", headers=A)).json()["id"] == first["id"]
            r = c.post(
                two, headers=B, json={"model": "mock", "input": "x", "previous_response_id": first["id"]}
            )
            assert r.json()["error"]["code"] == "previous_response_not_found"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        delete_prefix(redis_url(), p)
