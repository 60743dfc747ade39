"""/readyz: a down state store leaves the pod ready but degraded (store: false and WebSocket turns
still serve, and all replicas share that store); only a draining process answers 503."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from websockets.sync.client import connect

from tests.harness import serve_gateway
from tests.redis_server import RedisServer, unique_prefix


async def test_store_down_is_degraded_not_unready_and_websocket_turns_serve() -> None:
    server = RedisServer().start()
    try:
        cfg = {
            "state": {
                "redis_url": server.url,
                "key_prefix": unique_prefix(),
                "timeout_seconds": 0.5,
                "health_recheck_seconds": 0.1,
            }
        }
        with serve_gateway(cfg) as s:
            async with httpx.AsyncClient(base_url=s.base_url, timeout=20) as c:
                ready = await c.get("/readyz")
                assert (ready.status_code, ready.json()["status"]) == (200, "ok")
                server.stop()
                ready = await c.get("/readyz")
                assert ready.status_code == 200
                assert ready.json() == {"status": "degraded", "checks": {"state_store": False}}
                assert "redis" not in ready.text
                r = await c.post("/v1/responses", json={"model": "mock", "input": "x", "store": False})
                assert r.status_code == 200 and r.json()["status"] == "completed"
            with connect(s.ws_url + "/v1/responses", proxy=None, open_timeout=20) as ws:
                # a socket's turns chain on the socket's own cache: no store needed
                previous = None
                for text in ("hi", "and again"):
                    create = {"type": "response.create", "model": "mock", "input": text, "store": False}
                    ws.send(orjson.dumps({**create, "previous_response_id": previous}).decode())
                    event: dict[str, Any] = {}
                    while event.get("type") not in ("response.completed", "error", "response.failed"):
                        event = orjson.loads(ws.recv(timeout=20))
                    assert event["type"] == "response.completed", event
                    previous = event["response"]["id"]
    finally:
        server.stop()


async def test_a_draining_process_is_not_ready() -> None:
    with serve_gateway() as s:
        async with httpx.AsyncClient(base_url=s.base_url, timeout=20) as c:
            assert (await c.get("/readyz")).status_code == 200
            await s.app.state.ws_hub.drain(0)  # what GatewayServer.shutdown starts on SIGTERM
            ready = await c.get("/readyz")
            assert ready.status_code == 503 and ready.json()["status"] == "draining"
            assert (await c.get("/healthz")).status_code == 200  # alive: the kubelet must not kill it
