"""langchain-anthropic's ``ChatAnthropic``, unmodified, on ``/v1/messages``: invoke, stream and a
bound tool's call, against an anthropic upstream and the built-in mock."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from tests.harness import ServedApp


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def chat(gw: ServedApp, model: str) -> ChatAnthropic:
    return ChatAnthropic(model=model, base_url=gw.base_url, api_key="sk-none", max_tokens=200, max_retries=0)


@pytest.mark.parametrize("model", ["via-anthropic", "mock"])
async def test_invoke_and_stream(all_gateway: ServedApp, fakes: dict[str, Any], model: str) -> None:
    llm = chat(all_gateway, model)
    answer = await llm.ainvoke("hello langchain")
    assert isinstance(answer, AIMessage) and "hello langchain" in answer.text
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] > 0
    chunks = [chunk async for chunk in llm.astream("stream langchain")]
    assert "stream langchain" in "".join(c.text for c in chunks)


@pytest.mark.parametrize("model", ["via-anthropic", "via-openai-chat", "mock"])
async def test_tool_call_loop(all_gateway: ServedApp, fakes: dict[str, Any], model: str) -> None:
    llm = chat(all_gateway, model).bind_tools([get_weather])
    history: list[Any] = [HumanMessage("What is the weather?")]
    first = await llm.ainvoke(history)
    assert isinstance(first, AIMessage) and first.tool_calls
    call = first.tool_calls[0]
    assert call["name"] == "get_weather"
    history += [first, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    final = await llm.ainvoke(history)
    assert "sunny" in final.text
