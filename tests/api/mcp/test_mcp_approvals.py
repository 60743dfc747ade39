"""Approvals: a call that needs one ends the response with an ``mcp_approval_request``; the next
request approves or denies it (by ``previous_response_id`` or with the items sent back), and the
loop resumes: the call is executed (or refused) and the model goes on."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.mcp.conftest import kinds, post, text_of
from tests.fakes.mcp_servers import McpServers
from tests.harness import ServedApp

MODEL = "via-anthropic"


def calc(servers: McpServers, approval: Any = "always") -> dict[str, Any]:
    tool = {"type": "mcp", "server_label": "calc", "server_url": servers.url("plain")}
    if approval is not None:
        tool["require_approval"] = approval
    return tool


@pytest.mark.parametrize("approval", ["always", None])  # None: OpenAI's default, always
async def test_an_approved_call_is_executed_and_the_model_goes_on(
    served: ServedApp, mcp_servers: McpServers, fakes: dict[str, Any], approval: Any
) -> None:
    tool = calc(mcp_servers, approval)
    first = await post(served, {"model": MODEL, "input": "Add.", "tools": [tool]})
    assert kinds(first) == ["mcp_list_tools", "mcp_approval_request"]
    assert first["status"] == "completed"
    request = first["output"][1]
    assert request["server_label"] == "calc" and request["arguments"]
    assert len(fakes[MODEL].requests) == 1  # nothing executed, no second upstream call

    answer = {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}
    second = await post(
        served, {"model": MODEL, "previous_response_id": first["id"], "input": [answer], "tools": [tool]}
    )
    assert kinds(second) == ["mcp_call", "message"]
    call = second["output"][0]
    assert call["approval_request_id"] == request["id"] and call["status"] == "completed"
    assert call["arguments"] == request["arguments"] and call["output"] in text_of(second)
    # the model saw the approved call next to its result
    blocks = [b for m in fakes[MODEL].requests[-1].body["messages"] for b in _blocks(m)]
    uses = [b for b in blocks if b.get("type") == "tool_use"]
    results = [b for b in blocks if b.get("type") == "tool_result"]
    assert [u["id"] for u in uses] == [r["tool_use_id"] for r in results] == [request["id"]]

    # approving the same request again executes nothing more
    again = await post(
        served,
        {
            "model": MODEL,
            "input": [*first["output"], answer, *second["output"]],
            "tools": [tool],
            "store": False,
        },
    )
    assert "mcp_call" not in kinds(again) or again["output"][0]["approval_request_id"] is None


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return content if isinstance(content, list) else []


async def test_a_denied_call_is_not_executed_and_the_model_is_told(
    served: ServedApp, mcp_servers: McpServers, fakes: dict[str, Any]
) -> None:
    tool = calc(mcp_servers)
    first = await post(served, {"model": MODEL, "input": "Add.", "tools": [tool], "store": False})
    request = first["output"][1]
    answer = {
        "type": "mcp_approval_response",
        "approval_request_id": request["id"],
        "approve": False,
        "reason": "not today",
    }
    second = await post(
        served,
        {"model": MODEL, "input": [*first["output"], answer], "tools": [tool], "store": False},
    )
    assert kinds(second) == ["message"]
    told = fakes[MODEL].requests[-1].body["messages"][-1]["content"][0]
    assert told["type"] == "tool_result" and told["tool_use_id"] == request["id"]
    assert "did not approve" in str(told["content"]) and "not today" in str(told["content"])


async def test_per_tool_approval_filters(served: ServedApp, mcp_servers: McpServers) -> None:
    never_add = {"never": {"tool_names": ["add"]}}
    res = await post(served, {"model": MODEL, "input": "Add.", "tools": [calc(mcp_servers, never_add)]})
    assert kinds(res) == ["mcp_list_tools", "mcp_call", "message"]
    always_add = {"always": {"tool_names": ["add"]}, "never": {"read_only": True}}
    res = await post(served, {"model": MODEL, "input": "Add.", "tools": [calc(mcp_servers, always_add)]})
    assert kinds(res) == ["mcp_list_tools", "mcp_approval_request"]


async def test_an_approval_of_an_unknown_request_is_refused(
    served: ServedApp, mcp_servers: McpServers
) -> None:
    answer = {"type": "mcp_approval_response", "approval_request_id": "mcpr_nope", "approve": True}
    err = await post(
        served, {"model": MODEL, "input": [answer], "tools": [calc(mcp_servers)], "store": False}, status=400
    )
    assert err["error"]["param"] == "input[0].approval_request_id"
