"""The gateway in front of a real third-party server: llama.cpp's ``llama-server`` with SmolLM2-135M.

Every route that speaks one of its wire formats (openai-chat, openai-responses, anthropic), through
the openai SDK: text equal to what the server answers directly at temperature 0, streaming, chains
with ``store`` true (HTTP) and false (a WebSocket's connection memory), compaction and a compacted
window continued, a tool round trip (the client's function call and its output, rendered by the
server's own chat template), and a client that leaves mid-stream stopping the server's generation.
Short prompts, temperature 0 and small ``max_output_tokens`` keep the whole module to a minute or two.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.harness import ServedApp
from tests.llama_cpp.server import LlamaServer
from tests.schema import assert_event, assert_schema
from tests.ws.helpers import create, read_turn, ws_connect

MODELS = ["smol-chat", "smol-responses", "smol-anthropic"]
PROMPT = "Name three colors."


def client(gw: ServedApp) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.base_url + "/v1", api_key="sk-none", max_retries=0, timeout=120)


async def direct_text(llama: LlamaServer, model: str, prompt: str, max_tokens: int) -> str:
    """What the server itself answers to the same prompt, in the wire format ``model``'s route speaks."""
    async with httpx.AsyncClient(base_url=llama.origin, timeout=120) as http:
        if model == "smol-chat":
            body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}]}
            reply = await http.post(
                "/v1/chat/completions", json={**body, "max_tokens": max_tokens, "temperature": 0}
            )
            return str(reply.json()["choices"][0]["message"]["content"])
        if model == "smol-responses":
            body = {"input": prompt, "max_output_tokens": max_tokens, "temperature": 0}
            data = (await http.post("/v1/responses", json=body)).json()
            return "".join(
                part["text"]
                for item in data["output"]
                if item["type"] == "message"
                for part in item["content"]
                if part["type"] == "output_text"
            )
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0}
        data = (await http.post("/v1/messages", json={**body, "model": "smollm2"})).json()
        return "".join(block["text"] for block in data["content"] if block["type"] == "text")


@pytest.mark.parametrize("model", MODELS)
async def test_text_is_what_the_server_answers(
    llama: LlamaServer, llama_gateway: ServedApp, model: str
) -> None:
    raw = await client(llama_gateway).responses.with_raw_response.create(
        model=model, input=PROMPT, max_output_tokens=24, temperature=0
    )
    assert_schema("ResponseResource", raw.http_response.json())
    response = raw.parse()
    assert response.status in ("completed", "incomplete")
    if response.status == "incomplete":
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text.strip()
    assert response.output_text == await direct_text(llama, model, PROMPT, 24)
    assert response.usage is not None
    assert response.usage.input_tokens > 0 and 0 < response.usage.output_tokens <= 24
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens


@pytest.mark.parametrize("model", MODELS)
async def test_streaming(llama_gateway: ServedApp, model: str) -> None:
    deltas: list[str] = []
    sequence: list[int] = []
    async with client(llama_gateway).responses.stream(
        model=model, input=PROMPT, max_output_tokens=24, temperature=0
    ) as stream:
        async for event in stream:
            sequence.append(event.sequence_number)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = await stream.get_final_response()
    assert sequence == list(range(len(sequence)))
    assert len(deltas) > 1, "the server streamed its tokens; so does the gateway"
    assert "".join(deltas) == final.output_text and final.output_text.strip()


@pytest.mark.parametrize("model", MODELS)
async def test_chain_store_true(llama_gateway: ServedApp, model: str) -> None:
    sdk = client(llama_gateway)
    first = await sdk.responses.create(
        model=model, input="My name is Ada.", max_output_tokens=16, temperature=0, store=True
    )
    second = await sdk.responses.create(
        model=model,
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=16,
        temperature=0,
        store=True,
    )
    assert second.previous_response_id == first.id
    assert first.usage is not None and second.usage is not None
    # the server counted the first turn (its input and its answer) again in the second's prompt
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    fetched = await sdk.responses.retrieve(second.id)
    assert fetched.output_text == second.output_text


@pytest.mark.parametrize("model", MODELS)
async def test_websocket_turns_store_false(llama_gateway: ServedApp, model: str) -> None:
    async with ws_connect(llama_gateway) as ws:
        usage: list[dict[str, Any]] = []
        previous: str | None = None
        for text in ("My name is Ada.", "What is my name?", "Say it again."):
            body: dict[str, Any] = {"model": model, "input": text, "store": False, "max_output_tokens": 16}
            if previous:
                body["previous_response_id"] = previous
            await ws.send(create(**body, temperature=0))
            events = await read_turn(ws, wait=120)
            for event in events:
                assert_event(event)
            done = events[-1]
            assert done["type"] in ("response.completed", "response.incomplete"), done
            previous = done["response"]["id"]
            usage.append(done["response"]["usage"])
    # each turn sent only its new message; the gateway replayed the rest from connection memory
    for before, after in itertools.pairwise(usage):
        assert after["input_tokens"] > before["input_tokens"] + before["output_tokens"]


