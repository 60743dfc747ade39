"""The MCP loop streamed: one sequence of events for the whole response (the listing, the call's
arguments and outcome, the second upstream call's text), each as openai-python parses it; and the
servers that fail, hang, answer too much or speak no JSON-RPC give a failed call, never a stuck
response."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from tests.api.helpers import parse_sse
from tests.api.mcp.conftest import kinds, post, text_of
from tests.fakes.mcp_servers import McpServers
from tests.harness import ServedApp
from tests.schema import assert_event

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def tool(servers: McpServers, name: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": name,
        "server_url": servers.url(name),
        "require_approval": "never",
        **extra,
    }


async def stream(s: ServedApp, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=s.base_url, timeout=30) as c:
        r = await c.post("/v1/responses", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    frames = parse_sse(r.content)
    assert frames[-1] == ("", "[DONE]")
    events = [json.loads(data) for _, data in frames[:-1]]
    for name, data in frames[:-1]:
        assert name == json.loads(data)["type"]
    return events


def checked(events: list[dict[str, Any]]) -> None:
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for ev in events:
        item = ev.get("item")
        mcp = "mcp" in ev["type"] or (isinstance(item, dict) and item["type"].startswith("mcp_"))
        if mcp:
            EVENTS.validate_python(ev)
        elif ev["type"] not in TERMINAL and ev["type"] not in ("response.created", "response.in_progress"):
            assert_event(ev)


@pytest.mark.parametrize("model", ["via-openai-responses", "via-gemini"])
async def test_one_sequence_of_events_for_the_whole_loop(
    served: ServedApp, mcp_servers: McpServers, model: str
) -> None:
    events = await stream(served, {"model": model, "input": "Add.", "tools": [tool(mcp_servers, "plain")]})
    checked(events)
    types = [e["type"] for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    order = [
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.output_text.delta",
    ]
    at = [types.index(t) for t in order]
    assert at == sorted(at), types
    assert "response.mcp_call_arguments.delta" in types
    final = events[-1]["response"]
    assert kinds(final) == ["mcp_list_tools", "mcp_call", "message"]
    assert final["output"][1]["output"] in text_of(final)


async def test_a_failing_tool_fails_its_call_and_the_model_is_told(
    served: ServedApp, mcp_servers: McpServers
) -> None:
    res = await post(
        served, {"model": "via-openai-chat", "input": "Go.", "tools": [tool(mcp_servers, "failing")]}
    )
    call = res["output"][1]
    assert call["type"] == "mcp_call" and call["status"] == "failed" and call["output"] is None
    assert call["error"]["message"]
    assert res["status"] == "completed" and "Error:" in text_of(res)


async def test_a_hanging_tool_times_out_within_the_call_timeout(
    served: ServedApp, mcp_servers: McpServers
) -> None:
    start = time.monotonic()
    events = await stream(
        served, {"model": "via-openai-chat", "input": "Go.", "tools": [tool(mcp_servers, "hanging")]}
    )
    took = time.monotonic() - start
    final = events[-1]["response"]
    assert "response.mcp_call.failed" in [e["type"] for e in events]
    call = next(o for o in final["output"] if o["type"] == "mcp_call")
    assert call["status"] == "failed" and final["status"] == "completed"
    assert took < 15  # the served gateway's call_timeout_seconds is 2


async def test_a_huge_result_fails_its_call(served: ServedApp, mcp_servers: McpServers) -> None:
    res = await post(
        served, {"model": "via-openai-chat", "input": "Go.", "tools": [tool(mcp_servers, "huge")]}
    )
    call = res["output"][1]
    assert call["status"] == "failed" and call["output"] is None


async def test_a_server_that_cannot_be_listed_fails_the_request_before_anything_is_generated(
    served: ServedApp, mcp_servers: McpServers, fakes: dict[str, Any]
) -> None:
    err = await post(
        served,
        {"model": "via-openai-chat", "input": "Go.", "tools": [tool(mcp_servers, "malformed")]},
        status=424,
    )
    assert err["error"]["code"] == "mcp_server_error"
    assert fakes["via-openai-chat"].requests == []
