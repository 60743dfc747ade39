"""The openai SDK's own Chat Completions client, unmodified, through the gateway on every route:
``chat.completions.create`` (JSON and streamed, with tools, json_schema) and ``.parse()``."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from tests.api.ingress_chat.conftest import ROUTES
from tests.fakes.openai_chat import Reply as ChatReply
from tests.fakes.scripted import Reply
from tests.harness import ServedApp

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def sdk(served: ServedApp) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=served.base_url + "/v1", api_key="sk-none", max_retries=0)


@pytest.mark.parametrize("model", ROUTES)
async def test_create(served: ServedApp, fakes: dict[str, Any], model: str) -> None:
    got = await sdk(served).chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
    )
    assert got.object == "chat.completion"
    assert got.id.startswith("chatcmpl-")
    choice = got.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert "Hi there" in (choice.message.content or "")
    assert (
        got.usage is not None
        and got.usage.total_tokens == got.usage.prompt_tokens + got.usage.completion_tokens
    )
    assert got.usage.completion_tokens > 0


@pytest.mark.parametrize("model", ROUTES)
async def test_stream_with_usage(served: ServedApp, fakes: dict[str, Any], model: str) -> None:
    stream = await sdk(served).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Hi there"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Hi there" in text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


async def test_stream_without_usage_has_no_usage_chunk(served: ServedApp, fakes: dict[str, Any]) -> None:
    stream = await sdk(served).chat.completions.create(
        model="mock", messages=[{"role": "user", "content": "Hi"}], stream=True
    )
    chunks = [c async for c in stream]
    assert all(c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("model", ROUTES)
@pytest.mark.parametrize("stream", [False, True])
async def test_tools_round_trip(served: ServedApp, fakes: dict[str, Any], model: str, stream: bool) -> None:
    client = sdk(served)
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    kw: dict[str, Any] = {"model": model, "tools": [WEATHER], "tool_choice": "required"}
    if stream:
        async with client.chat.completions.stream(messages=messages, **kw) as s:
            async for _ in s:
                pass
            got = await s.get_final_completion()
    else:
        got = await client.chat.completions.create(messages=messages, **kw)
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    call = calls[0]
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments).get("city"), str)
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"},
    ]
    again = await client.chat.completions.create(messages=messages, model=model, tools=[WEATHER])
    assert again.choices[0].finish_reason == "stop"
    assert "sunny, 21C" in (again.choices[0].message.content or "")


class Weather(BaseModel):
    city: str
    degrees: int


@pytest.mark.parametrize("model", ROUTES)
async def test_parse_structured_output(served: ServedApp, fakes: dict[str, Any], model: str) -> None:
    _answer_json(fakes, model)
    got = await sdk(served).chat.completions.parse(
        model=model, messages=[{"role": "user", "content": "Weather in Paris?"}], response_format=Weather
    )
    parsed = got.choices[0].message.parsed
    assert isinstance(parsed, Weather)


@pytest.mark.parametrize("model", ROUTES)
async def test_json_schema_streamed(served: ServedApp, fakes: dict[str, Any], model: str) -> None:
    _answer_json(fakes, model)
    async with sdk(served).chat.completions.stream(
        model=model, messages=[{"role": "user", "content": "Weather in Paris?"}], response_format=Weather
    ) as s:
        async for _ in s:
            pass
        got = await s.get_final_completion()
    assert isinstance(got.choices[0].message.parsed, Weather)


def _answer_json(fakes: dict[str, Any], model: str) -> None:
    """The fake of ``model``'s route answers a Weather (the mock makes one from the schema)."""
    answer = '{"city": "Paris", "degrees": 21}'
    if model == "openai-chat":
        fakes[model].add(ChatReply.text(answer))
    elif model in fakes:
        fakes[model].add(Reply.text(answer))
