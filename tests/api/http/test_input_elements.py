"""``limits.max_input_elements``: a request with too many input items, content parts and tools is
refused before it is validated (validation holds the event loop), on HTTP, WebSocket and compact."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.sync.client import connect

from tests.harness import ServedApp, serve_gateway

LIMIT = 50
TOOLS = [{"type": "function", "name": f"f{n}"} for n in range(LIMIT)]


@pytest.fixture(scope="module")
def served() -> Iterator[ServedApp]:
    with serve_gateway({"limits": {"max_input_elements": LIMIT}}) as s:
        yield s


def messages(n: int, parts: int = 0) -> list[dict[str, Any]]:
    content: Any = [{"type": "input_text", "text": "a"}] * parts if parts else "a"
    return [{"role": "user", "content": content}] * n


def assert_refused(error: dict[str, Any]) -> None:
    assert error["code"] == "too_many_input_items" and error["param"] == "input"
    assert str(LIMIT) in error["message"]


@pytest.mark.parametrize(
    ("body", "ok"),
    [
        ({"input": messages(LIMIT)}, True),
        ({"input": messages(LIMIT + 1)}, False),
        ({"input": messages(10, parts=4)}, True),  # 10 items + 40 parts
        ({"input": messages(10, parts=5)}, False),  # 10 items + 50 parts
        (
            {"input": messages(1), "tools": [{"type": "function", "name": f"f{n}"} for n in range(LIMIT)]},
            False,
        ),
    ],
)
async def test_http_and_compact(served: ServedApp, body: dict[str, Any], ok: bool) -> None:
    async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
        for path in ("/v1/responses", "/v1/responses/compact"):
            r = await c.post(path, json={"model": "mock", "tool_choice": "none", **body})
            if ok:
                assert r.status_code == 200, (path, r.text)
            else:
                assert r.status_code == 400, (path, r.text)
                assert_refused(r.json()["error"])


def test_websocket_turn_is_refused_and_the_socket_stays_usable(served: ServedApp) -> None:
    with connect(served.ws_url + "/v1/responses", proxy=None) as ws:
        ws.send(
            orjson.dumps({"type": "response.create", "model": "mock", "input": messages(LIMIT + 1)}).decode()
        )
        error = orjson.loads(ws.recv(timeout=20))
        assert error["type"] == "error" and error["status"] == 400
        assert_refused(error["error"])
        ws.send(orjson.dumps({"type": "response.create", "model": "mock", "input": "hi"}).decode())
        while (event := orjson.loads(ws.recv(timeout=20)))["type"] != "response.completed":
            assert event["type"] != "error", event
