"""An upstream that refuses the context as too long, over real sockets: every provider's overflow
reaches the client as 400 ``context_length_exceeded`` (JSON, a stream refused before its first
event, the WebSocket envelope), and ``truncation: "auto"`` retries once, cut by the count the
upstream reported. The error bodies are the providers' own (llama.cpp's as llama-server answers)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.gemini import FakeGemini
from tests.fakes.openai_chat import FakeOpenAIChat
from tests.fakes.openai_chat import Reply as ChatReply
from tests.fakes.openai_responses import FakeOpenAIResponses
from tests.fakes.overflow import ANTHROPIC, GEMINI, LLAMA_CPP, OPENAI_CHAT, OPENAI_RESPONSES, VLLM
from tests.fakes.scripted import FakeUpstream, Reply
from tests.harness import ServedApp, serve_gateway
from tests.ws.helpers import assert_envelope, run_turn, ws_connect

# (model, the error body, the counts the gateway's message repeats)
SHAPES = [
    ("chat", LLAMA_CPP, "10030 tokens, 1024 allowed"),
    ("chat", OPENAI_CHAT, "130532 tokens, 128000 allowed"),
    ("chat", VLLM, "2900 tokens, 1948 allowed"),  # the window less the completion's 100
    ("responses", OPENAI_RESPONSES, None),
    ("anthropic", ANTHROPIC, "208310 tokens, 200000 allowed"),
    ("gemini", GEMINI, "1200000 tokens, 1048576 allowed"),
]
SHAPE_IDS = ["llama.cpp", "openai-chat", "vllm", "openai-responses", "anthropic", "gemini"]
Fakes = dict[str, FakeUpstream[Any]]


@pytest.fixture(scope="module")
async def fakes() -> AsyncIterator[Fakes]:
    async with (
        FakeOpenAIChat.serve() as chat,
        FakeOpenAIResponses.serve() as responses,
        FakeAnthropic.serve() as anthropic,
        FakeGemini.serve() as gemini,
    ):
        yield {"chat": chat, "responses": responses, "anthropic": anthropic, "gemini": gemini}


@pytest.fixture(scope="module")
def gw(fakes: Fakes) -> Iterator[ServedApp]:
    kinds = {
        "chat": "openai-chat",
        "responses": "openai-responses",
        "anthropic": "anthropic",
        "gemini": "gemini",
    }
    settings = {
        "providers": {
            name: {
                "kind": kind,
                "base_url": fakes[name].base_url,
                "api_key": "sk-up",
                "retry": {"attempts": 2},
            }
            for name, kind in kinds.items()
        },
        "models": {name: {"provider": name, "upstream_model": "up-model"} for name in kinds},
    }
    with serve_gateway(settings) as s:
        yield s


@pytest.fixture(autouse=True)
def fresh(fakes: Fakes) -> None:
    for fake in fakes.values():
        fake.reset()


def refusal(model: str, body: dict[str, Any]) -> Any:
    reply = ChatReply if model == "chat" else Reply
    return reply.error(400, body)


async def post(gw: ServedApp, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=20) as c:
        return await c.post("/v1/responses", json=body)


def conversation(turns: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for n in range(turns):
        items.append({"type": "message", "role": "user", "content": f"QUESTION-{n} " + "lorem ipsum " * 30})
        items.append({"type": "message", "role": "assistant", "content": f"ANSWER-{n} " + "dolor sit " * 30})
    items.append({"type": "message", "role": "user", "content": "NEWEST question"})
    return items


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("model", "body", "counts"), SHAPES, ids=SHAPE_IDS)
async def test_every_providers_overflow_is_context_length_exceeded(
    gw: ServedApp, fakes: Fakes, model: str, body: dict[str, Any], counts: str | None, stream: bool
) -> None:
    fakes[model].add(refusal(model, body))
    r = await post(gw, {"model": model, "input": "hi", "stream": stream})
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"  # refused before the stream began
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["type"] == "invalid_request_error"
    assert err["param"] == "input"
    if counts is not None:
        assert counts in err["message"]
    assert "try increasing it" not in err["message"] and "Please reduce" not in err["message"]
    assert len(fakes[model].requests) == 1  # not retried: the same request cannot fit


@pytest.mark.parametrize(("model", "body", "counts"), SHAPES, ids=SHAPE_IDS)
async def test_the_websocket_envelope_says_context_length_exceeded(
    gw: ServedApp, fakes: Fakes, model: str, body: dict[str, Any], counts: str | None
) -> None:
    fakes[model].add(refusal(model, body))
    async with ws_connect(gw) as ws:
        [msg] = await run_turn(ws, model=model, input="hi", store=False)
    assert_envelope(msg, 400, "context_length_exceeded", "input")


def llama_overflow(reported: int, n_ctx: int) -> ChatReply:
    """llama-server's refusal of a prompt of ``reported`` tokens in a slot of ``n_ctx``."""
    message = (
        f"request ({reported} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it"
    )
    error = {"code": 400, "message": message, "type": "exceed_context_size_error"}
    return ChatReply.error(400, {"error": {**error, "n_prompt_tokens": reported, "n_ctx": n_ctx}})


