"""The anthropic Python SDK, unmodified, on ``/v1/messages`` against every upstream (the fakes speak
each provider's wire format): ``messages.create`` and ``messages.stream``, with tools (a whole tool
loop), thinking (its signature sent back) and images; the SDK parses every answer and event."""

from __future__ import annotations

import base64
from typing import Any

import anthropic
import pytest

from tests.api.ingress_messages.conftest import MODELS
from tests.fakes.anthropic import Reply
from tests.harness import ServedApp

WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()


def ev(kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    """One raw upstream event for a scripted reply."""
    return kind, {"type": kind, **fields}


def client(gw: ServedApp) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gw.base_url, api_key="sk-none", max_retries=0)


@pytest.mark.parametrize("model", MODELS)
async def test_create_text(all_gateway: ServedApp, fakes: dict[str, Any], model: str) -> None:
    msg = await client(all_gateway).messages.create(
        model=model,
        max_tokens=200,
        system="You are terse.",
        messages=[{"role": "user", "content": "hi there"}],
    )
    assert msg.type == "message" and msg.role == "assistant" and msg.model == model
    assert msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"]
    assert "hi there" in msg.content[0].text  # type: ignore[union-attr]
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0
    assert msg.usage.cache_read_input_tokens == 0


@pytest.mark.parametrize("model", MODELS)
async def test_stream_text(all_gateway: ServedApp, fakes: dict[str, Any], model: str) -> None:
    async with client(all_gateway).messages.stream(
        model=model, max_tokens=200, messages=[{"role": "user", "content": "stream me"}]
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds[-2] == "message_delta" and "content_block_start" in kinds and "content_block_stop" in kinds
    assert "stream me" in final.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 0


async def _tool_loop(gw: ServedApp, model: str, streamed: bool) -> list[Any]:
    c = client(gw)
    messages: list[Any] = [{"role": "user", "content": "What is the weather?"}]
    first: Any
    if streamed:
        async with c.messages.stream(model=model, max_tokens=300, messages=messages, tools=[WEATHER]) as s:
            first = await s.get_final_message()
    else:
        first = await c.messages.create(model=model, max_tokens=300, messages=messages, tools=[WEATHER])
    assert first.stop_reason == "tool_use"
    call = next(b for b in first.content if b.type == "tool_use")
    assert call.name == "get_weather" and isinstance(call.input, dict) and "city" in call.input
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]},
    ]
    final = await c.messages.create(model=model, max_tokens=300, messages=messages, tools=[WEATHER])
    assert final.stop_reason == "end_turn"
    assert "sunny" in final.content[0].text  # type: ignore[union-attr]
    return messages


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_tool_loop(all_gateway: ServedApp, fakes: dict[str, Any], model: str, streamed: bool) -> None:
    await _tool_loop(all_gateway, model, streamed)


async def test_tool_loop_reaches_anthropic_as_tool_use_and_tool_result(
    all_gateway: ServedApp, fakes: dict[str, Any]
) -> None:
    messages = await _tool_loop(all_gateway, "via-anthropic", streamed=True)
    sent = fakes["anthropic"].requests[-1].body
    assert sent["messages"] == messages  # the client's blocks, as sent
    assert sent["tools"] == [WEATHER]


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_thinking_signature_round_trip_to_anthropic(
    all_gateway: ServedApp, fakes: dict[str, Any], streamed: bool
) -> None:
    fake = fakes["anthropic"]
    fake.add(
        Reply.text("Forty-two.", reasoning="Let me count.", signature="sig-Zm9vYmFy=="), Reply.text("Yes.")
    )
    c = client(all_gateway)
    ask: dict[str, Any] = {
        "model": "via-anthropic",
        "max_tokens": 4000,
        "thinking": {"type": "enabled", "budget_tokens": 2000},
        "messages": [{"role": "user", "content": "the answer?"}],
    }
    if streamed:
        async with c.messages.stream(**ask) as s:
            kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) async for e in s]
            first = await s.get_final_message()
        assert ("content_block_delta", "thinking_delta") in kinds
        assert ("content_block_delta", "signature_delta") in kinds
    else:
        first = await c.messages.create(**ask)
    thinking, text = first.content
    assert thinking.type == "thinking" and thinking.thinking == "Let me count."
    assert thinking.signature == "sig-Zm9vYmFy=="
    assert text.type == "text" and text.text == "Forty-two."
    history = [
        *ask["messages"],
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": "sure?"},
    ]
    again = await c.messages.create(**{**ask, "messages": history})
    assert again.content[-1].text == "Yes."
    sent = fake.requests[-1].body["messages"][1]["content"][0]
    assert sent == {"type": "thinking", "thinking": "Let me count.", "signature": "sig-Zm9vYmFy=="}
    assert fake.requests[-1].body["thinking"] == {"type": "enabled", "budget_tokens": 2000}


