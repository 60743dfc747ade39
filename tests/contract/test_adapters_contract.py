"""One contract over every adapter: the same Open Responses scenarios through the real gateway
(uvicorn on loopback) in front of each provider's fake upstream, with the same assertions on the
events. The built-in ``mock`` model takes part where it can (it cannot be scripted); scripted
replies are chosen to equal what the mock would say, so the assertions stay identical.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from tests.fakes import anthropic, gemini, openai_chat, openai_responses
from tests.harness import ServedApp, serve_gateway

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a location",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string", "description": "City"}},
        "required": ["location"],
    },
}
TOOL2 = {
    "type": "function",
    "name": "get_time",
    "description": "Get the local time",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
}
PNG = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


# -- how to read each provider's recorded requests ------------------------------------------------
def _chat_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def _responses_results(body: dict[str, Any]) -> list[str]:
    return [i["output"] for i in body["input"] if i.get("type") == "function_call_output"]


def _anthropic_results(body: dict[str, Any]) -> list[str]:
    return [
        b.get("content", "")
        for m in body["messages"]
        if m["role"] == "user"
        for b in m["content"]
        if b["type"] == "tool_result"
    ]


def _gemini_results(body: dict[str, Any]) -> list[str]:
    return [
        p["functionResponse"]["response"].get("output")
        for c in body["contents"]
        for p in c["parts"]
        if "functionResponse" in p
    ]


def _chat_images(body: dict[str, Any]) -> list[str]:
    return [
        p["image_url"]["url"]
        for m in body["messages"]
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if p["type"] == "image_url"
    ]


def _responses_images(body: dict[str, Any]) -> list[str]:
    return [
        p["image_url"]
        for i in body["input"]
        if i.get("type") == "message"
        for p in i["content"]
        if p["type"] == "input_image"
    ]


def _anthropic_images(body: dict[str, Any]) -> list[str]:
    out = []
    for m in body["messages"]:
        for b in m["content"]:
            if b["type"] == "image":
                s = b["source"]
                out.append(
                    f"data:{s['media_type']};base64,{s['data']}" if s["type"] == "base64" else s["url"]
                )
    return out


def _gemini_images(body: dict[str, Any]) -> list[str]:
    out = []
    for c in body["contents"]:
        for p in c["parts"]:
            if "inlineData" in p:
                out.append(f"data:{p['inlineData']['mimeType']};base64,{p['inlineData']['data']}")
            elif "fileData" in p:
                out.append(p["fileData"]["fileUri"])
    return out


def _responses_state(body: dict[str, Any]) -> list[str]:
    return [i["encrypted_content"] for i in body["input"] if i.get("type") == "reasoning"]


def _anthropic_state(body: dict[str, Any]) -> list[str]:
    return [b["signature"] for m in body["messages"] for b in m["content"] if b["type"] == "thinking"]


def _gemini_state(body: dict[str, Any]) -> list[str]:
    return [p["thoughtSignature"] for c in body["contents"] for p in c["parts"] if "thoughtSignature" in p]


@dataclass(frozen=True)
class Driver:
    """One adapter under contract: its provider kind, fake upstream and request readers."""

    kind: str
    fake: Any = None  # the fake's class; None for the mock (no upstream)
    reply: Any = None  # the fake's Reply class
    preamble: int = 0  # stream events the fake sends before the first text delta
    results: Callable[[dict[str, Any]], list[Any]] | None = None
    images: Callable[[dict[str, Any]], list[str]] | None = None
    state: Callable[[dict[str, Any]], list[str]] | None = None  # reasoning state sent back upstream

    def __str__(self) -> str:
        return self.kind


DRIVERS = [
    Driver("mock"),
    Driver("openai-chat", openai_chat.FakeOpenAIChat, openai_chat.Reply, 1, _chat_results, _chat_images),
    Driver(
        "openai-responses",
        openai_responses.FakeOpenAIResponses,
        openai_responses.Reply,
        4,
        _responses_results,
        _responses_images,
        _responses_state,
    ),
    Driver(
        "anthropic",
        anthropic.FakeAnthropic,
        anthropic.Reply,
        2,
        _anthropic_results,
        _anthropic_images,
        _anthropic_state,
    ),
    Driver("gemini", gemini.FakeGemini, gemini.Reply, 0, _gemini_results, _gemini_images, _gemini_state),
]
RETRY = {"attempts": 2, "backoff_base": 0.01, "backoff_max": 0.02, "retry_after_cap": 0.5}


@dataclass
class Env:
    driver: Driver
    fake: Any
    gateway: ServedApp

    def add(self, *replies: Any) -> None:
        if self.fake is not None:
            self.fake.add(*replies)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.fake.requests] if self.fake is not None else []


def gateway_settings(driver: Driver, base_url: str | None) -> dict[str, Any]:
    if driver.fake is None:
        return {"auto_providers": False, "models": {"m": {"provider": "mock", "upstream_model": "mock"}}}
    provider = {"kind": driver.kind, "base_url": base_url, "api_key": "sk-upstream", "retry": RETRY}
    return {
        "auto_providers": False,
        "providers": {"up": provider},
        "models": {"m": {"provider": "up", "upstream_model": "up-model"}},
    }


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each scenario runs over the adapters it applies to: all of them, those behind a scriptable
    fake upstream (``@pytest.mark.scripted``), or those with opaque reasoning state
    (``@pytest.mark.reasoning_state``). Nothing is skipped."""
    if "env_server" not in metafunc.fixturenames:
        return
    drivers = DRIVERS
    if metafunc.definition.get_closest_marker("scripted"):
        drivers = [d for d in DRIVERS if d.fake is not None]
    if metafunc.definition.get_closest_marker("reasoning_state"):
        drivers = [d for d in DRIVERS if d.fake is not None and d.state is not None]
    metafunc.parametrize("env_server", drivers, ids=str, indirect=True, scope="module")


