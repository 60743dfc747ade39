"""What the response echoes is what each upstream was sent (its sampling, its ``top_logprobs``), and
Anthropic's prompt caching: the gateway's breakpoints, ``cached_tokens`` rising along a
``previous_response_id`` chain, and ``prompt_caching: off``. The gateway in front of the fakes of
every adapter (real HTTP servers on loopback speaking each provider's wire format)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from gateway.kernel.settings import ProviderSettings, Settings
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.gemini import FakeGemini
from tests.fakes.openai_chat import FakeOpenAIChat, smart_reply
from tests.fakes.openai_responses import FakeOpenAIResponses
from tests.fakes.scripted import Recorded
from tests.harness import ServedApp, serve_gateway

KINDS: dict[str, Any] = {
    "openai-chat": FakeOpenAIChat,
    "openai-responses": FakeOpenAIResponses,
    "anthropic": FakeAnthropic,
    "gemini": FakeGemini,
}

EPHEMERAL = {"type": "ephemeral"}
# long enough for the cache's prefixes to weigh (the real API caches 1024 tokens and more)
INSTRUCTIONS = "You are a careful assistant. " * 40
TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
    {"type": "function", "name": "spell", "parameters": {"type": "object", "properties": {}}},
]


@pytest.fixture(scope="module")
async def servers() -> AsyncIterator[dict[str, Any]]:
    """One fake of each kind, served for the module."""
    async with contextlib.AsyncExitStack() as stack:
        yield {kind: await stack.enter_async_context(cls.serve()) for kind, cls in KINDS.items()}


@pytest.fixture
def fakes(servers: dict[str, Any]) -> dict[str, Any]:
    for fake in servers.values():
        fake.reset()
    servers["openai-chat"].responder = smart_reply
    return servers


@pytest.fixture
def anthropic(fakes: dict[str, Any]) -> FakeAnthropic:
    fake: FakeAnthropic = fakes["anthropic"]
    return fake


@pytest.fixture
def responses(fakes: dict[str, Any]) -> FakeOpenAIResponses:
    fake: FakeOpenAIResponses = fakes["openai-responses"]
    return fake


@pytest.fixture(scope="module")
def served(servers: dict[str, Any]) -> Iterator[ServedApp]:
    def provider(kind: str, **extra: Any) -> dict[str, Any]:
        url = servers[kind].base_url
        return {"kind": kind, "base_url": url, "api_key": "sk-up", "retry": {"attempts": 0}, **extra}

    settings = {
        "providers": {
            "chat": provider("openai-chat"),
            "responses": provider("openai-responses"),
            # as Anthropic's own API (api.anthropic.com): its defaults are the resource's
            "anthropic": provider("anthropic", send_default_sampling=False),
            "anthropic-uncached": provider("anthropic", prompt_caching="off", send_default_sampling=False),
            # another server speaking Messages (llama.cpp, vLLM): the default for any other host
            "anthropic-compatible": provider("anthropic"),
            "gemini": provider("gemini"),
            "chat-openai-defaults": provider("openai-chat", send_default_sampling=False),
            "responses-openai-defaults": provider("openai-responses", send_default_sampling=False),
        },
        "models": {
            "openai-chat": {"provider": "chat", "upstream_model": "m"},
            "openai-responses": {"provider": "responses", "upstream_model": "m"},
            "anthropic": {"provider": "anthropic", "upstream_model": "claude-x"},
            "anthropic-uncached": {"provider": "anthropic-uncached", "upstream_model": "claude-x"},
            "anthropic-compatible": {"provider": "anthropic-compatible", "upstream_model": "claude-x"},
            "gemini": {"provider": "gemini", "upstream_model": "gemini-x"},
            "openai-chat-openai-defaults": {"provider": "chat-openai-defaults", "upstream_model": "m"},
            "openai-responses-openai-defaults": {
                "provider": "responses-openai-defaults",
                "upstream_model": "m",
            },
        },
    }
    with serve_gateway(settings) as s:
        yield s


async def post(s: ServedApp, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=s.base_url, timeout=20) as c:
        r = await c.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def sent_sampling(kind: str, rec: Recorded) -> dict[str, Any]:
    """The temperature and top_p the upstream received (absent: not sent)."""
    body = rec.body
    if kind == "gemini":
        config = body.get("generationConfig") or {}
        return {k: config[g] for k, g in (("temperature", "temperature"), ("top_p", "topP")) if g in config}
    return {k: body[k] for k in ("temperature", "top_p") if k in body}


# == the echo is what was applied ================================================================
# What each upstream receives when the client sends no sampling: the resource states the spec's
# 1.0 / 1.0, which OpenAI-compatible servers (llama-server: 0.8 / 0.95, on both its Chat Completions
# and Responses routes) and Gemini (topP 0.95) do not default to, so it is sent; OpenAI's own API
# (``send_default_sampling`` false, its default for api.openai.com) and Messages default to 1.0 / 1.0.
DEFAULTS_SENT: dict[str, dict[str, float]] = {
    "openai-chat": {"temperature": 1.0, "top_p": 1.0},
    "gemini": {"temperature": 1.0, "top_p": 1.0},
    "openai-responses": {"temperature": 1.0, "top_p": 1.0},
    "anthropic": {},
    "anthropic-compatible": {"temperature": 1.0, "top_p": 1.0},
    "openai-chat-openai-defaults": {},
    "openai-responses-openai-defaults": {},
}
_FAKE_OF = {
    "openai-chat-openai-defaults": "openai-chat",
    "openai-responses-openai-defaults": "openai-responses",
    "anthropic-compatible": "anthropic",
}


@pytest.mark.parametrize("kind", list(DEFAULTS_SENT))
@pytest.mark.parametrize("asked", [{}, {"temperature": 1.0}])
async def test_default_sampling_is_sent_where_the_upstream_defaults_otherwise(
    served: ServedApp, fakes: dict[str, Any], kind: str, asked: dict[str, Any]
) -> None:
    res = await post(served, {"model": kind, "input": "hi", **asked})
    assert (res["temperature"], res["top_p"]) == (1.0, 1.0)
    fake_kind = _FAKE_OF.get(kind, kind)
    [rec] = fakes[fake_kind].requests
    assert sent_sampling(fake_kind, rec) == DEFAULTS_SENT[kind]


@pytest.mark.parametrize(
    ("provider", "sends"),
    [
        ({"kind": "openai-chat"}, False),  # OpenAI's own API by default
        ({"kind": "openai-responses"}, False),
        ({"kind": "openai-chat", "base_url": "https://my-org.openai.azure.com/openai/v1"}, False),
        ({"kind": "openai-chat", "base_url": "http://127.0.0.1:8080/v1"}, True),  # llama.cpp, vLLM, ...
        (
            {
                "kind": "openai-responses",
                "base_url": "https://api.openai.com/v1",
                "send_default_sampling": True,
            },
            True,
        ),
        ({"kind": "openai-chat", "base_url": "http://vllm:8000/v1", "send_default_sampling": False}, False),
        ({"kind": "anthropic"}, False),  # api.anthropic.com
        ({"kind": "anthropic", "base_url": "http://127.0.0.1:8080"}, True),
    ],
)
def test_default_sampling_is_sent_except_to_openai_itself(provider: dict[str, Any], sends: bool) -> None:
    assert ProviderSettings(**provider).sends_default_sampling() is sends


@pytest.mark.parametrize(
    ("asked", "sent", "echoed"),
    [
        # newer Claude models refuse both: temperature is sent, top_p is not, and not echoed
        ({"temperature": 0.3, "top_p": 0.9}, {"temperature": 0.3}, (0.3, 1.0)),
        ({"temperature": 1.0, "top_p": 0.5}, {"top_p": 0.5}, (1.0, 0.5)),  # 1.0 is the API's default
        ({"temperature": 1.7}, {}, (1.0, 1.0)),  # Messages' range is 0..1: its default, 1.0
        # extended thinking takes the default sampling only
        ({"temperature": 0.2, "reasoning": {"effort": "low"}}, {}, (1.0, 1.0)),
    ],
)
async def test_anthropic_echoes_the_sampling_it_sent(
    served: ServedApp,
    anthropic: FakeAnthropic,
    asked: dict[str, Any],
    sent: dict[str, Any],
    echoed: tuple[float, float],
) -> None:
    res = await post(served, {"model": "anthropic", "input": "hi", "max_output_tokens": 4000, **asked})
    [rec] = anthropic.requests
    assert sent_sampling("anthropic", rec) == sent
    assert (res["temperature"], res["top_p"]) == echoed


async def test_top_logprobs_is_echoed_only_where_logprobs_come_back(
    served: ServedApp, anthropic: FakeAnthropic, responses: FakeOpenAIResponses
) -> None:
    res = await post(served, {"model": "anthropic", "input": "hi", "top_logprobs": 3})
    assert res["top_logprobs"] == 0  # Messages returns none
    assert not res["output"][0]["content"][0].get("logprobs")
    res = await post(served, {"model": "openai-responses", "input": "hi", "top_logprobs": 3})
    assert res["top_logprobs"] == 3
    [rec] = responses.requests
    # OpenAI returns logprobs only when the include asks for them
    assert rec.body["top_logprobs"] == 3 and "message.output_text.logprobs" in rec.body["include"]


# == Anthropic prompt caching =====================================================================
def marked(body: dict[str, Any]) -> list[str]:
    """Where the request's cache_control breakpoints are."""
    out = [f"tools.{n}" for n, t in enumerate(body.get("tools") or []) if "cache_control" in t]
    system = body.get("system")
    if isinstance(system, list):
        out += [f"system.{n}" for n, b in enumerate(system) if "cache_control" in b]
    for m, msg in enumerate(body["messages"]):
        out += [f"messages.{m}.{n}" for n, b in enumerate(msg["content"]) if "cache_control" in b]
    return out


