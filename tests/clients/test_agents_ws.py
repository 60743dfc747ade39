"""The openai-agents SDK's agent loop over the gateway's WebSocket (its ``OpenAIResponsesWSModel``,
chosen by ``responses_websocket_session`` or ``OpenAIProvider(use_responses_websocket=True)``):
tool call → tool output → answer, plain and streamed, chained across runs by
``previous_response_id``, against the built-in ``mock`` model and the Anthropic and Gemini fakes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import orjson
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIProvider,
    OpenAIResponsesWSModel,
    RunConfig,
    Runner,
    function_tool,
    responses_websocket_session,
    set_tracing_disabled,
)

from gateway.app import create_app
from gateway.kernel.settings import Settings
from gateway.server.server import uvicorn_ws_options
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.gemini import FakeGemini
from tests.fakes.scripted import ScriptedFake
from tests.harness import ServedApp
from tests.ws.helpers import FrameTap

set_tracing_disabled(True)
CALLS: list[str] = []
ANSWER = "The tool returned: sunny in example"


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    CALLS.append(city)
    return f"sunny in {city}"


class Gateway:
    """The served gateway (every WebSocket frame a client sent kept) and its fake upstreams."""

    def __init__(self, served: ServedApp, tap: FrameTap, fakes: dict[str, ScriptedFake]) -> None:
        self.served, self.tap, self.fakes = served, tap, fakes

    @property
    def v1(self) -> str:
        return self.served.base_url + "/v1"


@pytest.fixture(scope="module")
async def gw() -> AsyncIterator[Gateway]:
    async with FakeAnthropic.serve() as ant, FakeGemini.serve() as gem:
        settings = Settings.model_validate(
            {
                "providers": {
                    "ant": {"kind": "anthropic", "base_url": ant.base_url, "api_key": "sk-ant"},
                    "gem": {"kind": "gemini", "base_url": gem.base_url, "api_key": "k"},
                },
                "models": {
                    "claude": {"provider": "ant", "upstream_model": "claude-x"},
                    "gemini": {"provider": "gem", "upstream_model": "gemini-x"},
                    "mock": {"provider": "mock"},
                },
            }
        )
        tap = FrameTap(create_app(settings))
        served = ServedApp(tap, **uvicorn_ws_options(settings)).start()
        try:
            yield Gateway(served, tap, {"claude": ant, "gemini": gem})
        finally:
            served.stop()


def agent(model: str, store: bool = True) -> Agent:
    return Agent(
        name="weather",
        instructions="Answer with the tool.",
        tools=[get_weather],
        model=model,
        model_settings=ModelSettings(store=store),
    )


def assert_ws_frames(frames: list[dict[str, Any]], model: str, count: int) -> None:
    """``count`` streamed ``response.create`` frames for ``model``, the later ones chained to the
    one before and carrying only what is new (the tool's output or the next user message)."""
    assert len(frames) == count, frames
    assert all(f["type"] == "response.create" and f["stream"] is True for f in frames)
    assert {f["model"] for f in frames} == {model}
    assert not frames[0].get("previous_response_id")
    assert all(f["previous_response_id"] for f in frames[1:])
    assert [i.get("type") for i in frames[1]["input"]] == ["function_call_output"]


async def test_session_tool_loop_then_next_run_chained_mock(gw: Gateway) -> None:
    CALLS.clear()
    frames = len(gw.tap.frames)
    async with responses_websocket_session(api_key="sk-none", base_url=gw.v1) as session:
        first = await session.run(agent("mock"), "What is the weather?", auto_previous_response_id=True)
        second = await session.run(
            agent("mock"), "And tomorrow?", previous_response_id=first.last_response_id
        )
    assert (first.final_output, second.final_output) == (ANSWER, ANSWER)
    assert CALLS == ["example", "example"]
    assert [type(i).__name__ for i in first.new_items] == [
        "ToolCallItem",
        "ToolCallOutputItem",
        "MessageOutputItem",
    ]
    sent = gw.tap.frames[frames:]
    assert_ws_frames(sent, "mock", 4)
    assert sent[2]["previous_response_id"] == first.last_response_id
    assert sent[2]["input"][0]["content"] == "And tomorrow?" and len(sent[2]["input"]) == 1
    # store: true, so the chain is the gateway's: the stored last answer links back through it.
    client = openai.AsyncOpenAI(base_url=gw.v1, api_key="sk-none", max_retries=0)
    assert second.last_response_id
    last = await client.responses.retrieve(second.last_response_id)
    assert last.previous_response_id == sent[3]["previous_response_id"]
    assert last.output_text == ANSWER


@pytest.mark.parametrize("model", ["claude", "gemini"])
async def test_session_streamed_tool_loop_against_native_upstream(gw: Gateway, model: str) -> None:
    CALLS.clear()
    fake = gw.fakes[model]
    frames, upstream = len(gw.tap.frames), len(fake.requests)
    async with responses_websocket_session(api_key="sk-none", base_url=gw.v1) as session:
        run = session.run_streamed(agent(model), "What is the weather?", auto_previous_response_id=True)
        kinds = {event.type async for event in run.stream_events()}
        assert run.final_output == ANSWER
        nxt = await session.run(agent(model), "Thanks. Again?", previous_response_id=run.last_response_id)
        assert nxt.final_output == ANSWER
    assert {"raw_response_event", "run_item_stream_event"} <= kinds
    assert CALLS == ["example", "example"]
    assert_ws_frames(gw.tap.frames[frames:], model, 4)
    # The upstream got the whole conversation each time, in its own wire format, from the chain
    # the gateway held: the last request has both tool rounds and both user messages.
    bodies = [r.body for r in fake.requests[upstream:]]
    assert len(bodies) == 4
    last = orjson.dumps(bodies[-1]).decode()
    assert "What is the weather?" in last and "Thanks. Again?" in last
    assert last.count("sunny in example") == 3  # two tool outputs and the first run's answer
    if model == "claude":
        assert [m["role"] for m in bodies[-1]["messages"]] == [
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
        ]
        assert bodies[-1]["messages"][-1]["content"][0]["type"] == "tool_result"
    else:
        assert "functionResponse" in bodies[-1]["contents"][-1]["parts"][0]


async def test_provider_websocket_transport_run_config(gw: Gateway) -> None:
    """The other way in: ``OpenAIProvider(use_responses_websocket=True)`` in a ``RunConfig``, one
    socket reused across the runs (the SDK caches the model per loop), store: false."""
    CALLS.clear()
    frames = len(gw.tap.frames)
    provider = OpenAIProvider(
        api_key="sk-none", base_url=gw.v1, use_responses=True, use_responses_websocket=True
    )
    try:
        model = provider.get_model("claude")
        assert isinstance(model, OpenAIResponsesWSModel)
        config = RunConfig(model_provider=provider)
        first = await Runner.run(
            agent("claude", store=False),
            "What is the weather?",
            run_config=config,
            auto_previous_response_id=True,
        )
        assert first.final_output == ANSWER
        assert provider.get_model("claude") is model
    finally:
        await provider.aclose()
    sent = gw.tap.frames[frames:]
    assert_ws_frames(sent, "claude", 2)
    assert all(f["store"] is False for f in sent)
    assert CALLS == ["example"]