def user_texts(fake: FakeUpstream[Any], n: int) -> list[str]:
    return [m["content"] for m in fake.requests[n].body["messages"] if m["role"] == "user"]


@pytest.mark.parametrize("stream", [False, True])
async def test_truncation_auto_retries_once_cut_to_the_reported_count(
    gw: ServedApp, fakes: Fakes, stream: bool
) -> None:
    chat = fakes["chat"]
    # the upstream counts 4x what the gateway estimated (~1,000 tokens), in a window of 2,048
    chat.add(llama_overflow(4_000, 2_048), ChatReply.text("fitted answer"))
    body = {"model": "chat", "input": conversation(5), "truncation": "auto", "stream": stream}
    r = await post(gw, body)
    assert r.status_code == 200, r.text
    if stream:
        events = [orjson.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        assert events[0]["type"] == "response.created"
        assert sum(e["type"] == "response.created" for e in events) == 1
        assert events[-1]["type"] == "response.completed"
        resource = events[-1]["response"]
    else:
        resource = r.json()
    assert resource["output"][0]["content"][0]["text"] == "fitted answer"
    assert len(chat.requests) == 2  # exactly one retry
    first, second = user_texts(chat, 0), user_texts(chat, 1)
    assert len(first) == 6 and second[-1] == "NEWEST question"
    # a quarter of the estimate fits, less the margin: the oldest go, the newest stay
    assert 1 < len(second) < len(first) and not any("QUESTION-0" in t for t in second)
    assert "QUESTION-4" in second[-2]


async def test_truncation_auto_retries_only_once(gw: ServedApp, fakes: Fakes) -> None:
    chat = fakes["chat"]
    chat.add(llama_overflow(4_000, 2_048), llama_overflow(2_500, 2_048), ChatReply.text("never"))
    r = await post(gw, {"model": "chat", "input": conversation(5), "truncation": "auto"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "2500 tokens, 2048 allowed" in r.json()["error"]["message"]  # the second refusal's
    assert len(chat.requests) == 2
    # an overflow without a count (OpenAI's Responses API) gives nothing to cut by: no retry
    fakes["responses"].add(Reply.error(400, OPENAI_RESPONSES), Reply.text("never"))
    r = await post(gw, {"model": "responses", "input": conversation(5), "truncation": "auto"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert len(fakes["responses"].requests) == 1


async def test_truncation_disabled_passes_the_overflow_on_without_a_retry(
    gw: ServedApp, fakes: Fakes
) -> None:
    chat = fakes["chat"]
    chat.add(llama_overflow(4_000, 2_048), ChatReply.text("never"))
    r = await post(gw, {"model": "chat", "input": conversation(5)})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert len(chat.requests) == 1


async def test_truncation_auto_over_the_websocket_retries_before_any_event(
    gw: ServedApp, fakes: Fakes
) -> None:
    chat = fakes["chat"]
    chat.add(llama_overflow(4_000, 2_048), ChatReply.text("fitted answer"))
    async with ws_connect(gw) as ws:
        events = await run_turn(ws, model="chat", input=conversation(5), truncation="auto", store=False)
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.completed"
    assert len(chat.requests) == 2 and len(user_texts(chat, 1)) < len(user_texts(chat, 0))