async def chain(served: ServedApp, model: str, turns: list[str], **body: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    previous = None
    for text in turns:
        res = await post(served, {"model": model, "input": text, "previous_response_id": previous, **body})
        out.append(res)
        previous = res["id"]
    return out


async def test_breakpoints_mark_tools_system_and_the_previous_turn(
    served: ServedApp, anthropic: FakeAnthropic
) -> None:
    first = await post(served, {"model": "anthropic", "input": "look up heliotrope", "tools": TOOLS})
    call = first["output"][-1]
    assert call["type"] == "function_call"
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "a flower"}
    body = {"model": "anthropic", "previous_response_id": first["id"], "tools": TOOLS}
    await post(served, {**body, "input": [output], "instructions": INSTRUCTIONS})
    one, two = (r.body for r in anthropic.requests)
    assert marked(one) == ["tools.1"]  # no system prompt, no earlier turn
    assert one["tools"][1]["cache_control"] == EPHEMERAL
    # the tool turn: the tools, the system prompt, and the assistant's tool_use before the result
    assert marked(two) == ["tools.1", "system.0", "messages.1.0"]
    assert two["system"] == [{"type": "text", "text": INSTRUCTIONS, "cache_control": EPHEMERAL}]
    assert two["messages"][1]["content"][0]["type"] == "tool_use"
    assert len(marked(two)) <= 4


