"""One MCP conversation through every route: the gateway lists the server's tools once, offers them
to the model as functions, executes the model's calls and feeds the results back within one
response; the receipts round-trip, by ``previous_response_id`` and sent back as input alike."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.mcp.conftest import ROUTES, kinds, post, text_of
from tests.fakes.mcp_servers import McpServers
from tests.fakes.openai_chat import Reply
from tests.harness import ServedApp


def calc(servers: McpServers, **extra: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "calc",
        "server_url": servers.url("plain"),
        "require_approval": "never",
        **extra,
    }


def upstream_bodies(fakes: dict[str, Any], model: str) -> list[dict[str, Any]]:
    fake = fakes.get(model)
    return [r.body for r in fake.requests] if fake is not None else []


@pytest.mark.parametrize("model", ROUTES)
async def test_an_mcp_conversation_through_every_route(
    served: ServedApp, mcp_servers: McpServers, fakes: dict[str, Any], model: str
) -> None:
    tool = calc(mcp_servers)
    first = await post(served, {"model": model, "input": "Use the calculator.", "tools": [tool]})
    assert first["status"] == "completed", first
    assert kinds(first) == ["mcp_list_tools", "mcp_call", "message"]
    listing, call, _ = first["output"]
    assert listing["server_label"] == "calc" and {t["name"] for t in listing["tools"]} >= {"add"}
    assert call["server_label"] == "calc" and call["status"] == "completed" and call["error"] is None
    assert call["output"] and call["output"] in text_of(first)  # the model saw the result
    # the resource echoes the tool without secrets and the function tools it became stay internal
    assert first["tools"][0]["type"] == "mcp" and "headers" not in first["tools"][0]
    if model != "mock":
        bodies = upstream_bodies(fakes, model)
        assert len(bodies) == 2  # one response, two upstream calls

    # continued by previous_response_id: not listed again, the earlier receipts seen as calls
    second = await post(
        served,
        {"model": model, "previous_response_id": first["id"], "input": "Again.", "tools": [tool]},
    )
    assert kinds(second) == ["mcp_call", "message"]

    # the same conversation sent back as input (store false): the upstream gets the same calls
    history = [{"role": "user", "content": "Use the calculator."}, *first["output"]]
    third = await post(
        served,
        {
            "model": model,
            "input": [*history, {"role": "user", "content": "Again."}],
            "tools": [tool],
            "store": False,
        },
    )
    assert kinds(third) == ["mcp_call", "message"]
    if model != "mock":
        bodies = upstream_bodies(fakes, model)
        by_id, by_items = bodies[2], bodies[4]  # each follow-up's first upstream call
        assert _transcript(by_id) == _transcript(by_items)


def _transcript(body: dict[str, Any]) -> Any:
    """What the upstream was shown of the conversation (its messages, contents or input)."""
    for key in ("messages", "contents", "input"):
        if key in body:
            return body[key]
    raise AssertionError(f"no transcript in {sorted(body)}")


async def test_a_client_function_call_beside_mcp_calls_stops_the_response_for_the_client(
    served: ServedApp, mcp_servers: McpServers, fakes: dict[str, Any]
) -> None:
    fake = fakes["via-openai-chat"]
    fake.add(
        Reply.tool_calls([("calc__add", '{"a": 2, "b": 3}', "c1"), ("get_weather", '{"city": "Oslo"}', "c2")])
    )
    weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    res = await post(
        served, {"model": "via-openai-chat", "input": "Both please.", "tools": [calc(mcp_servers), weather]}
    )
    assert kinds(res) == ["mcp_list_tools", "mcp_call", "function_call"]
    assert res["output"][1]["output"] == "5" and res["output"][2]["name"] == "get_weather"
    assert len(fake.requests) == 1  # it stopped for the client's call
    follow = await post(
        served,
        {
            "model": "via-openai-chat",
            "previous_response_id": res["id"],
            "input": [{"type": "function_call_output", "call_id": "c2", "output": "sunny"}],
            "tools": [calc(mcp_servers), weather],
        },
    )
    assert kinds(follow) == ["message"]
    messages = fake.requests[-1].body["messages"]
    roles = [(m["role"], m.get("tool_call_id")) for m in messages]
    assert ("tool", "c2") in roles and any(m.get("content") == "5" for m in messages if m["role"] == "tool")


async def test_max_tool_calls_bounds_the_hosted_calls(
    served: ServedApp, mcp_servers: McpServers, fakes: dict[str, Any]
) -> None:
    fake = fakes["via-openai-chat"]
    fake.add(
        Reply.tool_calls([("calc__add", '{"a": 1, "b": 1}', "c1"), ("calc__add", '{"a": 2, "b": 2}', "c2")])
    )
    res = await post(
        served,
        {"model": "via-openai-chat", "input": "Twice.", "tools": [calc(mcp_servers)], "max_tool_calls": 1},
    )
    calls = [o for o in res["output"] if o["type"] == "mcp_call"]
    assert [c["status"] for c in calls] == ["completed", "failed"]
    assert "max_tool_calls" in calls[1]["error"]["message"]
    assert res["status"] == "completed"
