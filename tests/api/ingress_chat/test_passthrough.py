"""A Chat Completions request routed to an openai-chat upstream reaches it as the client sent it:
the body the fake upstream receives through the gateway equals the body it receives when the same
request is sent straight to it, field by field. Routed to another API, the fields it can express
are mapped (``stop``, ``seed``, ``max_completion_tokens``, ``user`` …)."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest

from tests.harness import ServedApp

IMAGE = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
    "AAAABJRU5ErkJggg=="
)
TOOL: Any = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        "strict": True,
    },
}
# every field of the API the upstream understands, and a vendor extension (vLLM's top_k)
EVERYTHING: dict[str, Any] = {
    "model": "openai-chat",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Answer in English."}]},
        {
            "role": "user",
            "name": "ada",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": IMAGE, "detail": "low"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q":"px"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a pixel"},
    ],
    "tools": [TOOL],
    "tool_choice": {"type": "function", "function": {"name": "lookup"}},
    "parallel_tool_calls": False,
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True},
    },
    "max_completion_tokens": 5,
    "temperature": 0.3,
    "top_p": 0.9,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "stop": ["\n\n", "END"],
    "seed": 42,
    "logprobs": True,
    "top_logprobs": 2,
    "logit_bias": {"50256": -100},
    "reasoning_effort": "low",
    "verbosity": "low",
    "user": "user-7",
    "safety_identifier": "safe-7",
    "prompt_cache_key": "pk-1",
    "metadata": {"team": "a"},
    "service_tier": "flex",
    "store": False,
    "n": 1,
    "top_k": 40,
}


async def _sent(fake: Any, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=20) as c:
        r = await c.post(url, json=body, headers={"authorization": "Bearer sk-up"})
    assert r.status_code == 200, r.text
    got: dict[str, Any] = fake.requests[-1].body
    return got


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_chat_upstream_gets_the_client_body(
    served: ServedApp, fakes: dict[str, Any], stream: bool
) -> None:
    fake = fakes["openai-chat"]
    body = copy.deepcopy(EVERYTHING)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    direct = await _sent(fake, fake.base_url + "/chat/completions", body)
    through = await _sent(fake, served.base_url + "/v1/chat/completions", body)
    assert direct == body  # (the fake records what it was sent)
    for field in body:
        assert through.get(field) == direct[field], field
    assert through == direct


async def test_upstream_model_is_the_routes(servers: dict[str, Any], fakes: dict[str, Any]) -> None:
    from tests.api.ingress_chat.conftest import settings_for
    from tests.harness import serve_gateway

    settings = settings_for(servers)
    settings["models"]["alias"] = {"provider": "openai-chat", "upstream_model": "real-model"}
    fake = fakes["openai-chat"]
    with serve_gateway(settings) as s:
        got = await _sent(fake, s.base_url + "/v1/chat/completions", {**EVERYTHING, "model": "alias"})
    assert got == {**EVERYTHING, "model": "real-model"}


def _plain(model: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_tokens": 50,
        "temperature": 0.3,
        "stop": ["END", "STOP"],
        "seed": 42,
        "user": "user-7",
        **extra,
    }


async def test_anthropic_upstream_gets_what_it_can_express(served: ServedApp, fakes: dict[str, Any]) -> None:
    fake = fakes["anthropic"]
    got = await _sent(
        fake,
        served.base_url + "/v1/chat/completions",
        _plain("anthropic", tools=[TOOL], tool_choice="required"),
    )
    assert got["model"] == "anthropic"
    assert [b["text"] for b in got["system"]] == ["Be brief."]
    assert [m["role"] for m in got["messages"]] == ["user"]
    assert got["max_tokens"] == 50
    assert got["temperature"] == 0.3
    assert got["stop_sequences"] == ["END", "STOP"]
    assert got["metadata"] == {"user_id": "user-7"}
    assert got["tools"][0]["name"] == "lookup"
    assert got["tools"][0]["input_schema"] == TOOL["function"]["parameters"]
    assert got["tool_choice"]["type"] == "any"
    assert "seed" not in got and "user" not in got


async def test_gemini_upstream_gets_what_it_can_express(served: ServedApp, fakes: dict[str, Any]) -> None:
    fake = fakes["gemini"]
    body = _plain("gemini", response_format={"type": "json_object"})
    got = await _sent(fake, served.base_url + "/v1/chat/completions", body)
    config = got["generationConfig"]
    assert config["maxOutputTokens"] == 50
    assert config["temperature"] == 0.3
    assert config["stopSequences"] == ["END", "STOP"]
    assert config["seed"] == 42
    assert config["responseMimeType"] == "application/json"
    assert got["systemInstruction"] == {"parts": [{"text": "Be brief."}]}


async def test_responses_upstream_gets_what_it_can_express(served: ServedApp, fakes: dict[str, Any]) -> None:
    fake = fakes["openai-responses"]
    body = _plain(
        "openai-responses",
        max_completion_tokens=40,
        reasoning_effort="low",
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}},
        logprobs=True,
        top_logprobs=3,
        tools=[TOOL],
        parallel_tool_calls=False,
    )
    got = await _sent(fake, served.base_url + "/v1/chat/completions", body)
    assert got["max_output_tokens"] == 40  # max_completion_tokens wins over max_tokens
    assert got["reasoning"]["effort"] == "low"
    assert got["text"]["format"]["type"] == "json_schema" and got["text"]["format"]["name"] == "a"
    assert got["top_logprobs"] == 3
    assert "message.output_text.logprobs" in got["include"]
    assert got["tools"][0]["name"] == "lookup" and got["tools"][0]["strict"] is True
    assert got["parallel_tool_calls"] is False
    assert got["safety_identifier"] == "user-7"
    assert got["store"] is False and "previous_response_id" not in got
    assert [m["role"] for m in got["input"] if m.get("type", "message") == "message"] == ["system", "user"]
