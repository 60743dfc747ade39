"""What the Chat Completions ingress answers: finish reasons (stop, length, tool_calls,
content_filter), usage with cached and reasoning tokens, logprobs, and errors in OpenAI's shape
that name the field (``param``), for bad input and for every limit (body, depth, elements,
``n``, keys and allow-lists, rate limits); its requests labelled ``api="chat"``."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.ingress_chat.conftest import settings_for
from tests.fakes.openai_chat import Reply as ChatReply
from tests.fakes.openai_chat import usage_chunk
from tests.fakes.scripted import Reply
from tests.harness import ServedApp, serve_gateway
from tests.helpers import sse_events

PATH = "/v1/chat/completions"
HI: Any = [{"role": "user", "content": "Hi"}]


async def post(s: ServedApp, body: Any, **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=s.base_url, timeout=20) as c:
        if isinstance(body, bytes):
            return await c.post(PATH, content=body, headers={"content-type": "application/json", **kw})
        return await c.post(PATH, json=body, headers=kw)


def openai_error(
    r: httpx.Response, status: int, param: str | None, code: str | None = None
) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    return dict(err)


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "mock"}, "messages", "missing_required_parameter"),
        ({"model": "mock", "messages": []}, "messages", "invalid_value"),
        ({"messages": HI}, "model", "missing_required_parameter"),
        ({"model": "mock", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", None),
        (
            {
                "model": "mock",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            },
            "messages[0].content[0].image_url.url",
            "missing_required_parameter",
        ),
        (
            {"model": "mock", "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
            "messages[0].content[0].text",
            None,
        ),
        (
            {
                "model": "mock",
                "messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "r"}],
            },
            "messages[1].tool_call_id",
            "missing_required_parameter",
        ),
        (
            {
                "model": "mock",
                "messages": [
                    {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ],
            },
            "messages[0].content[0].type",
            "invalid_value",
        ),
        (
            {
                "model": "mock",
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}],
                    }
                ],
            },
            "messages[0].content[0].type",
            "invalid_value",
        ),
        ({"model": "mock", "messages": HI, "temperature": 3}, "temperature", "invalid_value"),
        ({"model": "mock", "messages": HI, "stream": "yes"}, "stream", "invalid_value"),
        ({"model": "mock", "messages": HI, "n": 2}, "n", "unsupported_parameter"),
        ({"model": "mock", "messages": HI, "stop": ["a", "b", "c", "d", "e"]}, "stop", None),
        (
            {"model": "mock", "messages": HI, "tool_choice": {"type": "function", "function": {}}},
            "tool_choice.function.name",
            None,
        ),
        (
            {"model": "mock", "messages": HI, "response_format": {"type": "json_schema", "json_schema": {}}},
            "response_format.json_schema.name",
            None,
        ),
        (
            {
                "model": "mock",
                "messages": HI,
                "tools": [{"type": "function", "function": {"name": "bad name"}}],
            },
            "tools[0].function.name",
            None,
        ),
        ({"model": "nope", "messages": HI}, "model", "model_not_found"),
    ],
)
async def test_bad_requests_name_the_field(
    served: ServedApp, body: dict[str, Any], param: str, code: str | None
) -> None:
    openai_error(await post(served, body), 400, param, code)


async def test_invalid_json_and_non_object(served: ServedApp) -> None:
    openai_error(await post(served, b"{nope"), 400, None, "invalid_json")
    openai_error(await post(served, b"[1]"), 400, None, "invalid_json")


async def test_openai_sdk_raises_bad_request_with_the_param(served: ServedApp) -> None:
    client = openai.AsyncOpenAI(base_url=served.base_url + "/v1", api_key="sk-none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="mock", messages=HI, n=3)
    assert info.value.param == "n"


async def test_only_post(served: ServedApp) -> None:
    async with httpx.AsyncClient(base_url=served.base_url) as c:
        r = await c.get(PATH)
    assert r.status_code == 405 and r.headers["allow"] == "POST"


# -- finish reasons, usage, logprobs ------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("model", "finish", "expected"),
    [
        ("openai-chat", "length", "length"),
        ("openai-chat", "content_filter", "content_filter"),
        ("anthropic", "length", "length"),
        ("anthropic", "content_filter", "content_filter"),
        ("gemini", "length", "length"),
        ("openai-responses", "length", "length"),
    ],
)
async def test_finish_reasons(
    served: ServedApp, fakes: dict[str, Any], stream: bool, model: str, finish: str, expected: str
) -> None:
    fake = fakes[model]
    fake.add(
        ChatReply.text("Cut short", finish=finish)
        if model == "openai-chat"
        else Reply.text("Cut short", finish=finish)
    )
    body: dict[str, Any] = {"model": model, "messages": HI, "max_tokens": 20}
    if stream:
        body["stream"] = True
        r = await post(served, body)
        chunks = sse_events(r.text)
        reasons = [
            c["choices"][0]["finish_reason"]
            for c in chunks
            if c["choices"] and c["choices"][0]["finish_reason"]
        ]
        assert reasons == [expected]
    else:
        r = await post(served, body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == expected


@pytest.mark.parametrize("stream", [False, True])
async def test_usage_has_cached_and_reasoning_tokens(
    served: ServedApp, fakes: dict[str, Any], stream: bool
) -> None:
    reply = ChatReply.text("Hello!", usage=None, reasoning="Thinking.")
    reply.chunks.append(usage_chunk(100, 30, cached=64, reasoning=12))
    fakes["openai-chat"].add(reply)
    body: dict[str, Any] = {"model": "openai-chat", "messages": HI}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    r = await post(served, body)
    assert r.status_code == 200, r.text
    if stream:
        chunks = sse_events(r.text)
        usage = chunks[-1]["usage"]
        assert chunks[-1]["choices"] == []
        reasoning = "".join(
            c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks if c["choices"]
        )
    else:
        usage = r.json()["usage"]
        reasoning = "Thinking."  # (the fake's unstreamed answer has no reasoning)
    assert usage == {
        "prompt_tokens": 100,
        "completion_tokens": 30,
        "total_tokens": 130,
        "prompt_tokens_details": {"cached_tokens": 64},
        "completion_tokens_details": {"reasoning_tokens": 12},
    }
    assert reasoning == "Thinking."


async def test_anthropic_cache_reads_are_cached_tokens(served: ServedApp, fakes: dict[str, Any]) -> None:
    fakes["anthropic"].add(Reply.text("Hi", usage=(50, 5), cached=40))
    r = await post(served, {"model": "anthropic", "messages": HI})
    usage = r.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 40


@pytest.mark.parametrize("stream", [False, True])
async def test_logprobs(served: ServedApp, fakes: dict[str, Any], stream: bool) -> None:
    body: dict[str, Any] = {
        "model": "openai-chat",
        "messages": HI,
        "logprobs": True,
        "top_logprobs": 2,
        "stream": stream,
    }
    r = await post(served, body)
    assert r.status_code == 200, r.text
    if stream:
        entries = [
            e
            for c in sse_events(r.text)
            if c["choices"] and c["choices"][0]["logprobs"]
            for e in c["choices"][0]["logprobs"]["content"]
        ]
    else:
        entries = r.json()["choices"][0]["logprobs"]["content"]
    assert entries and all(len(e["top_logprobs"]) == 2 for e in entries)
    assert entries[0]["logprob"] == -0.5


async def test_upstream_failure_mid_stream_is_an_openai_error(
    served: ServedApp, fakes: dict[str, Any]
) -> None:
    fakes["anthropic"].add(Reply.text("Partial", stream_error="overloaded"))
    client = openai.AsyncOpenAI(base_url=served.base_url + "/v1", api_key="sk-none", max_retries=0)
    stream = await client.chat.completions.create(model="anthropic", messages=HI, stream=True)
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass


async def test_upstream_refusal_before_the_stream_is_its_status(
    served: ServedApp, fakes: dict[str, Any]
) -> None:
    fakes["openai-chat"].add(ChatReply.error(429))
    r = await post(served, {"model": "openai-chat", "messages": HI, "stream": True})
    assert r.status_code == 429
    assert r.json()["error"]["type"]


# -- limits, keys, allow-lists, metrics ---------------------------------------------------------
async def test_limits_and_tenancy_apply(servers: dict[str, Any], fakes: dict[str, Any]) -> None:
    settings = settings_for(
        servers,
        limits={"max_body_bytes": 4096, "max_json_depth": 8, "max_input_elements": 10},
        auth={
            "api_keys": [
                {"key": "sk-a", "tenant": "a", "models": ["mock"]},
                {"key": "sk-r", "tenant": "r", "limits": {"requests_per_minute": 1}},
                {"key": "sk-n", "tenant": "n"},
            ]
        },
        tenants={"n": {"retention": "none"}},
    )
    ok = {"model": "mock", "messages": HI}
    with serve_gateway(settings) as s:
        openai_error(await post(s, ok), 401, None)
        openai_error(await post(s, ok, authorization="Bearer sk-wrong"), 401, None)
        assert (await post(s, ok, authorization="Bearer sk-a")).status_code == 200
        refused = await post(s, {**ok, "model": "openai-chat"}, authorization="Bearer sk-a")
        assert refused.status_code in (400, 403, 404) and refused.json()["error"]["param"] == "model"
        big = {**ok, "messages": [{"role": "user", "content": "x" * 5000}]}
        openai_error(await post(s, big, authorization="Bearer sk-a"), 413, None)
        deep: Any = {"a": 1}
        for _ in range(10):
            deep = {"d": deep}
        openai_error(
            await post(s, {**ok, "guided_json": deep}, authorization="Bearer sk-a"),
            400,
            "guided_json",
            "nesting_too_deep",
        )
        many = {**ok, "messages": HI * 11}
        openai_error(
            await post(s, many, authorization="Bearer sk-a"), 400, "messages", "too_many_input_items"
        )
        assert (await post(s, ok, authorization="Bearer sk-r")).status_code == 200
        limited = await post(s, ok, authorization="Bearer sk-r")
        openai_error(limited, 429, None)
        assert "retry-after" in limited.headers and "x-ratelimit-limit-requests" in limited.headers
        assert (
            await post(s, ok, authorization="Bearer sk-n")
        ).status_code == 200  # stateless: retention none is fine


async def test_requests_are_labelled_chat(served: ServedApp) -> None:
    assert (await post(served, {"model": "mock", "messages": HI})).status_code == 200
    async with httpx.AsyncClient(base_url=served.base_url) as c:
        text = (await c.get("/metrics")).text
    samples = [
        sample
        for fam in text_string_to_metric_families(text)
        for sample in fam.samples
        if sample.name == "gateway_requests_total" and sample.labels.get("api") == "chat"
    ]
    assert samples and sum(s.value for s in samples) >= 1
