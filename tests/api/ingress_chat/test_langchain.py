"""langchain-openai's ``ChatOpenAI``, unmodified, on the gateway's Chat Completions ingress:
invoke, stream (with usage) and tool calls, through an openai-chat and an anthropic upstream."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from tests.harness import ServedApp


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


def chat(served: ServedApp, model: str) -> ChatOpenAI:
    return ChatOpenAI(
        model=model, base_url=served.base_url + "/v1", api_key="sk-none", max_retries=0, stream_usage=True
    )


@pytest.mark.parametrize("model", ["openai-chat", "anthropic", "mock"])
async def test_invoke_and_stream(served: ServedApp, fakes: dict[str, Any], model: str) -> None:
    llm = chat(served, model)
    got = await llm.ainvoke([HumanMessage("Hi there")])
    assert isinstance(got, AIMessage) and "Hi there" in str(got.content)
    assert got.response_metadata["finish_reason"] == "stop"
    assert got.usage_metadata is not None and got.usage_metadata["output_tokens"] > 0
    pieces = [piece async for piece in llm.astream([HumanMessage("Hi there")])]
    whole = pieces[0]
    for piece in pieces[1:]:
        whole = whole + piece
    assert "Hi there" in str(whole.content)
    assert whole.usage_metadata is not None and whole.usage_metadata["total_tokens"] > 0


@pytest.mark.parametrize("model", ["openai-chat", "anthropic", "mock"])
async def test_tool_calls(served: ServedApp, fakes: dict[str, Any], model: str) -> None:
    llm = chat(served, model).bind_tools([get_weather], tool_choice="required")
    got = await llm.ainvoke([HumanMessage("Weather in Paris?")])
    assert isinstance(got, AIMessage)
    assert [c["name"] for c in got.tool_calls] == ["get_weather"]
    call = got.tool_calls[0]
    answer = (
        await chat(served, model)
        .bind_tools([get_weather])
        .ainvoke([HumanMessage("Weather in Paris?"), got, ToolMessage("sunny, 21C", tool_call_id=call["id"])])
    )
    assert "sunny, 21C" in str(answer.content)
