"""Hosted MCP tools as real clients use them, unmodified: openai-python's ``responses.create`` and
``responses.stream`` with an ``mcp`` tool (its accumulator reads the ``response.mcp_*`` events),
approvals by ``previous_response_id``, and openai-agents' ``HostedMCPTool`` (its loop sends the
receipts back as input, and answers approval requests through ``on_approval_request``) — against
real MCP servers on loopback, through the built-in model and the Anthropic fake."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from agents import Agent, HostedMCPTool, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
from agents.items import MCPApprovalRequestItem

from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.mcp_servers import McpServers, serve_mcp_servers
from tests.harness import ServedApp, serve_gateway

set_tracing_disabled(True)


@pytest.fixture(scope="module")
def mcp_servers() -> Iterator[McpServers]:
    with serve_mcp_servers() as servers:
        yield servers


@pytest.fixture(scope="module")
async def anthropic() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic.serve() as fake:
        yield fake


@pytest.fixture(scope="module")
def served(anthropic: FakeAnthropic) -> Iterator[ServedApp]:
    settings = {
        "providers": {"claude": {"kind": "anthropic", "base_url": anthropic.base_url, "api_key": "sk-up"}},
        "models": {
            "mock": {"provider": "mock"},
            "claude": {"provider": "claude", "upstream_model": "claude-x"},
        },
        "mcp": {"allow": ["127.0.0.1"]},
    }
    with serve_gateway(settings) as s:
        yield s


def calc(servers: McpServers, approval: str = "never") -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "calc",
        "server_url": servers.url("plain"),
        "require_approval": approval,
    }


def client(s: ServedApp) -> openai.AsyncOpenAI:
    """Async: the Anthropic fake is served on the test's own event loop."""
    return openai.AsyncOpenAI(base_url=s.base_url + "/v1", api_key="sk-none", max_retries=0)


@pytest.mark.parametrize("model", ["mock", "claude"])
async def test_openai_python_create_and_stream(
    served: ServedApp, mcp_servers: McpServers, model: str
) -> None:
    c = client(served)
    res = await c.responses.create(model=model, input="Add two numbers.", tools=[calc(mcp_servers)])  # type: ignore[list-item]
    assert [o.type for o in res.output] == ["mcp_list_tools", "mcp_call", "message"]
    call = res.output[1]
    assert call.type == "mcp_call" and call.server_label == "calc" and call.output
    assert call.output in res.output_text

    seen: list[str] = []
    tools: Any = [calc(mcp_servers)]
    async with c.responses.stream(model=model, input="Add two numbers.", tools=tools) as stream:
        async for event in stream:
            seen.append(event.type)
        final = await stream.get_final_response()
    assert {
        "response.mcp_list_tools.completed",
        "response.mcp_call_arguments.delta",
        "response.mcp_call.completed",
    } <= set(seen)
    assert [o.type for o in final.output] == ["mcp_list_tools", "mcp_call", "message"]
    made = final.output[1]
    assert made.type == "mcp_call" and made.output is not None and made.output in final.output_text


async def test_openai_python_approval_by_previous_response_id(
    served: ServedApp, mcp_servers: McpServers
) -> None:
    c = client(served)
    tools: Any = [calc(mcp_servers, "always")]
    first = await c.responses.create(model="claude", input="Add two numbers.", tools=tools)
    request = first.output[-1]
    assert request.type == "mcp_approval_request"
    second = await c.responses.create(
        model="claude",
        previous_response_id=first.id,
        input=[{"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}],
        tools=tools,
    )
    assert [o.type for o in second.output] == ["mcp_call", "message"]
    assert second.output[0].type == "mcp_call" and second.output[0].approval_request_id == request.id
    assert (await c.responses.retrieve(second.id)).output[0].type == "mcp_call"  # stored and replayed


def agent_for(s: ServedApp, tool: HostedMCPTool, store: bool) -> Agent:
    api = openai.AsyncOpenAI(base_url=s.base_url + "/v1", api_key="sk-none", max_retries=0)
    return Agent(
        name="calc",
        instructions="Use the calculator.",
        tools=[tool],
        model=OpenAIResponsesModel(model="claude", openai_client=api),
        model_settings=ModelSettings(store=store),
    )


@pytest.mark.parametrize("store", [True, False])
async def test_openai_agents_hosted_mcp_tool(served: ServedApp, mcp_servers: McpServers, store: bool) -> None:
    tool = HostedMCPTool(tool_config=calc(mcp_servers))  # type: ignore[arg-type]
    result = await Runner.run(agent_for(served, tool, store), "Add two numbers.")
    assert "The tool returned:" in str(result.final_output)
    kinds = [getattr(item.raw_item, "type", None) for item in result.new_items]
    assert "mcp_list_tools" in kinds and "mcp_call" in kinds


async def test_openai_agents_answers_an_approval_request(served: ServedApp, mcp_servers: McpServers) -> None:
    asked: list[str] = []

    def approve(request: Any) -> Any:
        asked.append(request.data.name)
        return {"approve": True}

    tool = HostedMCPTool(tool_config=calc(mcp_servers, "always"), on_approval_request=approve)  # type: ignore[arg-type]
    result = await Runner.run(agent_for(served, tool, store=False), "Add two numbers.")
    assert asked == ["add"]
    assert any(isinstance(item, MCPApprovalRequestItem) for item in result.new_items)
    assert "The tool returned:" in str(result.final_output)
