"""Lanes and steering through the official openai SDK's ``client.responses.connect()``, async and
sync: ``stream_id=`` on create, ``connection.response.steer(...)``, the SDK's parsed steer events;
against the mock model and against the Anthropic and Gemini fakes (real HTTP upstreams whose
streams are slowed so a steer lands mid-generation)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from openai.types.responses import ResponseFunctionToolCall
from openai.types.responses.response_steer_required_input import FunctionCallOutput

from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.gemini import FakeGemini
from tests.fakes.scripted import Reply
from tests.harness import ServedApp
from tests.ws.helpers import SlowMock, install, serve

STEER = "Forget that; just say hi."


@pytest.fixture(scope="module")
async def anthropic() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic.serve() as fake:
        yield fake


@pytest.fixture(scope="module")
async def gemini() -> AsyncIterator[FakeGemini]:
    async with FakeGemini.serve() as fake:
        yield fake


@pytest.fixture(scope="module")
def served(anthropic: FakeAnthropic, gemini: FakeGemini) -> Iterator[ServedApp]:
    settings = {
        "providers": {
            "ant": {
                "kind": "anthropic",
                "base_url": anthropic.base_url,
                "api_key": "sk-ant",
                "retry": {"attempts": 0},
            },
            "gem": {
                "kind": "gemini",
                "base_url": gemini.base_url,
                "api_key": "g-key",
                "retry": {"attempts": 0},
            },
        },
        "models": {
            "claude": {"provider": "ant", "upstream_model": "claude-fake"},
            "gemini": {"provider": "gem", "upstream_model": "gemini-fake"},
            "mock": {"provider": "mock"},
        },
    }
    with serve(settings) as s:
        install(s, "mock", SlowMock())  # the mock model, 0.15 s between deltas
        yield s


def slow_text(n: int = 40) -> Reply:
    return Reply(answer=" ".join(f"w{i}" for i in range(n)), pieces=n, chunk_delay=0.1, split=None)


def check_steered(events: list[Any], sid: str) -> tuple[Any, Any]:
    """The SDK parsed: accepted, the steered response (incomplete, reason steered), the successor
    continuing it; every event on lane ``sid``. → (steered, successor) responses."""
    kinds = [e.type for e in events]
    assert all(e.stream_id == sid for e in events), kinds
    accepted = events[kinds.index("response.steer.accepted")]
    assert type(accepted).__name__ == "ResponseSteerAcceptedEvent"
    steered = events[kinds.index("response.incomplete")].response
    assert accepted.steer.previous_response_id == steered.id
    assert steered.incomplete_details is not None and steered.incomplete_details.reason == "steered"
    assert steered.status == "incomplete" and steered.output[0].status == "incomplete"
    created = [e.response for e in events if e.type == "response.created"]
    assert len(created) == 2 and created[1].previous_response_id == steered.id
    successor = events[-1].response
    assert events[-1].type == "response.completed" and successor.id == created[1].id
    return steered, successor


async def test_async_sdk_steers_the_mock_model_on_a_lane(served: ServedApp) -> None:
    client = openai.AsyncOpenAI(base_url=served.base_url + "/v1", api_key="sk-none", max_retries=0)
    events: list[Any] = []
    async with client.responses.connect() as conn:
        await conn.response.create(model="mock", input="x" * 200, store=False, stream_id="lane-1")
        async for event in conn:
            events.append(event)
            if event.type == "response.output_text.delta" and len(events) < 6:
                await conn.response.steer(input=STEER, previous_response_id=events[0].response.id)
            if event.type == "response.completed":
                break
    steered, successor = check_steered(events, "lane-1")
    assert len(steered.output_text) < len("Hello! You said: " + "x" * 200)
    assert successor.output_text == f"Hello! You said: {STEER}"


async def test_async_sdk_pending_steer_after_a_tool_call_on_the_mock_model(served: ServedApp) -> None:
    client = openai.AsyncOpenAI(base_url=served.base_url + "/v1", api_key="sk-none", max_retries=0)
    tool = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
    async with client.responses.connect() as conn:
        await conn.response.create(model="mock", input="Look it up.", tools=[tool], store=False)  # type: ignore[list-item]
        async for event in conn:
            if event.type == "response.completed":
                first = event.response
                break
        await conn.response.steer(
            input=[{"type": "message", "role": "user", "content": "Be quick."}], previous_response_id=first.id
        )
        accepted, pending = await conn.recv(), await conn.recv()
        assert accepted.type == "response.steer.accepted" and pending.type == "response.steer.pending"
        assert type(pending).__name__ == "ResponseSteerPendingEvent"
        [stub] = pending.required_input
        assert isinstance(stub, FunctionCallOutput)
        assert (stub.type, stub.name) == ("function_call_output", "lookup")
        call = first.output[0]
        assert isinstance(call, ResponseFunctionToolCall)
        assert stub.call_id == call.call_id
        await conn.response.create(
            model="mock",
            input=[{"type": "function_call_output", "call_id": stub.call_id, "output": "found"}],
            store=False,
            previous_response_id=first.id,
        )
        async for event in conn:
            if event.type == "response.completed":
                second = event.response
                break
        # The steering went in after the tool result: the mock (no tools now) answers the last item.
        assert second.output_text == "Hello! You said: Be quick."
        await conn.response.steer(input="again", previous_response_id=first.id)
        failed = await conn.recv()
    assert failed.type == "response.steer.failed" and type(failed).__name__ == "ResponseSteerFailedEvent"
    assert failed.error.code == "response_not_active" and failed.steer.input == "again"


def _sync_steer(base_url: str, model: str, sid: str) -> list[Any]:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="sk-none", max_retries=0)
    events: list[Any] = []
    with client.responses.connect() as conn:
        conn.response.create(model=model, input="Tell me everything.", store=True, stream_id=sid)
        for event in conn:
            events.append(event)
            if (
                event.type == "response.output_text.delta"
                and sum(e.type.endswith(".delta") for e in events) == 2
            ):
                conn.response.steer(input=STEER, previous_response_id=events[0].response.id)
            if event.type == "response.completed":
                break
    return events


async def test_sync_sdk_steers_the_anthropic_fake_on_a_lane(
    served: ServedApp, anthropic: FakeAnthropic
) -> None:
    anthropic.reset()
    anthropic.add(slow_text())
    events = await asyncio.to_thread(_sync_steer, served.base_url, "claude", "ant-lane")
    steered, successor = check_steered(events, "ant-lane")
    assert successor.output_text == f"Hello! You said: {STEER}"
    first, second = anthropic.requests[0].body, anthropic.requests[1].body
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"][0]["text"] == steered.output_text
    assert first["max_tokens"] == second["max_tokens"]
    await asyncio.wait_for(anthropic.disconnected.wait(), 10)  # the steered call was cancelled
    assert anthropic.disconnects == 1


async def test_async_sdk_steers_the_gemini_fake_on_a_lane(served: ServedApp, gemini: FakeGemini) -> None:
    gemini.reset()
    gemini.add(slow_text())
    client = openai.AsyncOpenAI(base_url=served.base_url + "/v1", api_key="sk-none", max_retries=0)
    events: list[Any] = []
    async with client.responses.connect() as conn:
        await conn.response.create(model="gemini", input="Go on.", store=False, stream_id="g")
        async for event in conn:
            events.append(event)
            if (
                event.type == "response.output_text.delta"
                and sum(e.type.endswith(".delta") for e in events) == 1
            ):
                await conn.response.steer(input=STEER, previous_response_id=events[0].response.id)
            if event.type == "response.completed":
                break
    steered, successor = check_steered(events, "g")
    assert steered.output_text and len(steered.output_text) < len(" ".join(f"w{i}" for i in range(40)))
    assert successor.output_text == f"Hello! You said: {STEER}"
    contents = gemini.requests[1].body["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
