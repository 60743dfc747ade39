"""The WebSocket in front of a fake OpenAI-compatible upstream (openai-chat route): what the
upstream receives each turn of a store:false chain, tool loops, errors, and disconnects."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.fakes.openai_chat import FakeOpenAIChat, Reply, smart_reply
from tests.harness import ServedApp
from tests.helpers import chat_upstream, fake_fixtures
from tests.ws.helpers import (
    assert_clean_turn,
    assert_envelope,
    create,
    output_text,
    run_turn,
    serve,
    ws_connect,
)

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


fake_server, fake = fake_fixtures(FakeOpenAIChat, responder=smart_reply)


@pytest.fixture(scope="module")
def served(fake_server: FakeOpenAIChat) -> Iterator[ServedApp]:
    models = {"chat": {"provider": "up", "upstream_model": "fake-llm"}}
    with serve(chat_upstream(fake_server, models, api_key="sk-upstream", retry={"attempts": 0})) as s:
        yield s


def roles(fake: FakeOpenAIChat, n: int) -> list[tuple[str, Any]]:
    return [(m["role"], m.get("content")) for m in fake.requests[n].body["messages"]]


async def test_store_false_chain_reaches_the_upstream_whole(served: ServedApp, fake: FakeOpenAIChat) -> None:
    async with ws_connect(served) as ws:
        r1 = assert_clean_turn(await run_turn(ws, model="chat", input="My color is cobalt.", store=False))
        r2 = assert_clean_turn(
            await run_turn(
                ws, model="chat", input="What is my color?", store=False, previous_response_id=r1["id"]
            )
        )
    assert output_text(r2) == "Hello! You said: What is my color?"
    assert roles(fake, 0) == [("user", "My color is cobalt.")]
    assert roles(fake, 1) == [
        ("user", "My color is cobalt."),
        ("assistant", "Hello! You said: My color is cobalt."),
        ("user", "What is my color?"),
    ]
    assert all(r.body["model"] == "fake-llm" and r.body["stream"] is True for r in fake.requests)


async def test_tool_loop_sends_only_the_tool_output(served: ServedApp, fake: FakeOpenAIChat) -> None:
    async with ws_connect(served) as ws:
        r1 = assert_clean_turn(
            await run_turn(ws, model="chat", input="Weather in Paris?", tools=[TOOL], store=False)
        )
        [call] = r1["output"]
        assert call["type"] == "function_call" and call["name"] == "get_weather"
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
        r2 = assert_clean_turn(
            await run_turn(
                ws, model="chat", input=[output], tools=[TOOL], store=False, previous_response_id=r1["id"]
            )
        )
    assert output_text(r2) == "The tool returned: sunny"
    messages = fake.requests[1].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == call["call_id"]
    assert messages[2] == {"role": "tool", "tool_call_id": call["call_id"], "content": "sunny"}


async def test_upstream_errors_before_and_after_the_first_event(
    served: ServedApp, fake: FakeOpenAIChat
) -> None:
    fake.add(Reply.error(400, {"error": {"message": "bad", "code": "context_length_exceeded"}}))
    broken = Reply.text("one two three four five six", pieces=6)
    broken.disconnect_after = 4
    fake.add(broken)
    async with ws_connect(served) as ws:
        [msg] = await run_turn(ws, model="chat", input="x")
        assert msg["type"] == "error" and msg["status"] == 400
        assert msg["error"]["code"] == "context_length_exceeded"
        events = await run_turn(ws, model="chat", input="y")
        failed = assert_clean_turn(events, terminal="response.failed")
        assert failed["error"]["code"] == "upstream_error"
        assert_clean_turn(await run_turn(ws, model="chat", input="z"))  # still usable


async def test_client_gone_cancels_the_upstream_request(served: ServedApp, fake: FakeOpenAIChat) -> None:
    fake.add(Reply.text("a b c d e f g h i j", pieces=10, chunk_delay=0.5, split=None))
    async with ws_connect(served) as ws:
        await ws.send(create(model="chat", input="x"))
        while orjson.loads(await ws.recv())["type"] != "response.output_text.delta":
            pass
    gone_at = time.monotonic()
    await asyncio.wait_for(fake.disconnected.wait(), timeout=1.5)
    assert time.monotonic() - gone_at < 1.0
    assert fake.disconnects == 1


async def test_previous_response_not_found_never_reaches_the_upstream(
    served: ServedApp, fake: FakeOpenAIChat
) -> None:
    async with ws_connect(served) as ws:
        [msg] = await run_turn(ws, model="chat", input="x", store=False, previous_response_id="resp_missing")
        assert_envelope(msg, 400, "previous_response_not_found")
    assert fake.requests == []
