"""MCP calls in flight across the gateway's lifecycle features: WebSocket lanes and steering (at the
safe boundary after a call), inline compaction (receipts summarized like other items), background
responses, the ledger (every upstream call of the loop counted), and the metrics per server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.api.mcp.conftest import kinds, mcp_settings, post
from tests.fakes.mcp_servers import McpServers
from tests.fakes.openai_chat import Reply
from tests.harness import ServedApp
from tests.ws.helpers import create, serve, ws_connect
from tests.ws.test_steer import recv, until


@pytest.fixture(scope="module")
def gw(upstreams: dict[str, Any]) -> Iterator[ServedApp]:
    """With the CLI's WebSocket options."""
    with serve(mcp_settings(upstreams)) as s:
        yield s


def sleeper(servers: McpServers) -> dict[str, Any]:
    """Only ``sleep`` offered: the built-in model calls it with 1.5 (s)."""
    return {
        "type": "mcp",
        "server_label": "calc",
        "server_url": servers.url("plain"),
        "require_approval": "never",
        "allowed_tools": ["sleep"],
    }


async def test_a_steer_waits_for_the_call_in_flight_then_stops_before_the_next_upstream_call(
    gw: ServedApp, mcp_servers: McpServers
) -> None:
    async with ws_connect(gw) as ws:
        await ws.send(create(model="mock", input="Sleep.", tools=[sleeper(mcp_servers)], store=False))
        head = await until(ws, lambda e: e["type"] == "response.mcp_call_arguments.done")
        first = head[0]["response"]
        await ws.send(
            orjson.dumps(
                {"type": "response.steer", "previous_response_id": first["id"], "input": "Wake up."}
            ).decode()
        )
        events = await until(ws, lambda e: e["type"] == "response.completed")
    types = [e["type"] for e in events]
    assert "response.steer.accepted" in types
    cut = types.index("response.incomplete")
    assert types.index("response.mcp_call.completed") < cut  # the call finished first
    steered = events[cut]["response"]
    assert steered["incomplete_details"] == {"reason": "steered"}
    assert [o["type"] for o in steered["output"]] == ["mcp_list_tools", "mcp_call"]
    assert steered["output"][1]["status"] == "completed" and steered["output"][1]["output"] == "slept 1.5"
    successor = events[cut + 1]
    assert successor["type"] == "response.created"
    assert successor["response"]["previous_response_id"] == steered["id"]
    final = events[-1]["response"]
    assert "mcp_list_tools" not in kinds(final)  # the chain's listing is reused


async def test_two_lanes_each_with_mcp_calls(gw: ServedApp, mcp_servers: McpServers) -> None:
    tool = {**sleeper(mcp_servers), "allowed_tools": ["add"]}
    async with ws_connect(gw) as ws:
        for lane in ("a", "b"):
            await ws.send(create(model="mock", input="Add.", tools=[tool], store=False, stream_id=lane))
        done: dict[str, dict[str, Any]] = {}
        while len(done) < 2:
            event = await recv(ws)
            if event["type"] == "response.completed":
                done[event["stream_id"]] = event["response"]
    for resource in done.values():
        assert kinds(resource) == ["mcp_list_tools", "mcp_call", "message"]
        assert resource["output"][1]["output"] == "2"


async def test_inline_compaction_summarizes_the_receipts(
    served: ServedApp, mcp_servers: McpServers, fakes: dict[str, Any]
) -> None:
    fake = fakes["via-openai-chat"]
    tool = {**sleeper(mcp_servers), "allowed_tools": ["add"]}
    first = await post(served, {"model": "via-openai-chat", "input": "Add.", "tools": [tool]})
    assert kinds(first) == ["mcp_list_tools", "mcp_call", "message"]
    second = await post(
        served,
        {
            "model": "via-openai-chat",
            "previous_response_id": first["id"],
            "input": "Now summarize.",
            "tools": [tool],
            "context_management": [{"type": "compaction", "compact_threshold": 1}],
        },
    )
    assert kinds(second)[0] == "compaction"
    summary_request = next(
        r.body for r in fake.requests if "[tool call calc.add]" in orjson.dumps(r.body).decode()
    )
    assert "[tool result]" in orjson.dumps(summary_request).decode()


async def test_a_background_response_runs_its_mcp_loop(served: ServedApp, mcp_servers: McpServers) -> None:
    tool = {**sleeper(mcp_servers), "allowed_tools": ["add"]}
    started = await post(served, {"model": "mock", "input": "Add.", "tools": [tool], "background": True})
    assert started["status"] in ("queued", "in_progress")
    async with httpx.AsyncClient(base_url=served.base_url, timeout=10) as c:
        for _ in range(200):
            res = (await c.get(f"/v1/responses/{started['id']}")).json()
            if res["status"] not in ("queued", "in_progress"):
                break
            await asyncio.sleep(0.05)
    assert res["status"] == "completed" and kinds(res) == ["mcp_list_tools", "mcp_call", "message"]


async def test_every_upstream_call_of_the_loop_is_counted_and_each_server_call_measured(
    served: ServedApp, mcp_servers: McpServers, fakes: dict[str, Any]
) -> None:
    fake = fakes["via-openai-chat"]
    fake.add(Reply.tool_calls([("calc__add", '{"a": 2, "b": 2}', "c1")], usage=(20, 9)))
    fake.add(Reply.text("Four.", usage=(40, 3)))
    tool = {**sleeper(mcp_servers), "allowed_tools": ["add"]}
    async with httpx.AsyncClient(base_url=served.base_url, timeout=10) as c:
        before = (await c.get("/v1/usage")).json()["totals"]
        res = await post(served, {"model": "via-openai-chat", "input": "Add.", "tools": [tool]})
        after = (await c.get("/v1/usage")).json()["totals"]
        metrics = (await c.get("/metrics")).text
    assert res["usage"]["input_tokens"] == 60 and res["usage"]["output_tokens"] == 12
    assert after["input_tokens"] - before["input_tokens"] == 60
    assert after["output_tokens"] - before["output_tokens"] == 12
    assert 'gateway_mcp_calls_total{kind="call",outcome="ok",server_label="calc"}' in metrics
    assert 'gateway_mcp_calls_total{kind="list_tools",outcome="ok",server_label="calc"}' in metrics
    assert "gateway_mcp_call_duration_seconds_bucket" in metrics