async def test_redacted_thinking_passes_both_ways(all_gateway: ServedApp, fakes: dict[str, Any]) -> None:
    fake = fakes["anthropic"]
    redacted = {"type": "redacted_thinking", "data": "RU5DUllQVEVE"}
    text = {"type": "text", "text": ""}
    fake.add(
        Reply(
            events=[
                ev("message_start", message={"usage": {"input_tokens": 5, "output_tokens": 1}}),
                ev("content_block_start", index=0, content_block=redacted),
                ev("content_block_stop", index=0),
                ev("content_block_start", index=1, content_block=text),
                ev("content_block_delta", index=1, delta={"type": "text_delta", "text": "Ok."}),
                ev("content_block_stop", index=1),
                ev("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 3}),
                ev("message_stop"),
            ]
        )
    )
    c = client(all_gateway)
    async with c.messages.stream(
        model="via-anthropic", max_tokens=3000, messages=[{"role": "user", "content": "x"}]
    ) as s:
        first = await s.get_final_message()
    assert first.content[0].model_dump() == redacted
    assert first.content[1].text == "Ok."  # type: ignore[union-attr]


@pytest.mark.parametrize("model", ["via-openai-responses", "via-gemini", "mock"])
async def test_thinking_from_other_upstreams(
    all_gateway: ServedApp, fakes: dict[str, Any], model: str
) -> None:
    """Reasoning from any upstream is a thinking block; sent back, it is that upstream's reasoning."""
    c = client(all_gateway)
    ask: dict[str, Any] = {
        "model": model,
        "max_tokens": 4000,
        "thinking": {"type": "enabled", "budget_tokens": 2000},
        "messages": [{"role": "user", "content": "think"}],
    }
    first = await c.messages.create(**ask)
    if model != "mock":  # the mock does not reason
        assert first.content[0].type == "thinking" and first.content[0].thinking
    history = [
        *ask["messages"],
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": "more"},
    ]
    again = await c.messages.create(**{**ask, "messages": history})
    assert again.content[-1].type == "text"


@pytest.mark.parametrize("model", MODELS)
async def test_image(all_gateway: ServedApp, fakes: dict[str, Any], model: str) -> None:
    msg = await client(all_gateway).messages.create(
        model=model,
        max_tokens=200,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                    {"type": "text", "text": "what is this"},
                ],
            }
        ],
    )
    assert "what is this" in msg.content[0].text  # type: ignore[union-attr]
    kind = model.removeprefix("via-")
    if kind in fakes:
        sent = str(fakes[kind].requests[-1].body)
        assert PNG in sent  # the image reached the upstream, in its own format


async def test_max_tokens_stop_reason(all_gateway: ServedApp, fakes: dict[str, Any]) -> None:
    c = client(all_gateway)
    msg = await c.messages.create(
        model="via-anthropic", max_tokens=2, messages=[{"role": "user", "content": "one two three four"}]
    )
    assert msg.stop_reason == "max_tokens"
    async with c.messages.stream(
        model="via-openai-chat", max_tokens=2, messages=[{"role": "user", "content": "one two three four"}]
    ) as s:
        final = await s.get_final_message()
    assert final.stop_reason == "max_tokens"