@pytest.fixture(scope="module")
async def env_server(request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    driver: Driver = request.param
    if driver.fake is None:
        with serve_gateway(gateway_settings(driver, None)) as gw:
            yield Env(driver, None, gw)
        return
    async with driver.fake.serve() as fake:
        with serve_gateway(gateway_settings(driver, fake.base_url)) as gw:
            yield Env(driver, fake, gw)


@pytest.fixture
async def env(env_server: Env) -> Env:
    if env_server.fake is not None:
        env_server.fake.reset()
    return env_server


# -- client helpers ------------------------------------------------------------------------------
async def create(env: Env, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=env.gateway.base_url, timeout=30) as client:
        return await client.post("/v1/responses", json={"model": "m", **body})


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    frames = [f for f in raw.decode().split("\n\n") if f]
    assert frames[-1] == "data: [DONE]"
    events = []
    for frame in frames[:-1]:
        name, data = frame.split("\n")
        event = orjson.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        events.append(event)
    return events


def check_stream(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The invariants every stream keeps; returns the terminal response."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    terminal = events[-1]
    assert terminal["type"] in ("response.completed", "response.incomplete", "response.failed")
    for n, e in enumerate(events):
        if e["type"] == "error":
            assert events[n + 1]["type"] == "response.failed"
    open_items: dict[int, str] = {}
    texts: dict[tuple[int, int], str] = {}
    args: dict[int, str] = {}
    for e in events[2:-1]:
        t = e["type"]
        if t == "response.output_item.added":
            assert e["output_index"] not in open_items
            open_items[e["output_index"]] = e["item"]["id"]
        elif t == "response.output_item.done":
            assert open_items.pop(e["output_index"]) == e["item"]["id"]
        elif t == "response.output_text.delta":
            assert e["item_id"] == open_items[e["output_index"]]
            key = (e["output_index"], e["content_index"])
            texts[key] = texts.get(key, "") + e["delta"]
        elif t == "response.output_text.done":
            assert texts.get((e["output_index"], e["content_index"]), "") == e["text"]
        elif t == "response.function_call_arguments.delta":
            args[e["output_index"]] = args.get(e["output_index"], "") + e["delta"]
        elif t == "response.function_call_arguments.done":
            assert args.get(e["output_index"], "") == e["arguments"]
    final = terminal["response"]
    if final["status"] == "failed":
        return final  # items cut short are left as they were (incomplete)
    assert not open_items
    for oi, text in texts.items():
        assert final["output"][oi[0]]["content"][oi[1]]["text"] == text
    return final


def output_text(resource: dict[str, Any]) -> str:
    return "".join(
        p.get("text", "")
        for item in resource["output"]
        if item["type"] == "message"
        for p in item["content"]
        if p["type"] == "output_text"
    )


def calls_of(resource: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for i in resource["output"] if i["type"] == "function_call"]


# == scenarios ====================================================================================
async def test_text(env: Env) -> None:
    env.add(env.driver.reply and env.driver.reply.text("Hello! You said: Say hi", pieces=4))
    r = await create(env, {"input": "Say hi", "instructions": "Be kind.", "store": False})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "completed" and body["model"] == "m"
    assert output_text(body) == "Hello! You said: Say hi"
    assert body["usage"]["total_tokens"] == body["usage"]["input_tokens"] + body["usage"]["output_tokens"] > 0
    if env.fake is not None:
        assert len(env.fake.requests) == 1
        raw = env.fake.requests[0].raw.decode()
        assert "Be kind." in raw and "up-model" in raw + env.fake.requests[0].path


@pytest.mark.parametrize("split", [1, 5])
async def test_streaming_with_awkward_chunk_boundaries(env: Env, split: int) -> None:
    text = "Hello! You said: héllo 世界 🎉"
    env.add(env.driver.reply and env.driver.reply.text(text, pieces=7, split=split))
    r = await create(env, {"input": "héllo 世界 🎉", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.content)
    final = check_stream(events)
    assert final["status"] == "completed" and output_text(final) == text
    # pieces read together may go out as one delta (adapters.streaming.merge_ready)
    assert sum(e["type"] == "response.output_text.delta" for e in events) >= 1


async def test_single_tool_call_and_its_result_next_turn(env: Env) -> None:
    Reply = env.driver.reply
    env.add(Reply and Reply.tool_calls([("get_weather", '{"location":"example"}', "call_w1")]))
    r = await create(env, {"input": "Weather in Paris?", "tools": [TOOL], "stream": True})
    first = check_stream(sse_events(r.content))
    assert first["status"] == "completed"
    [call] = calls_of(first)
    assert call["name"] == "get_weather" and orjson.loads(call["arguments"]) == {"location": "example"}
    assert call["call_id"] and call["status"] == "completed"

    env.add(Reply and Reply.text("The tool returned: sunny"))
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    r = await create(env, {"previous_response_id": first["id"], "input": [result], "tools": [TOOL]})
    second = r.json()
    assert second["status"] == "completed", r.text
    assert output_text(second) == "The tool returned: sunny"
    if env.driver.results is not None:
        assert env.driver.results(env.bodies[-1]) == ["sunny"]


@pytest.mark.scripted
async def test_parallel_tool_calls_and_their_results(env: Env) -> None:
    Reply = env.driver.reply
    env.add(
        Reply.tool_calls(
            [("get_weather", '{"location":"Paris"}', "c_1"), ("get_time", '{"zone":"CET"}', "c_2")]
        )
    )
    r = await create(env, {"input": "Weather and time?", "tools": [TOOL, TOOL2]})
    first = r.json()
    calls = calls_of(first)
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert len({c["call_id"] for c in calls}) == 2 and len({c["id"] for c in calls}) == 2
    assert [orjson.loads(c["arguments"]) for c in calls] == [{"location": "Paris"}, {"zone": "CET"}]

    env.add(Reply.text("Sunny at noon."))
    outputs = [
        {"type": "function_call_output", "call_id": calls[1]["call_id"], "output": "12:00"},
        {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "sunny"},
    ]
    r = await create(env, {"previous_response_id": first["id"], "input": outputs, "tools": [TOOL, TOOL2]})
    assert r.json()["status"] == "completed" and output_text(r.json()) == "Sunny at noon."
    assert sorted(env.driver.results(env.bodies[-1])) == ["12:00", "sunny"]  # type: ignore[misc]


async def test_image_input(env: Env) -> None:
    env.add(env.driver.reply and env.driver.reply.text("Hello! You said: What is this?"))
    content = [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": PNG},
        {"type": "input_image", "image_url": "https://example.com/cat.png", "detail": "low"},
    ]
    r = await create(env, {"input": [{"type": "message", "role": "user", "content": content}]})
    assert r.json()["status"] == "completed" and output_text(r.json()) == "Hello! You said: What is this?"
    if env.driver.images is not None:
        assert env.driver.images(env.bodies[-1]) == [PNG, "https://example.com/cat.png"]


@pytest.mark.reasoning_state
async def test_reasoning_round_trip(env: Env) -> None:
    Reply = env.driver.reply
    state = env.driver.state
    assert state is not None  # a driver of the reasoning_state scenarios reads it
    env.add(Reply.text("Forty-two.", reasoning="Let me think.", signature="SIG-abc"))
    reasoning = {"effort": "low", "summary": "auto"}
    r = await create(env, {"input": "Why?", "reasoning": reasoning, "stream": True})
    first = check_stream(sse_events(r.content))
    [item] = [i for i in first["output"] if i["type"] == "reasoning"]
    assert item["summary"] == [{"type": "summary_text", "text": "Let me think."}]
    assert "SIG-abc" in item["encrypted_content"]
    assert output_text(first) == "Forty-two."

    # stateful: the chain carries it
    env.add(Reply.text("Sure."), Reply.text("Sure."))
    r = await create(env, {"previous_response_id": first["id"], "input": "And?", "reasoning": reasoning})
    assert r.json()["status"] == "completed"
    assert state(env.bodies[-1]) == ["SIG-abc"]
    # stateless: the client sends the reasoning item back itself
    history = [{"type": "message", "role": "user", "content": "Why?"}, item]
    history.append({"type": "message", "role": "assistant", "content": "Forty-two."})
    r = await create(
        env, {"input": [*history, {"type": "message", "role": "user", "content": "And?"}], "store": False}
    )
    assert r.json()["status"] == "completed", r.text
    assert state(env.bodies[-1]) == ["SIG-abc"]


async def test_max_output_tokens_makes_the_response_incomplete(env: Env) -> None:
    story = "Tell me a long story about a lighthouse keeper and the sea, please."
    cut = f"Hello! You said: {story}"[:64]  # what the mock says in 16 pieces of 4 characters
    env.add(env.driver.reply and env.driver.reply.text(cut, finish="length"))
    r = await create(env, {"input": story, "max_output_tokens": 16, "stream": True})
    events = sse_events(r.content)
    final = check_stream(events)
    assert events[-1]["type"] == "response.incomplete"
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert output_text(final) == cut and final["output"][-1]["status"] == "incomplete"
    if env.fake is not None:
        assert "16" in orjson.dumps(env.bodies[-1]).decode()  # the limit went upstream


@pytest.mark.scripted
@pytest.mark.parametrize(
    ("status", "client_status", "code"), [(429, 429, "rate_limit_exceeded"), (500, 502, "upstream_error")]
)
async def test_retryable_upstream_errors_are_retried_then_fail(
    env: Env, status: int, client_status: int, code: str
) -> None:
    Reply = env.driver.reply
    env.add(*(Reply.error(status) for _ in range(3)))
    for stream in (False, True):
        r = await create(env, {"input": "hi", "stream": stream})
        assert r.status_code == client_status
        error = r.json()["error"]
        assert error["code"] == code and set(error) == {"type", "code", "message", "param"}
        assert "127.0.0.1" not in error["message"] and "sk-upstream" not in r.text
        if not stream:
            assert len(env.fake.requests) == 3  # the try and two retries
            env.add(*(Reply.error(status) for _ in range(3)))


@pytest.mark.scripted
async def test_invalid_request_upstream_is_a_400_and_not_retried(env: Env) -> None:
    env.add(env.driver.reply.error(400))
    r = await create(env, {"input": "hi"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert len(env.fake.requests) == 1


@pytest.mark.scripted
async def test_mid_stream_disconnect_fails_the_response(env: Env) -> None:
    cut = env.driver.preamble + 2
    env.add(env.driver.reply.text("Hello there, this will be cut short.", pieces=8, disconnect_after=cut))
    r = await create(env, {"input": "hi", "stream": True})
    events = sse_events(r.content)
    final = check_stream(events)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert any(e["type"] == "response.output_text.delta" for e in events)
    assert final["status"] == "failed" and final["error"]["code"]
    assert len(env.fake.requests) == 1  # output was emitted: no retry


@pytest.mark.scripted
async def test_client_going_away_closes_the_upstream(env: Env) -> None:
    env.add(env.driver.reply.text("x " * 200, pieces=200, chunk_delay=0.02, split=None))
    async with httpx.AsyncClient(base_url=env.gateway.base_url, timeout=30) as client:
        async with client.stream(
            "POST", "/v1/responses", json={"model": "m", "input": "hi", "stream": True}
        ) as r:
            async for chunk in r.aiter_bytes():
                if b"response.output_text.delta" in chunk:
                    break
    async with asyncio.timeout(10):
        await env.fake.disconnected.wait()
