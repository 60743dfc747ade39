"""Real clients over the WebSocket: the openai SDK's ``responses.connect()`` and the openai-agents
SDK's WebSocket session running a store:false tool loop; what each sent and what the upstream got."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from agents import Agent, ModelSettings, function_tool, responses_websocket_session, set_tracing_disabled

from gateway.app import create_app
from gateway.kernel.settings import Settings
from gateway.server.server import uvicorn_ws_options
from tests.harness import ServedApp
from tests.ws.helpers import FrameTap, Recorder, install

set_tracing_disabled(True)
CALLS: list[str] = []


@pytest.fixture(scope="module")
def tapped() -> Iterator[tuple[ServedApp, FrameTap, Recorder]]:
    settings = Settings()
    tap = FrameTap(create_app(settings))
    served = ServedApp(tap, **uvicorn_ws_options(settings)).start()
    recorder = Recorder()
    install(served, "mock", recorder)  # the mock model, with what it was sent recorded
    try:
        yield served, tap, recorder
    finally:
        served.stop()


def summary(items: list[dict[str, Any]]) -> list[str]:
    """One word per upstream item: the role of a message, else the item type."""
    return [i.get("role") if i["type"] == "message" else i["type"] for i in items]  # type: ignore[misc]


async def until_terminal(conn: Any) -> Any:
    async for event in conn:
        if event.type in ("response.completed", "response.failed", "response.incomplete", "error"):
            return event
    raise AssertionError("connection ended")


async def test_openai_sdk_connect_two_turns(tapped: tuple[ServedApp, FrameTap, Recorder]) -> None:
    served, tap, recorder = tapped
    client = openai.AsyncOpenAI(base_url=served.base_url + "/v1", api_key="sk-none", max_retries=0)
    start, frames = len(recorder.requests), len(tap.frames)
    async with client.responses.connect() as conn:
        await conn.response.create(model="mock", input="My color is cobalt.", store=False)
        first = await until_terminal(conn)
        assert first.type == "response.completed"
        await conn.response.create(
            model="mock", input="What is my color?", store=False, previous_response_id=first.response.id
        )
        second = await until_terminal(conn)
        assert second.type == "response.completed"
        assert second.response.output_text == "Hello! You said: What is my color?"
        assert second.response.previous_response_id == first.response.id
        # The SDK reads the envelope's nested error object.
        await conn.response.create(model="mock", input="x", store=False, previous_response_id="resp_gone")
        err = await until_terminal(conn)
        assert err.type == "error" and err.error.code == "previous_response_not_found"
    sent = tap.frames[frames:]
    assert [f["type"] for f in sent] == ["response.create"] * 3
    assert sent[1]["input"] == "What is my color?"  # only the new input went over the wire
    t1, t2 = recorder.transcripts()[start:]
    assert summary(t1) == ["user"]
    assert summary(t2) == ["user", "assistant", "user"]
    assert t2[1]["content"][0]["text"] == "Hello! You said: My color is cobalt."


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    CALLS.append(city)
    return f"sunny in {city}"


async def test_agents_websocket_session_tool_loop_store_false(
    tapped: tuple[ServedApp, FrameTap, Recorder],
) -> None:
    served, tap, recorder = tapped
    CALLS.clear()
    start, frames = len(recorder.requests), len(tap.frames)
    agent = Agent(
        name="weather",
        instructions="Answer with the tool.",
        tools=[get_weather],
        model="mock",
        model_settings=ModelSettings(store=False),
    )
    async with responses_websocket_session(api_key="sk-none", base_url=served.base_url + "/v1") as session:
        first = await session.run(agent, "What is the weather?", auto_previous_response_id=True)
        assert first.final_output == "The tool returned: sunny in example"
        second = await session.run(
            agent,
            "And tomorrow?",
            previous_response_id=first.last_response_id,
            auto_previous_response_id=True,
        )
        assert second.final_output == "The tool returned: sunny in example"
    assert CALLS == ["example", "example"]

    sent = tap.frames[frames:]
    assert len(sent) == 4 and all(f["type"] == "response.create" and f["stream"] is True for f in sent)
    assert all(f["store"] is False for f in sent)
    # Every frame after the first carries previous_response_id and only the new items.
    assert "previous_response_id" not in sent[0] or sent[0]["previous_response_id"] is None
    for frame in sent[1:]:
        assert frame["previous_response_id"]
    assert [i.get("type") for i in sent[1]["input"]] == ["function_call_output"]
    assert [i.get("type", "message") for i in sent[2]["input"]] == ["message"]
    assert [i.get("type") for i in sent[3]["input"]] == ["function_call_output"]

    # ...while the upstream got the whole chain each time, held by the gateway.
    transcripts = recorder.transcripts()[start:]
    assert [summary(t) for t in transcripts] == [
        ["user"],
        ["user", "function_call", "function_call_output"],
        ["user", "function_call", "function_call_output", "assistant", "user"],
        [
            "user",
            "function_call",
            "function_call_output",
            "assistant",
            "user",
            "function_call",
            "function_call_output",
        ],
    ]
    assert transcripts[3][-1]["output"] == "sunny in example"