@pytest.mark.parametrize("model", MODELS)
async def test_compaction_then_continue(llama_gateway: ServedApp, model: str) -> None:
    sdk = client(llama_gateway)
    history: list[Any] = []
    for text, answer in (
        ("I live in Paris.", "Noted."),
        ("I like tea.", "Good."),
        ("I have a cat.", "Nice."),
    ):
        history += [
            {"type": "message", "role": "user", "content": text},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]},
        ]
    history.append({"type": "message", "role": "user", "content": "Where do I live?"})
    compacted = await sdk.responses.compact(model=model, input=history)
    kinds = [item.type for item in compacted.output]
    assert "compaction" in kinds and kinds[-1] == "message"
    assert compacted.usage.input_tokens > 0 and compacted.usage.output_tokens > 0, "the server summarized"
    window = [item.model_dump(exclude_none=True, warnings=False) for item in compacted.output]
    response = await sdk.responses.create(
        model=model,
        input=window,  # type: ignore[arg-type]
        max_output_tokens=16,
        temperature=0,
        store=False,
    )
    assert response.status in ("completed", "incomplete") and response.output_text.strip()


WEATHER_TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.mark.parametrize("model", MODELS)
async def test_tool_round_trip(llama_gateway: ServedApp, model: str) -> None:
    """The client's function call and its output, replayed: the server's chat template must accept
    the adapter's rendering of both (an unmatched call id or a bad role is a 400 there)."""
    history: list[Any] = [
        {"type": "message", "role": "user", "content": "What is the weather in Paris?"},
        {
            "type": "function_call",
            "call_id": "call_weather_1",
            "name": "get_weather",
            "arguments": orjson.dumps({"city": "Paris"}).decode(),
        },
        {"type": "function_call_output", "call_id": "call_weather_1", "output": "Sunny, 24 degrees."},
    ]
    response = await client(llama_gateway).responses.create(
        model=model,
        input=history,
        tools=[WEATHER_TOOL],
        max_output_tokens=24,
        temperature=0,
    )
    assert response.status in ("completed", "incomplete"), response.error
    assert response.output_text.strip()
    assert response.usage is not None and response.usage.input_tokens > 40, "the tool output was sent"


@pytest.mark.parametrize("model", MODELS)
async def test_disconnect_stops_the_server(llama: LlamaServer, llama_gateway: ServedApp, model: str) -> None:
    body = {
        "model": model,
        "input": "Write a very long story about a dragon.",
        "max_output_tokens": 2000,
        "stream": True,
    }
    async with httpx.AsyncClient(base_url=llama_gateway.base_url, timeout=60) as http:
        async with http.stream("POST", "/v1/responses", json=body) as reply:
            assert reply.status_code == 200
            seen = 0
            async for line in reply.aiter_lines():
                if line.startswith("data:") and "output_text.delta" in line:
                    seen += 1
                    if seen == 5:
                        break
            assert llama.busy_slots() == 1, "the server is generating the answer"
        # the client has closed its connection
    deadline = time.monotonic() + 5
    while llama.busy_slots() and time.monotonic() < deadline:  # noqa: ASYNC110 (another process's state)
        await asyncio.sleep(0.02)
    assert llama.busy_slots() == 0, "the server stopped generating after the client left"


@pytest.mark.parametrize("model", MODELS)
async def test_background_poll_resume_and_cancel(
    llama: LlamaServer, llama_gateway: ServedApp, model: str
) -> None:
    """``background: true`` through the server: polled to its end, its stream resumed from a point,
    and a long one cancelled, which stops the server's generation too."""
    sdk = client(llama_gateway)
    response = await sdk.responses.create(
        model=model, input="Say hi.", background=True, max_output_tokens=16, temperature=0
    )
    assert response.status in ("queued", "in_progress")
    deadline = time.monotonic() + 60
    while response.status in ("queued", "in_progress") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        response = await sdk.responses.retrieve(response.id)
    assert response.status in ("completed", "incomplete") and response.output_text.strip()
    resumed = [
        event async for event in await sdk.responses.retrieve(response.id, stream=True, starting_after=2)
    ]
    assert resumed[0].sequence_number == 3 and resumed[-1].type == f"response.{response.status}"
    long = await sdk.responses.create(
        model=model, input="Write a very long story about a dragon.", background=True, max_output_tokens=2000
    )
    while llama.busy_slots() == 0 and time.monotonic() < deadline:  # noqa: ASYNC110 (another process's state)
        await asyncio.sleep(0.02)
    assert llama.busy_slots() == 1, "the server is generating the long one"
    cancelled = await sdk.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    stop_by = time.monotonic() + 5
    while llama.busy_slots() and time.monotonic() < stop_by:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    assert llama.busy_slots() == 0, "the cancel stopped the server's generation"
