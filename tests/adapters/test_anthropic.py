"""The anthropic adapter: request translation (pure), stream translation (pure, incl. streams
recorded from the Messages API reference), and the adapter against the fake on real sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from adapters.anthropic import AnthropicAdapter
from adapters.anthropic.request import build_body, build_messages, build_tools, thinking_budget
from adapters.anthropic.stream import MessagesStreamTranslator
from adapters.base import UpstreamRequest
from adapters.deltas import (
    Delta,
    Finish,
    ItemDone,
    ReasoningEncrypted,
    ReasoningSummaryDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
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
from tests.fakes.anthropic import FakeAnthropic, Reply
from tests.helpers import fake_fixtures

SECRET = "sk-ant-SECRET-42"
MARKER = "RAW-BODY-MARKER"


def req(items: list[dict[str, Any]] | None = None, **kw: Any) -> UpstreamRequest:
    return UpstreamRequest(model="claude-x", items=items if items is not None else [user("hi")], **kw)


TOOLS = [
    {"type": "function", "name": "a", "description": "A", "parameters": {"type": "object", "properties": {}}},
    {"type": "function", "name": "b", "description": None, "parameters": None, "strict": True},
]


# == request translation =====================================================================
def test_system_developer_and_instructions_go_to_system() -> None:
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
        user("hello"),
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "late"}]},
    ]
    system, messages = build_messages(req(items, instructions="inst"))
    assert system == "inst\n\ndev\n\nlate"
    assert messages == [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]


def test_images_data_url_and_http_url_and_documents() -> None:
    item = {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBO", "detail": "auto"},
            {"type": "input_image", "image_url": "https://x/cat.jpg"},
            {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBE"},
            {"type": "input_file", "file_url": "https://x/doc.pdf"},
        ],
    }
    _, [msg] = build_messages(req([item]))
    assert msg["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
        {"type": "image", "source": {"type": "url", "url": "https://x/cat.jpg"}},
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"},
            "title": "a.pdf",
        },
        {"type": "document", "source": {"type": "url", "url": "https://x/doc.pdf"}},
    ]


def test_bad_image_is_rejected() -> None:
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_image", "image_url": "file:///etc"}],
    }
    with pytest.raises(UpstreamRejected):
        build_messages(req([item]))


def test_tool_use_and_tool_result_turns_merged() -> None:
    items = [
        user("weather?"),
        assistant("Checking."),
        call("toolu_1", "a", '{"city":"Paris"}'),
        call("toolu_2", "b", ""),
        output("toolu_1", "sunny"),
        output("toolu_2", [{"type": "input_text", "text": "rain"}]),
        user("thanks"),
        user("and?"),
    ]
    _, messages = build_messages(req(items))
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "a", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_2", "name": "b", "input": {}},
    ]
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "rain"}]},
        {"type": "text", "text": "thanks"},
        {"type": "text", "text": "and?"},
    ]


def test_tool_results_come_first_in_a_merged_user_turn() -> None:
    items = [user("q"), call("t1"), user("extra"), output("t1")]
    _, messages = build_messages(req(items))
    assert [b["type"] for b in messages[2]["content"]] == ["tool_result", "text"]


def test_empty_assistant_text_is_dropped_and_phase_accepted() -> None:
    items = [assistant("", phase="commentary"), assistant("four", phase="final_answer"), user("again")]
    _, messages = build_messages(req(items))
    assert messages[1] == {"role": "assistant", "content": [{"type": "text", "text": "four"}]}


def test_an_assistant_first_history_gets_a_minimal_opening_user_turn() -> None:
    # Open Responses allows a history that opens with the assistant; the Messages API does not.
    _, messages = build_messages(req([assistant("Hi, I am your guide."), user("where to?")]))
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[0]["content"] == [{"type": "text", "text": "."}]
    _, messages = build_messages(req([user("q"), assistant("a")]))
    assert [m["role"] for m in messages] == ["user", "assistant"]  # nothing added otherwise


def test_reasoning_with_signature_becomes_thinking_and_unsigned_is_dropped() -> None:
    signed = {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "hmm"}],
        "encrypted_content": "SIG",
    }
    redacted = {"type": "reasoning", "summary": [], "encrypted_content": "redacted_thinking:DATA"}
    unsigned = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "lost"}]}
    items = [user("q"), signed, redacted, unsigned, call("t1"), output("t1")]
    _, messages = build_messages(req(items))
    assert messages[1]["content"] == [
        {"type": "thinking", "thinking": "hmm", "signature": "SIG"},
        {"type": "redacted_thinking", "data": "DATA"},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", None),
        ("required", {"type": "any"}),
        ("none", {"type": "none"}),
        ({"type": "function", "name": "a"}, {"type": "tool", "name": "a"}),
    ],
)
def test_tool_choice(choice: Any, expected: Any) -> None:
    tools, tc = build_tools(req(tools=TOOLS, tool_choice=choice))
    assert tc == expected
    assert tools == [
        {"name": "a", "input_schema": {"type": "object", "properties": {}}, "description": "A"},
        {"name": "b", "input_schema": {"type": "object", "properties": {}}},
    ]


@pytest.mark.parametrize(
    ("mode", "expected"), [("auto", None), ("required", {"type": "any"}), ("none", {"type": "none"})]
)
def test_allowed_tools_sends_only_the_subset(mode: str, expected: Any) -> None:
    choice = {"type": "allowed_tools", "tools": [{"type": "function", "name": "b"}], "mode": mode}
    tools, tc = build_tools(req(tools=TOOLS, tool_choice=choice))
    assert [t["name"] for t in tools] == ["b"] and tc == expected


def test_parallel_tool_calls_false() -> None:
    _, tc = build_tools(req(tools=TOOLS, parallel_tool_calls=False))
    assert tc == {"type": "auto", "disable_parallel_tool_use": True}


def test_body_limits_sampling_and_defaults() -> None:
    body = build_body(req(temperature=0.3, top_p=0.9, safety_identifier="u1"), default_max_tokens=1234)
    assert body["max_tokens"] == 1234 and body["stream"] is True
    assert body["temperature"] == 0.3 and "top_p" not in body  # newer models refuse both
    assert body["metadata"] == {"user_id": "u1"}
    body = build_body(req(max_output_tokens=50, top_p=0.5), default_max_tokens=1234)
    assert body["max_tokens"] == 50 and body["top_p"] == 0.5 and "tools" not in body


def test_thinking_budget_and_its_constraints() -> None:
    assert thinking_budget(None, 4096) is None
    assert thinking_budget({"effort": "low"}, 4096) == 2048
    assert thinking_budget({"effort": "high"}, 4096) == 4095
    assert thinking_budget({"effort": "high"}, 1000) is None  # below the API minimum
    body = build_body(
        req(reasoning={"effort": "medium"}, temperature=0.2, tools=TOOLS, tool_choice="required"),
        default_max_tokens=16000,
    )
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 8192}
    assert "temperature" not in body and "tool_choice" not in body  # only auto works with thinking


def test_cache_breakpoints_skip_thinking_and_stay_within_four() -> None:
    signed = {"type": "reasoning", "summary": [], "encrypted_content": "SIG"}
    items = [user("q"), signed, call("t1"), output("t1")]  # the tool turn answered: the newest turn
    caching: dict[str, Any] = {"default_max_tokens": 8000, "caching": True}
    body = build_body(req(items, instructions="sys", tools=TOOLS, reasoning={"effort": "low"}), **caching)
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in body["tools"][0]
    assert body["system"] == [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}]
    # the turn before the newest (thinking, then the call): its last block
    prior = body["messages"][-2]["content"]
    assert [b["type"] for b in prior] == ["thinking", "tool_use"]
    marks = [b for m in body["messages"] for b in m["content"] if "cache_control" in b]
    assert len(marks) == 1 and marks[0] is body["messages"][-2]["content"][-1]
    # an assistant turn of thinking alone is not marked (the API refuses it)
    only = build_body(req([user("q"), signed, user("again")]), **caching)
    assert not any("cache_control" in b for m in only["messages"] for b in m["content"])
    # off: the body as before
    plain = build_body(req(items, instructions="sys", tools=TOOLS), default_max_tokens=8000)
    assert plain["system"] == "sys" and "cache_control" not in str(plain)


def test_thinking_is_off_when_the_tool_turn_lost_its_thinking_block() -> None:
    items = [user("q"), call("t1"), output("t1")]
    assert "thinking" not in build_body(req(items, reasoning={"effort": "low"}), default_max_tokens=8000)
    signed = {"type": "reasoning", "summary": [], "encrypted_content": "SIG"}
    body = build_body(
        req([user("q"), signed, call("t1"), output("t1")], reasoning={"effort": "low"}),
        default_max_tokens=8000,
    )
    assert body["thinking"]["type"] == "enabled"


def test_json_format_is_asked_for_in_system() -> None:
    fmt = {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": True}
    body = build_body(req(instructions="be nice", text_format=fmt), default_max_tokens=10)
    system = body["system"]
    assert isinstance(system, str) and system.startswith("be nice\n\n") and '{"type":"object"}' in system


# == stream translation: recorded streams (Messages API reference, "Streaming Messages") =======
RECORDED_TEXT: list[dict[str, Any]] = [
    {
        "type": "message_start",
        "message": {
            "id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "claude-opus-4-6",
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 25, "output_tokens": 1},
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "ping"},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 15},
    },
    {"type": "message_stop"},
]
RECORDED_TOOL: list[dict[str, Any]] = [
    {
        "type": "message_start",
        "message": {
            "id": "msg_014p7gG3wDgGV9EUtLvnow3U",
            "type": "message",
            "role": "assistant",
            "model": "claude-opus-4-6",
            "stop_sequence": None,
            "usage": {"input_tokens": 472, "output_tokens": 2},
            "content": [],
            "stop_reason": None,
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "ping"},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Okay"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ", let's check"}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "content_block_start",
        "index": 1,
        "content_block": {
            "type": "tool_use",
            "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
            "name": "get_weather",
            "input": {},
        },
    },
    {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}},
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '{"location":'},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": ' "San Francisco, CA"}'},
    },
    {"type": "content_block_stop", "index": 1},
    {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"output_tokens": 89},
    },
    {"type": "message_stop"},
]
RECORDED_THINKING: list[dict[str, Any]] = [
    {
        "type": "message_start",
        "message": {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "claude-sonnet-4-5",
            "usage": {"input_tokens": 30, "cache_read_input_tokens": 200, "cache_creation_input_tokens": 10},
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
    {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "thinking_delta", "thinking": "1071 = 2 × 462 + 147"},
    },
    {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9G"},
    },
    {"type": "content_block_stop", "index": 0},
    {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "redacted_thinking", "data": "EmwKAhgB"},
    },
    {"type": "content_block_stop", "index": 1},
    {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "The GCD is 21."}},
    {"type": "content_block_stop", "index": 2},
    {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 120}},
    {"type": "message_stop"},
]


translate = translator_run(MessagesStreamTranslator)


def test_recorded_text_stream() -> None:
    assert translate(RECORDED_TEXT) == [TextDelta("Hello"), TextDelta("!"), Usage(25, 15), Finish("stop")]


def test_recorded_tool_use_stream() -> None:
    assert translate(RECORDED_TOOL) == [
        TextDelta("Okay"),
        TextDelta(", let's check"),
        ToolCallStart(1, "get_weather", "toolu_01T1x1fJ34qAmk2tNTrN7Up6"),
        ToolCallArgsDelta(1, '{"location":'),
        ToolCallArgsDelta(1, ' "San Francisco, CA"}'),
        Usage(472, 89),
        Finish("tool_calls"),
    ]


def test_recorded_thinking_stream_with_cache_usage_and_max_tokens() -> None:
    assert translate(RECORDED_THINKING) == [
        ReasoningSummaryDelta("1071 = 2 × 462 + 147"),
        ReasoningEncrypted("EqQBCgIYAhIM1gbcDa9G"),
        ItemDone(),
        ReasoningEncrypted("redacted_thinking:EmwKAhgB"),
        ItemDone(),
        TextDelta("The GCD is 21."),
        Usage(240, 120, cached_tokens=200, cache_write_tokens=10),
        Finish("length"),
    ]


def test_tool_without_parameters_gets_empty_object() -> None:
    events: list[dict[str, Any]] = [
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "t", "name": "n", "input": {}},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
        {"type": "message_stop"},
    ]
    assert translate(events) == [ToolCallStart(0, "n", "t"), ToolCallArgsDelta(0, "{}"), Finish("tool_calls")]


@pytest.mark.parametrize(
    ("kind", "cls", "retryable"),
    [
        ("overloaded_error", UpstreamError, True),
        ("api_error", UpstreamError, True),
        ("rate_limit_error", UpstreamRateLimited, True),
        ("invalid_request_error", UpstreamRejected, False),
    ],
)
def test_error_event(kind: str, cls: type[UpstreamError], retryable: bool) -> None:
    t = MessagesStreamTranslator()
    with pytest.raises(UpstreamError) as info:
        t.feed({"type": "error", "error": {"type": kind, "message": MARKER}})
    assert type(info.value) is cls and info.value.retryable is retryable
    # the provider's reason is passed on only for what a retry cannot fix
    assert (MARKER in repr(info.value.error_object())) is not retryable


def test_stream_without_message_stop_raises() -> None:
    with pytest.raises(UpstreamError):
        translate(RECORDED_TEXT[:-1])


# == the adapter against the fake on real sockets ===============================================
fake_server, fake = fake_fixtures(FakeAnthropic)
collect = collector(req)


@pytest.fixture
async def adapter(fake: FakeAnthropic) -> AsyncIterator[AnthropicAdapter]:
    a = AnthropicAdapter(
        ProviderSettings(kind="anthropic", base_url=fake.base_url, api_key=SECRET, default_max_tokens=321)
    )
    yield a
    await a.aclose()


async def test_an_unstreamed_request_gets_one_message(fake: FakeAnthropic, adapter: AnthropicAdapter) -> None:
    fake.add(
        Reply(reasoning="think", signature="sig", answer="Hello there", calls=[("f", '{"a":1}', "toolu_1")])
    )
    out = await collect(adapter, req(stream=False))
    [rec] = fake.requests
    assert "stream" not in rec.body and rec.headers["accept"] == "application/json"
    assert text_of(out) == "Hello there"
    assert ReasoningEncrypted("sig") in out and ToolCallArgsDelta(2, '{"a":1}') in out
    assert out[-1] == Finish("tool_calls")


def test_whole_message_replays_its_blocks() -> None:
    message = {
        "type": "message",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s1"},
            {"type": "text", "text": "Hi"},
            {"type": "tool_use", "id": "toolu_9", "name": "g", "input": {}},
        ],
        "stop_reason": "max_tokens",
        "usage": {"input_tokens": 3, "cache_read_input_tokens": 2, "output_tokens": 5},
    }
    out = MessagesStreamTranslator().unstreamed_deltas(message)
    assert out == [
        ReasoningSummaryDelta("hmm"),
        ReasoningEncrypted("s1"),
        ItemDone(),
        TextDelta("Hi"),
        ToolCallStart(2, "g", "toolu_9"),
        ToolCallArgsDelta(2, "{}"),
        Usage(input_tokens=5, output_tokens=5, cached_tokens=2, cache_write_tokens=0),
        Finish("length"),
    ]
    with pytest.raises(UpstreamError):
        MessagesStreamTranslator().unstreamed_deltas({"type": "error", "error": {"type": "overloaded_error"}})


async def test_headers_path_and_body(fake: FakeAnthropic, adapter: AnthropicAdapter) -> None:
    out = await collect(adapter, req(instructions="sys"))
    assert text_of(out) == "Hello! You said: hi"
    [rec] = fake.requests
    assert rec.path == "/v1/messages"
    assert rec.headers["x-api-key"] == SECRET and rec.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in rec.headers
    assert rec.body["max_tokens"] == 321 and rec.body["stream"] is True
    # prompt_caching: auto (the default) marks the system prompt as a cache breakpoint
    assert rec.body["system"] == [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}]


@pytest.mark.parametrize("split", [1, 3, None])
async def test_recorded_streams_replayed_over_the_wire(
    fake: FakeAnthropic, adapter: AnthropicAdapter, split: int | None
) -> None:
    for recorded in (RECORDED_TEXT, RECORDED_TOOL, RECORDED_THINKING):
        fake.add(Reply(events=[(e["type"], e) for e in recorded], split=split, line_ending="\r\n"))
        # the shell merges pieces that arrive in one read (adapters.streaming.merge_ready)
        assert merge_ready(await collect(adapter)) == merge_ready(translate(recorded))


async def test_thinking_round_trip_through_the_fake(fake: FakeAnthropic, adapter: AnthropicAdapter) -> None:
    fake.add(Reply.tool_calls([("a", '{"x":1}', "toolu_9")], reasoning="hmm, weather", signature="SIG-1"))
    out = await collect(adapter, req(tools=TOOLS, reasoning={"effort": "low"}))
    summary = "".join(d.text for d in out if isinstance(d, ReasoningSummaryDelta))
    [sig] = [d.content for d in out if isinstance(d, ReasoningEncrypted)]
    reasoning = {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": summary}],
        "encrypted_content": sig,
    }
    items = [user("hi"), reasoning, call("toolu_9", "a", '{"x":1}'), output("toolu_9", "sunny")]
    out = await collect(adapter, req(items, tools=TOOLS, reasoning={"effort": "low"}))
    assert text_of(out) == "The tool returned: sunny"
    sent = fake.requests[-1].body["messages"]
    assert sent[1]["content"][0] == {"type": "thinking", "thinking": "hmm, weather", "signature": "SIG-1"}
    assert sent[2]["content"][0] == {"type": "tool_result", "tool_use_id": "toolu_9", "content": "sunny"}


async def test_overloaded_529_is_retryable(fake: FakeAnthropic, adapter: AnthropicAdapter) -> None:
    body = {"type": "error", "error": {"type": "overloaded_error", "message": f"{MARKER} {SECRET}"}}
    fake.add(Reply.error(529, body))
    with pytest.raises(UpstreamError) as info:
        await collect(adapter)
    assert info.value.retryable and info.value.upstream_status == 529
    assert MARKER not in repr(info.value.error_object()) and SECRET not in repr(info.value.error_object())


async def test_in_stream_overloaded_error(fake: FakeAnthropic, adapter: AnthropicAdapter) -> None:
    fake.add(Reply.text("partial", stream_error="overloaded"))
    got: list[Delta] = []
    with pytest.raises(UpstreamError) as info:
        async for d in adapter.stream(req()):
            got.append(d)
    assert info.value.retryable and text_of(got) == "partial"


async def test_fake_rejects_what_the_api_rejects(fake: FakeAnthropic, adapter: AnthropicAdapter) -> None:
    # A transcript whose tool_use is never answered: the fake refuses it as the API does (400).
    with pytest.raises(UpstreamRejected):
        await collect(adapter, req([user("q"), call("t1"), user("no result")]))