async def test_cached_tokens_rise_along_a_chain(served: ServedApp, anthropic: FakeAnthropic) -> None:
    questions = ["first question", "second question", "third question"]
    turns = await chain(served, "anthropic", questions, instructions=INSTRUCTIONS)
    cached = [r["usage"]["input_tokens_details"]["cached_tokens"] for r in turns]
    assert cached[0] == 0 and 0 < cached[1] < cached[2]
    for res, rec in zip(turns, anthropic.requests, strict=True):
        n = len(rec.body["messages"])  # the last breakpoint: the end of the turn before the newest
        assert marked(rec.body) == ["system.0"] + ([f"messages.{n - 2}.0"] if n > 1 else [])
        # input_tokens count every input token, the cached ones too (the Responses API's meaning)
        assert res["usage"]["input_tokens"] > res["usage"]["input_tokens_details"]["cached_tokens"]


async def test_prompt_caching_off_sends_no_breakpoint(served: ServedApp, anthropic: FakeAnthropic) -> None:
    turns = await chain(
        served,
        "anthropic-uncached",
        ["first question", "second question", "third question"],
        instructions=INSTRUCTIONS,
        tools=TOOLS,
        tool_choice="none",
    )
    assert [r["usage"]["input_tokens_details"]["cached_tokens"] for r in turns] == [0, 0, 0]
    assert all(marked(rec.body) == [] for rec in anthropic.requests)
    assert all(isinstance(rec.body["system"], str) for rec in anthropic.requests)


def test_prompt_caching_is_auto_or_off() -> None:
    settings = Settings(providers={"a": {"kind": "anthropic"}})
    assert settings.providers["a"].prompt_caching == "auto"
    with pytest.raises(ValidationError, match="prompt_caching"):
        Settings(providers={"a": {"kind": "anthropic", "prompt_caching": "always"}})
