"""Bad input gets a 400 that names the field, on every transport, never a crash: wrong JSON types
are not coerced, and free-form JSON nested beyond ``limits.max_json_depth`` is refused."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from tests.harness import ServedApp
from tests.ws.helpers import assert_clean_turn, assert_envelope, read_turn, run_turn, ws_connect


def nested(levels: int) -> str:
    """A JSON schema nested ``levels`` objects deep (two JSON levels each), as text: deeper than
    orjson will serialize, so it cannot be built as a dict and dumped."""
    return '{"type":"object","properties":{"x":' * levels + '{"type":"string"}' + "}}" * levels


DEEP = 150  # 300 JSON levels: past orjson's 255, which crashed such requests before the bound

DEEP_BODIES = {
    "tools[0].parameters": '"tools":[{"type":"function","name":"f","parameters":' + nested(DEEP) + "}]",
    "text.format.schema": '"text":{"format":{"type":"json_schema","name":"s","schema":' + nested(DEEP) + "}}",
}


def raw(fields: str, **body: Any) -> str:
    head = orjson.dumps({"model": "mock", "input": "hi", **body}).decode()
    return head[:-1] + "," + fields + "}"


async def post(gw: ServedApp, body: dict[str, Any] | str) -> httpx.Response:
    content = body if isinstance(body, str) else orjson.dumps({"model": "mock", "input": "hi", **body})
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=10) as c:
        return await c.post("/v1/responses", content=content)


@pytest.mark.parametrize("param", sorted(DEEP_BODIES))
@pytest.mark.parametrize("stream", [False, True])
async def test_deep_nesting_is_a_400_naming_the_field(gateway: ServedApp, param: str, stream: bool) -> None:
    r = await post(gateway, raw(DEEP_BODIES[param], stream=stream))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "nesting_too_deep" and err["param"] == param
    shallow = await post(gateway, raw(DEEP_BODIES[param].replace(nested(DEEP), nested(20))))
    assert shallow.status_code == 200


async def test_deep_nesting_over_a_websocket_keeps_the_socket_and_its_queue(gateway: ServedApp) -> None:
    async with ws_connect(gateway) as ws:
        # the bad turn and a good one queued right behind it: the good one still runs
        await ws.send(raw(DEEP_BODIES["tools[0].parameters"], type="response.create"))
        await ws.send(orjson.dumps({"type": "response.create", "model": "mock", "input": "b"}).decode())
        refused = await read_turn(ws)
        assert_envelope(refused[-1], 400, "nesting_too_deep", "tools[0].parameters")
        assert_clean_turn(await read_turn(ws))
        assert_clean_turn(await run_turn(ws, model="mock", input="c"))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stream", "yes"),
        ("store", "no"),
        ("temperature", "1"),
        ("max_output_tokens", 20.5),
        ("instructions", 5),
    ],
)
async def test_wrong_types_are_not_coerced(gateway: ServedApp, field: str, value: Any) -> None:
    r = await post(gateway, {field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and err["type"] == "invalid_request_error"
    async with ws_connect(gateway) as ws:
        events = await run_turn(ws, model="mock", input="x", **{field: value})
        if field != "stream":  # a WebSocket create ignores "stream" (clients send it)
            assert_envelope(events[-1], 400, err["code"], field)


@pytest.mark.parametrize(
    ("sent", "echoed"),
    [("req-client-42", True), ("x" * 60_000, False), ("bad id\twith spaces", False), ("a" * 129, False)],
)
async def test_x_request_id_is_echoed_only_when_it_is_a_plausible_id(
    gateway: ServedApp, sent: str, echoed: bool
) -> None:
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=10) as c:
        r = await c.post(
            "/v1/responses", json={"model": "mock", "input": "hi"}, headers={"x-request-id": sent}
        )
    assert r.status_code == 200
    got = r.headers["x-request-id"]
    if echoed:
        assert got == sent
    else:
        assert got != sent and got.startswith("req_") and len(got) < 64
