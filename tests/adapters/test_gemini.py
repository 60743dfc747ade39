"""The gemini adapter: request translation (pure, incl. JSON-schema conversion), stream
translation (pure, incl. streams shaped like the Gemini API reference's), and the adapter against
the fake on real sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from adapters.base import UpstreamRequest
from adapters.deltas import (
    Finish,
    ReasoningEncrypted,
    ReasoningSummaryDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
from adapters.gemini import GeminiAdapter
from adapters.gemini.request import build_body, build_contents, build_tools, model_path
from adapters.gemini.schema import to_gemini_schema
from adapters.gemini.stream import GeminiStreamTranslator
from adapters.streaming import merge_ready
from gateway.kernel.errors import UpstreamError, UpstreamRateLimited, UpstreamRejected
from gateway.kernel.settings import ProviderSettings
from tests.adapters.helpers import (
    assistant,
    call,
    collector,
    output,
    text_of,
    translator_run,
    user,
)
from tests.fakes.gemini import FakeGemini, Reply
from tests.helpers import fake_fixtures

SECRET = "AIza-SECRET-42"
MARKER = "RAW-BODY-MARKER"


def req(items: list[dict[str, Any]] | None = None, **kw: Any) -> UpstreamRequest:
    return UpstreamRequest(model="gemini-x", items=items if items is not None else [user("hi")], **kw)


def reasoning(signature: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "t"}],
        "encrypted_content": signature,
    }


PARAMS = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "city": {"type": "string", "description": "City", "minLength": 1},
        "unit": {"enum": ["c", "f"]},
        "days": {"type": ["integer", "null"], "format": "int32", "exclusiveMinimum": 0},
        "when": {"type": "string", "format": "uri"},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}},
        "mode": {"const": "fast"},
        "either": {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "null"}]},
        "nested": {"type": "object", "properties": {}, "additionalProperties": {"type": "string"}},
    },
    "required": ["city", "ghost"],
    "$defs": {"tag": {"type": "object", "properties": {"name": {"type": "string"}}, "strict": True}},
}
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather",
        "parameters": PARAMS,
        "strict": True,
    },
    {
        "type": "function",
        "name": "noargs",
        "description": None,
        "parameters": {"type": "object", "properties": {}},
    },
]


# == request translation =====================================================================
def test_schema_conversion() -> None:
    assert to_gemini_schema(PARAMS) == {
        "type": "OBJECT",
        "properties": {
            "city": {"type": "STRING", "description": "City", "minLength": 1},
            "unit": {"type": "STRING", "enum": ["c", "f"]},
            "days": {"type": "INTEGER", "nullable": True, "format": "int32"},
            "when": {"type": "STRING"},
            "tags": {
                "type": "ARRAY",
                "items": {"type": "OBJECT", "properties": {"name": {"type": "STRING"}}},
            },
            "mode": {"type": "STRING", "enum": ["fast"]},
            "either": {"nullable": True, "anyOf": [{"type": "STRING"}, {"type": "NUMBER"}]},
            "nested": {"type": "OBJECT"},
        },
        "required": ["city"],
    }


def test_tools_and_tool_config() -> None:
    tools, config = build_tools(req(tools=TOOLS))
    [decls] = tools
    assert [d["name"] for d in decls["functionDeclarations"]] == ["get_weather", "noargs"]
    assert "parameters" not in decls["functionDeclarations"][1]  # an OBJECT without properties is refused
    assert config is None
    assert build_tools(req(tools=TOOLS, tool_choice="none"))[1] == {"mode": "NONE"}
    assert build_tools(req(tools=TOOLS, tool_choice="required"))[1] == {"mode": "ANY"}
    forced = build_tools(req(tools=TOOLS, tool_choice={"type": "function", "name": "noargs"}))[1]
    assert forced == {"mode": "ANY", "allowedFunctionNames": ["noargs"]}
    allowed = {"type": "allowed_tools", "tools": [{"type": "function", "name": "noargs"}], "mode": "auto"}
    tools, config = build_tools(req(tools=TOOLS, tool_choice=allowed))
    assert [d["name"] for d in tools[0]["functionDeclarations"]] == ["noargs"] and config is None


def test_contents_roles_images_and_function_responses_by_name() -> None:
    items = [
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "sys"}]},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBO"},
                {"type": "input_image", "image_url": "https://x/cat.webp"},
            ],
        },
        assistant("Let me check."),
        call("call_a", "get_weather", '{"city":"Paris"}'),
        call("call_b", "noargs", ""),
        output("call_a", '{"temp": 20}'),
        output("call_b", "done"),
        user("thanks"),
    ]
    system, contents = build_contents(req(items, instructions="inst"))
    assert system == "inst\n\nsys"
    assert contents == [
        {
            "role": "user",
            "parts": [
                {"text": "look"},
                {"inlineData": {"mimeType": "image/png", "data": "iVBO"}},
                {"fileData": {"mimeType": "image/webp", "fileUri": "https://x/cat.webp"}},
            ],
        },
        {
            "role": "model",
            "parts": [
                {"text": "Let me check."},
                {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
                {"functionCall": {"name": "noargs", "args": {}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "get_weather", "response": {"temp": 20}}},
                {"functionResponse": {"name": "noargs", "response": {"output": "done"}}},
                {"text": "thanks"},
            ],
        },
    ]


def test_thought_signatures_go_back_on_the_part_they_came_with() -> None:
    items = [user("q"), reasoning("SIG1"), call("c1", "f"), call("c2", "f"), output("c1"), output("c2")]
    items += [assistant("done"), reasoning("SIG2"), user("more")]
    _, contents = build_contents(req(items))
    assert contents[1]["parts"][0] == {"functionCall": {"name": "f", "args": {}}, "thoughtSignature": "SIG1"}
    assert "thoughtSignature" not in contents[1]["parts"][1]
    assert contents[3] == {"role": "model", "parts": [{"text": "done", "thoughtSignature": "SIG2"}]}


def test_generation_config() -> None:
    fmt = {
        "type": "json_schema",
        "name": "x",
        "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
    }
    body = build_body(
        req(
            max_output_tokens=64,
            temperature=0.2,
            top_p=0.8,
            text_format=fmt,
            reasoning={"effort": "low", "summary": "auto"},
        )
    )
    assert body["generationConfig"] == {
        "maxOutputTokens": 64,
        "temperature": 0.2,
        "topP": 0.8,
        "responseMimeType": "application/json",
        "responseSchema": {"type": "OBJECT", "properties": {"a": {"type": "STRING"}}},
        "thinkingConfig": {"thinkingBudget": 1024, "includeThoughts": True},
    }
    assert "generationConfig" not in build_body(req())


def test_logprobs_asked_for_and_mapped() -> None:
    config = build_body(req(include=["message.output_text.logprobs"], top_logprobs=2))["generationConfig"]
    assert config == {"responseLogprobs": True, "logprobs": 2}
    chunk = {
        "candidates": [
            {
                "content": {"role": "model", "parts": [{"text": "Hi"}]},
                "logprobsResult": {
                    "chosenCandidates": [{"token": "Hi", "logProbability": -0.25}],
                    "topCandidates": [
                        {
                            "candidates": [
                                {"token": "Hi", "logProbability": -0.25},
                                {"token": "Yo", "logProbability": -2},
                            ]
                        }
                    ],
                },
            }
        ]
    }
    [delta] = GeminiStreamTranslator().feed(chunk)
    assert delta == TextDelta(
        "Hi",
        [
            {
                "token": "Hi",
                "logprob": -0.25,
                "bytes": [72, 105],
                "top_logprobs": [
                    {"token": "Hi", "logprob": -0.25, "bytes": [72, 105]},
                    {"token": "Yo", "logprob": -2.0, "bytes": [89, 111]},
                ],
            }
        ],
    )


def test_model_path() -> None:
    assert model_path("gemini-2.5-flash") == "models/gemini-2.5-flash"
    assert model_path("tunedModels/mine") == "tunedModels/mine"
    assert model_path("models/gemini-2.5-flash") == "models/gemini-2.5-flash"
    # one path segment, whatever the name holds
    assert model_path("../../v1/files") == "models/..%2F..%2Fv1%2Ffiles"
    assert model_path("x:streamGenerateContent?alt=sse#") == "models/x%3AstreamGenerateContent%3Falt%3Dsse%23"
    assert model_path("tunedModels/a/b") == "tunedModels/a%2Fb"


# == stream translation: chunks shaped like the API reference's ===================================
RECORDED_TEXT: list[dict[str, Any]] = [
    {
        "candidates": [{"content": {"parts": [{"text": "The"}], "role": "model"}, "index": 0}],
        "usageMetadata": {"promptTokenCount": 8, "totalTokenCount": 8},
        "modelVersion": "gemini-2.0-flash",
    },
    {
        "candidates": [
            {"content": {"parts": [{"text": " old lighthouse keeper"}], "role": "model"}, "index": 0}
        ],
        "usageMetadata": {"promptTokenCount": 8, "totalTokenCount": 8},
        "modelVersion": "gemini-2.0-flash",
    },
    {
        "candidates": [
            {
                "content": {"parts": [{"text": " smiled."}], "role": "model"},
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {
            "promptTokenCount": 8,
            "candidatesTokenCount": 22,
            "totalTokenCount": 30,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 8}],
        },
        "modelVersion": "gemini-2.0-flash",
    },
]
RECORDED_THINKING_CALLS: list[dict[str, Any]] = [
    {
        "candidates": [
            {"content": {"parts": [{"text": "**Planning**\n", "thought": True}], "role": "model"}, "index": 0}
        ]
    },
    {
        "candidates": [
            {
                "content": {
                    "parts": [
                        {
                            "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                            "thoughtSignature": "CiQB",
                        },
                        {"functionCall": {"name": "get_weather", "args": {"city": "Rome"}}},
                    ],
                    "role": "model",
                },
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {
            "promptTokenCount": 50,
            "candidatesTokenCount": 12,
            "thoughtsTokenCount": 58,
            "cachedContentTokenCount": 32,
            "totalTokenCount": 120,
        },
    },
]


translate = translator_run(GeminiStreamTranslator)


def test_recorded_text_stream() -> None:
    assert translate(RECORDED_TEXT) == [
        TextDelta("The"),
        TextDelta(" old lighthouse keeper"),
        TextDelta(" smiled."),
        Usage(8, 22),
        Finish("stop"),
    ]


def test_thoughts_signature_and_parallel_calls() -> None:
    assert translate(RECORDED_THINKING_CALLS) == [
        ReasoningSummaryDelta("**Planning**\n"),
        ReasoningEncrypted("CiQB"),
        ToolCallStart(0, "get_weather", None),
        ToolCallArgsDelta(0, '{"city":"Paris"}'),
        ToolCallStart(1, "get_weather", None),
        ToolCallArgsDelta(1, '{"city":"Rome"}'),
        Usage(50, 70, cached_tokens=32, reasoning_tokens=58),
        Finish("tool_calls"),
    ]


@pytest.mark.parametrize(
    ("reason", "finish"), [("MAX_TOKENS", "length"), ("SAFETY", "content_filter"), ("OTHER", "stop")]
)
def test_finish_reasons(reason: str, finish: str) -> None:
    chunk = {"candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": reason}]}
    assert translate([chunk])[-1] == Finish(finish)  # type: ignore[arg-type]


def test_blocked_prompt_and_malformed_call() -> None:
    assert translate([{"promptFeedback": {"blockReason": "SAFETY"}}]) == [Finish("content_filter")]
    with pytest.raises(UpstreamError) as info:
        translate([{"candidates": [{"finishReason": "MALFORMED_FUNCTION_CALL"}]}])
    assert info.value.code == "malformed_function_call"


@pytest.mark.parametrize(
    ("status", "cls", "retryable"),
    [
        ("RESOURCE_EXHAUSTED", UpstreamRateLimited, True),
        ("UNAVAILABLE", UpstreamError, True),
        ("INVALID_ARGUMENT", UpstreamRejected, False),
    ],
)
def test_in_stream_error(status: str, cls: type[UpstreamError], retryable: bool) -> None:
    with pytest.raises(UpstreamError) as info:
        GeminiStreamTranslator().feed({"error": {"code": 1, "message": MARKER, "status": status}})
    assert type(info.value) is cls and info.value.retryable is retryable
    # the provider's reason is passed on only for what a retry cannot fix
    assert (MARKER in repr(info.value.error_object())) is not retryable


def test_stream_without_finish_reason_raises() -> None:
    with pytest.raises(UpstreamError):
        translate(RECORDED_TEXT[:-1])


# == the adapter against the fake ===============================================================
fake_server, fake = fake_fixtures(FakeGemini)
collect = collector(req)


@pytest.fixture
async def adapter(fake: FakeGemini) -> AsyncIterator[GeminiAdapter]:
    a = GeminiAdapter(ProviderSettings(kind="gemini", base_url=fake.base_url, api_key=SECRET))
    yield a
    await a.aclose()


async def test_url_key_header_and_text(fake: FakeGemini, adapter: GeminiAdapter) -> None:
    out = await collect(adapter)
    assert text_of(out) == "Hello! You said: hi"
    [rec] = fake.requests
    assert rec.path == "/v1beta/models/gemini-x:streamGenerateContent" and rec.query == "alt=sse"
    assert rec.headers["x-goog-api-key"] == SECRET and "key=" not in rec.query


@pytest.mark.parametrize("split", [1, None])
async def test_recorded_streams_over_the_wire(
    fake: FakeGemini, adapter: GeminiAdapter, split: int | None
) -> None:
    for recorded in (RECORDED_TEXT, RECORDED_THINKING_CALLS):
        fake.add(Reply(events=[(None, c) for c in recorded], split=split))
        # the shell merges pieces that arrive in one read (adapters.streaming.merge_ready)
        assert merge_ready(await collect(adapter)) == merge_ready(translate(recorded))


async def test_parallel_calls_and_results_next_turn(fake: FakeGemini, adapter: GeminiAdapter) -> None:
    fake.add(
        Reply.tool_calls([("get_weather", '{"city":"Paris"}', None), ("noargs", "{}", None)], signature="S")
    )
    out = await collect(adapter, req(tools=TOOLS))
    starts = [d for d in out if isinstance(d, ToolCallStart)]
    assert [s.name for s in starts] == ["get_weather", "noargs"] and out[-1] == Finish("tool_calls")
    items = [
        user("hi"),
        reasoning("S"),
        call("call_1", "get_weather", '{"city":"Paris"}'),
        call("call_2", "noargs"),
        output("call_2", "b-done"),
        output("call_1", "a-done"),
    ]
    out = await collect(adapter, req(items, tools=TOOLS))
    assert text_of(out) == "The tool returned: a-done"
    sent = fake.requests[-1].body["contents"]
    assert sent[1]["parts"][0]["thoughtSignature"] == "S"
    assert [p["functionResponse"]["name"] for p in sent[2]["parts"]] == ["noargs", "get_weather"]


async def test_schema_the_fake_would_refuse_is_converted(fake: FakeGemini, adapter: GeminiAdapter) -> None:
    fmt = {"type": "json_schema", "name": "x", "schema": PARAMS}
    await collect(adapter, req(tools=TOOLS, text_format=fmt, tool_choice="none"))
    assert fake.requests[-1].body["toolConfig"] == {"functionCallingConfig": {"mode": "NONE"}}


async def test_max_tokens_is_incomplete(fake: FakeGemini, adapter: GeminiAdapter) -> None:
    out = await collect(adapter, req(max_output_tokens=2))
    assert text_of(out) == "Hello! You"
    assert out[-1] == Finish("length")


async def test_errors(fake: FakeGemini, adapter: GeminiAdapter) -> None:
    fake.add(Reply.error(429, headers={"retry-after": "3"}), Reply.text("part", stream_error="overloaded"))
    with pytest.raises(UpstreamRateLimited) as info:
        await collect(adapter)
    assert info.value.retry_after == 3.0
    with pytest.raises(UpstreamError) as info2:
        await collect(adapter)
    assert info2.value.retryable