async def test_stop_sequence_from_anthropic(all_gateway: ServedApp, fakes: dict[str, Any]) -> None:
    fake = fakes["anthropic"]
    stopped = {"stop_reason": "stop_sequence", "stop_sequence": ", 3"}
    events: list[Any] = [
        ev("message_start", message={"usage": {"input_tokens": 5, "output_tokens": 1}}),
        ev("content_block_start", index=0, content_block={"type": "text", "text": "1, 2"}),
        ev("content_block_stop", index=0),
        ev("message_delta", delta=stopped, usage={"output_tokens": 3}),
        ev("message_stop"),
    ]
    fake.add(Reply(events=events), Reply(events=events))
    c = client(all_gateway)
    ask: dict[str, Any] = {
        "model": "via-anthropic",
        "max_tokens": 50,
        "stop_sequences": [", 3"],
        "messages": [{"role": "user", "content": "count"}],
    }
    async with c.messages.stream(**ask) as s:
        final = await s.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == ", 3"
    assert fake.requests[-1].body["stop_sequences"] == [", 3"]


async def test_stop_sequences_and_top_k_reach_other_upstreams(
    all_gateway: ServedApp, fakes: dict[str, Any]
) -> None:
    c = client(all_gateway)
    for model in ("via-openai-chat", "via-gemini"):
        await c.messages.create(
            model=model,
            max_tokens=50,
            stop_sequences=["END"],
            extra_body={"top_k": 5},
            messages=[{"role": "user", "content": "x"}],
        )
    assert fakes["openai-chat"].requests[-1].body["stop"] == ["END"]
    gen = fakes["gemini"].requests[-1].body["generationConfig"]
    assert gen["stopSequences"] == ["END"] and gen["topK"] == 5


async def test_cache_usage_from_anthropic(all_gateway: ServedApp, fakes: dict[str, Any]) -> None:
    """The client's own cache_control breakpoints reach the upstream; its cache figures come back."""
    c = client(all_gateway)
    system: Any = [
        {"type": "text", "text": "Long instructions. " * 50, "cache_control": {"type": "ephemeral"}}
    ]
    ask: dict[str, Any] = {"model": "via-anthropic", "max_tokens": 50, "system": system}
    first = await c.messages.create(**ask, messages=[{"role": "user", "content": "a"}])
    assert first.usage.cache_creation_input_tokens and first.usage.cache_creation_input_tokens > 0
    assert first.usage.cache_read_input_tokens == 0
    async with c.messages.stream(**ask, messages=[{"role": "user", "content": "b"}]) as s:
        second = await s.get_final_message()
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0
    assert fakes["anthropic"].requests[-1].body["system"] == system


async def test_upstream_errors_in_anthropic_shape(all_gateway: ServedApp, fakes: dict[str, Any]) -> None:
    """A refusal before the first event is an error response; a failure mid-stream an ``error`` event."""
    fake = fakes["anthropic"]
    fake.add(Reply.error(400), Reply.text("partial", stream_error="overloaded"))
    c = client(all_gateway)
    ask: dict[str, Any] = {
        "model": "via-anthropic",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "x"}],
    }
    with pytest.raises(anthropic.BadRequestError) as bad:
        async with c.messages.stream(**ask) as s:
            await s.get_final_message()
    assert bad.value.body["type"] == "error"  # type: ignore[index]
    seen: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as failed:
        async with c.messages.stream(**ask) as s:
            async for event in s:
                seen.append(event.type)
    assert "content_block_delta" in seen and "message_stop" not in seen
    assert failed.value.body["error"]["type"] == "api_error"  # type: ignore[index]
