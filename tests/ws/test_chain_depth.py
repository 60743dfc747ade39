"""``state.max_chain_depth`` holds on a WebSocket as over HTTP: a chain served from the connection
cache is refused at the same depth a stored chain would be."""

from __future__ import annotations

import httpx

from tests.harness import serve_gateway
from tests.ws.helpers import run_turn, ws_connect


async def test_the_cache_and_the_store_refuse_the_same_depth() -> None:
    with serve_gateway({"state": {"max_chain_depth": 2}}) as served:
        for store in (False, True):
            async with ws_connect(served) as ws:
                prev = None
                for n in range(3):  # chains of 1, 2 and 3 responses
                    final = (
                        await run_turn(
                            ws, model="mock", input=f"t{n}", store=store, previous_response_id=prev
                        )
                    )[-1]
                    assert final["type"] == "response.completed", final
                    prev = final["response"]["id"]
                [error] = await run_turn(ws, model="mock", input="t3", store=store, previous_response_id=prev)
                assert error["type"] == "error" and error["status"] == 400
                assert error["error"]["param"] == "previous_response_id"
                assert "longer than 2" in error["error"]["message"]
            if store:  # the same chain continued over HTTP, from the store
                async with httpx.AsyncClient(base_url=served.base_url) as c:
                    r = await c.post(
                        "/v1/responses", json={"model": "mock", "input": "x", "previous_response_id": prev}
                    )
                assert r.status_code == 400 and r.json()["error"]["message"] == error["error"]["message"]
