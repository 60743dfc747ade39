"""The openai-agents SDK's agent loop over HTTP (plain and streamed) against the gateway."""

from __future__ import annotations

import openai
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

from tests.harness import ServedApp

set_tracing_disabled(True)
CALLS: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    CALLS.append(city)
    return f"sunny in {city}"


def agent_for(gateway: ServedApp, store: bool) -> Agent:
    client = openai.AsyncOpenAI(base_url=gateway.base_url + "/v1", api_key="sk-none", max_retries=0)
    return Agent(
        name="weather",
        instructions="Answer with the tool.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model="mock", openai_client=client),
        model_settings=ModelSettings(store=store),
    )


async def test_agent_tool_loop_over_http(gateway: ServedApp) -> None:
    CALLS.clear()
    result = await Runner.run(agent_for(gateway, store=True), "What is the weather?")
    assert CALLS == ["example"]
    assert result.final_output == "The tool returned: sunny in example"


async def test_agent_tool_loop_streamed_store_false(gateway: ServedApp) -> None:
    CALLS.clear()
    run = Runner.run_streamed(agent_for(gateway, store=False), "Weather please")
    kinds = [event.type async for event in run.stream_events()]
    assert "raw_response_event" in kinds
    assert CALLS == ["example"]
    assert run.final_output == "The tool returned: sunny in example"
