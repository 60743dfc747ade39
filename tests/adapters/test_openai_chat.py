"""The openai-chat adapter: request translation (pure), stream translation (pure), and the whole
adapter against a fake OpenAI-compatible upstream over real loopback sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from adapters.base import UpstreamRequest
from adapters.deltas import (
    Delta,
    Finish,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
from adapters.openai_chat import OpenAIChatAdapter
from adapters.openai_chat.request import build_body, build_messages, build_tools
from adapters.openai_chat.stream import ChatStreamTranslator
from gateway.kernel.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamRejected,
    UpstreamTimeout,
)
from gateway.kernel.settings import ProviderSettings, Timeouts
from tests.adapters.helpers import assistant, call, collector, output, text_of, user
from tests.fakes.openai_chat import FakeOpenAIChat, Reply, usage_chunk
from tests.fakes.server import unused_port
from tests.helpers import fake_fixtures

SECRET = "sk-test-SECRET-42"
MARKER = "RAW-BODY-MARKER"


def req(items: list[dict[str, Any]] | None = None, **kw: Any) -> UpstreamRequest:
    if items is None:
        items = [user("hi")]
    return UpstreamRequest(model="m", items=items, **kw)


REASONING = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}]}
TOOL = {"type": "function", "name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}


# == request translation =====================================================================
def test_instructions_and_system_developer() -> None:
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
        {
            "type": "message",
            "role": "system",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        user("hello", "world"),
    ]
    assert build_messages(req(items, instructions="You are nice.")) == [
        {"role": "system", "content": "You are nice."},
        {"role": "system", "content": "be brief"},
        {"role": "system", "content": "a\nb"},
        {"role": "user", "content": "hello\nworld"},
    ]


@pytest.mark.parametrize("kind", ["input_text", "output_text", "text", "summary_text", "reasoning_text"])
@pytest.mark.parametrize(
    ("role", "sent"),
    [
        ("user", "user"),
        ("assistant", "assistant"),
        ("system", "system"),
        ("developer", "system"),
        (None, "user"),
    ],
)
def test_one_text_part_is_a_plain_string(kind: str, role: str | None, sent: str) -> None:
    """A one-part message (the replayed history's usual one, converted by a fast path) is the
    string content the general path makes of the same part followed by an ignored one."""
    item: dict[str, Any] = {"type": "message", "role": role, "content": [{"type": kind, "text": "x y"}]}
    assert build_messages(req([item])) == [{"role": sent, "content": "x y"}]
    if role in ("assistant", "system", "developer"):  # whose general path skips an unknown part
        two = {**item, "content": [{"type": kind, "text": "x y"}, {"type": "other"}]}
        assert build_messages(req([two])) == [{"role": sent, "content": "x y"}]
    empty = {**item, "content": [{"type": kind, "text": None}]}
    assert build_messages(req([empty])) == [{"role": sent, "content": ""}]
    with pytest.raises(UpstreamRejected):  # a lone part chat cannot take still fails
        build_messages(req([{**item, "role": "user", "content": [{"type": "input_audio"}]}]))


def test_user_images_and_files() -> None:
    item = {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "https://img/x.png", "detail": "high"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAA"},
            {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVB"},
        ],
    }
    assert build_messages(req([item])) == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "https://img/x.png", "detail": "high"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}},
                {
                    "type": "file",
                    "file": {"file_data": "data:application/pdf;base64,JVB", "filename": "a.pdf"},
                },
            ],
        }
    ]


def test_file_url_is_rejected() -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_file", "file_url": "https://f"}]}
    with pytest.raises(UpstreamRejected):
        build_messages(req([item]))


def test_assistant_text_and_refusal_joined() -> None:
    item = {
        "type": "message",
        "role": "assistant",
        "phase": "final_answer",
        "content": [
            {"type": "output_text", "text": "one", "annotations": []},
            {"type": "refusal", "refusal": "no"},
        ],
    }
    assert build_messages(req([item])) == [{"role": "assistant", "content": "one\nno"}]


def test_function_calls_merge_into_preceding_assistant_message() -> None:
    items = [
        user("q"),
        REASONING,
        assistant("let me check"),
        REASONING,
        call("c1", "a", '{"x":1}'),
        call("c2", "b", ""),
        output("c1", "r1"),
        output("c2", "r2"),
        assistant("done"),
    ]
    assert build_messages(req(items)) == [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "let me check",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "a", "arguments": '{"x":1}'}},
                {"id": "c2", "type": "function", "function": {"name": "b", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
        {"role": "assistant", "content": "done"},
    ]


def test_function_calls_without_assistant_text_and_separate_turns() -> None:
    items = [user("q"), call("c1"), output("c1"), call("c2"), call("c3"), output("c2"), output("c3")]
    msgs = build_messages(req(items))
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant", "tool", "tool"]
    assert msgs[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    assert [c["id"] for c in msgs[3]["tool_calls"]] == ["c2", "c3"]


def test_calls_after_user_message_do_not_merge_into_earlier_assistant() -> None:
    msgs = build_messages(req([assistant("hi"), user("go"), call("c1")]))
    assert msgs[0] == {"role": "assistant", "content": "hi"}
    assert msgs[2]["tool_calls"][0]["id"] == "c1" and msgs[2]["content"] is None


def test_tool_output_list_and_images() -> None:
    img = {"type": "input_image", "image_url": "https://img/p.png", "detail": "low"}
    items = [
        call("c1"),
        call("c2"),
        output("c1", [{"type": "input_text", "text": "a"}, img, {"type": "input_text", "text": "b"}]),
        output("c2", "plain"),
        user("next"),
    ]
    msgs = build_messages(req(items))
    assert msgs[1:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "a\nb"},
        {"role": "tool", "tool_call_id": "c2", "content": "plain"},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "https://img/p.png", "detail": "low"}}],
        },
        {"role": "user", "content": "next"},
    ]


def test_reasoning_items_dropped() -> None:
    assert build_messages(req([REASONING, user("x"), REASONING])) == [{"role": "user", "content": "x"}]


def test_tools_omit_null_fields() -> None:
    tools: list[dict[str, Any]] = [
        {**TOOL, "strict": True},
        {"type": "function", "name": "bare", "description": None, "parameters": None, "strict": None},
        {"type": "web_search"},
    ]
    out, choice = build_tools(tools, "auto")
    assert out == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather",
                "parameters": {"type": "object"},
                "strict": True,
            },
        },
        {"type": "function", "function": {"name": "bare"}},
    ]
    assert choice is None


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", None),
        ("none", "none"),
        ("required", "required"),
        (
            {"type": "function", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
        ),
    ],
)
def test_tool_choice_forms(choice: Any, expected: Any) -> None:
    body = build_body(req(tools=[TOOL], tool_choice=choice))
    assert body.get("tool_choice") == expected
    assert len(body["tools"]) == 1


@pytest.mark.parametrize(
    ("mode", "expected"), [(None, None), ("auto", None), ("required", "required"), ("none", "none")]
)
def test_allowed_tools_subset_and_mode(mode: str | None, expected: str | None) -> None:
    tools = [TOOL, {**TOOL, "name": "b"}, {**TOOL, "name": "c"}]
    choice: dict[str, Any] = {
        "type": "allowed_tools",
        "tools": [{"type": "function", "name": "c"}, {"type": "function", "name": "get_weather"}],
    }
    if mode:
        choice["mode"] = mode
    body = build_body(req(tools=tools, tool_choice=choice))
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather", "c"]
    assert body.get("tool_choice") == expected


def test_no_tools_means_no_tool_choice_or_parallel() -> None:
    body = build_body(req(tool_choice="required", parallel_tool_calls=False))
    assert "tools" not in body and "tool_choice" not in body and "parallel_tool_calls" not in body
    body = build_body(req(tools=[TOOL], parallel_tool_calls=False))
    assert body["parallel_tool_calls"] is False


def test_sampling_limits_and_stream_flags() -> None:
    body = build_body(
        req(
            max_output_tokens=50,
            temperature=0.2,
            top_p=0.9,
            presence_penalty=0.1,
            frequency_penalty=-0.1,
            safety_identifier="user-1",
            reasoning={"effort": "low"},
        )
    )
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 50,
        "temperature": 0.2,
        "top_p": 0.9,
        "presence_penalty": 0.1,
        "frequency_penalty": -0.1,
        "reasoning_effort": "low",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    minimal = build_body(req())
    assert set(minimal) == {"model", "messages", "stream", "stream_options"}


def test_text_formats() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    fmt = {"type": "json_schema", "name": "thing", "schema": schema, "strict": True, "description": "d"}
    assert build_body(req(text_format=fmt))["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "thing", "description": "d", "schema": schema, "strict": True},
    }
    assert build_body(req(text_format={"type": "json_object"}))["response_format"] == {"type": "json_object"}
    assert "response_format" not in build_body(req(text_format={"type": "text"}))


def test_verbosity_is_passed_only_when_asked() -> None:
    assert build_body(req(verbosity="high"))["verbosity"] == "high"
    assert "verbosity" not in build_body(req())


# == stream translation (pure) ===============================================================
def ch(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}


def run(chunks: list[dict[str, Any]], done: bool = True) -> list[Delta]:
    t = ChatStreamTranslator()
    out: list[Delta] = []
    for c in chunks:
        out += t.feed(c)
    return out + t.end(done=done)


def test_translate_text_reasoning_refusal() -> None:
    out = run(
        [
            ch({"role": "assistant", "content": ""}),
            ch({"reasoning_content": "hm", "reasoning": "hm"}),
            ch({"reasoning": "m"}),
            ch({"content": "Hi"}),
            ch({"refusal": "No"}),
            ch({}, "stop"),
        ]
    )
    assert out == [
        ReasoningDelta("hm"),
        ReasoningDelta("m"),
        TextDelta("Hi"),
        RefusalDelta("No"),
        Finish("stop"),
    ]


def test_translate_tool_calls_same_chunk_and_parallel() -> None:
    out = run(
        [
            ch({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x"'}}]}),
            ch({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}),
            ch({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": ""}}]}),
            ch({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
            ch({}, "tool_calls"),
        ]
    )
    assert out == [
        ToolCallStart(0, "f", "a"),
        ToolCallArgsDelta(0, '{"x"'),
        ToolCallArgsDelta(0, ":1}"),
        ToolCallStart(1, "g", "b"),
        ToolCallArgsDelta(1, "{}"),
        Finish("tool_calls"),
    ]


def test_translate_tool_call_quirks() -> None:
    out = run(
        [
            # arguments before the name, no index; then index 0 reused for a second call (new id)
            ch({"tool_calls": [{"id": "a", "function": {"arguments": "{"}}]}),
            ch({"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "}"}}]}),
            ch({"tool_calls": [{"index": 0, "id": "b", "function": {"name": "g", "arguments": {"k": 1}}}]}),
            ch({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "h", "arguments": "{}"}}]}),
            ch({}, "stop"),  # Ollama-style "stop" after calls
        ]
    )
    assert out == [
        ToolCallStart(0, "f", "a"),
        ToolCallArgsDelta(0, "{"),
        ToolCallArgsDelta(0, "}"),
        ToolCallStart(1, "g", "b"),
        ToolCallArgsDelta(1, '{"k":1}'),
        ToolCallStart(2, "h", "c"),
        ToolCallArgsDelta(2, "{}"),
        Finish("tool_calls"),
    ]


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("stop", "stop"),
        ("length", "length"),
        ("tool_calls", "tool_calls"),
        ("function_call", "tool_calls"),
        ("content_filter", "content_filter"),
        ("weird", "stop"),
    ],
)
def test_translate_finish_reasons(reason: str, expected: str) -> None:
    assert run([ch({"content": "x"}), ch({}, reason)])[-1] == Finish(expected)  # type: ignore[arg-type]


def test_usage_after_finish_comes_before_finish() -> None:
    t = ChatStreamTranslator()
    assert t.feed(ch({"content": "x"}, None)) == [TextDelta("x")]
    assert t.feed(ch({}, "length")) == []
    assert t.feed(usage_chunk(5, 3, cached=2, reasoning=1)) == []
    assert t.end(done=True) == [Usage(5, 3, cached_tokens=2, reasoning_tokens=1), Finish("length")]


def test_no_usage_when_not_reported_and_done_without_finish() -> None:
    assert run([ch({"content": "x"})], done=True) == [TextDelta("x"), Finish("stop")]


def test_ended_early_raises() -> None:
    with pytest.raises(UpstreamError) as info:
        run([ch({"content": "x"})], done=False)
    assert not info.value.retryable
    assert run([ch({"content": "x"}, "stop")], done=False)[-1] == Finish("stop")


def test_error_chunk_raises() -> None:
    t = ChatStreamTranslator()
    with pytest.raises(UpstreamError) as info:
        t.feed({"error": {"message": f"boom {MARKER}", "code": 502}})
    assert info.value.retryable and MARKER not in info.value.message
    with pytest.raises(UpstreamError) as info:
        t.feed({"error": {"message": "too long", "code": "context_length_exceeded"}})
    assert info.value.code == "context_length_exceeded" and not info.value.retryable
    with pytest.raises(UpstreamError):
        ChatStreamTranslator().feed(ch({}, "error"))


# == the adapter against a fake upstream on real sockets =====================================
fake_server, fake = fake_fixtures(FakeOpenAIChat)
collect = collector(req)


@pytest.fixture
async def adapter(fake: FakeOpenAIChat) -> AsyncIterator[OpenAIChatAdapter]:
    a = OpenAIChatAdapter(settings(fake.base_url))
    yield a
    await a.aclose()


def settings(base_url: str, **timeouts: float) -> ProviderSettings:
    return ProviderSettings(
        kind="openai-chat",
        base_url=base_url,
        api_key=SECRET,
        headers={"x-extra": "1"},
        timeouts=Timeouts(**timeouts),
    )


def assert_clean(err: UpstreamError, base_url: str, *, said: bool = False) -> None:
    """No key or address in any rendering of ``err``; the provider's reason (``MARKER``) only
    when ``said``."""
    text = repr((str(err), err.error_object(), err.stream_event(0), err.ws_envelope()))
    for bad in (SECRET, base_url, "127.0.0.1"):
        assert bad not in text
    assert (MARKER in text) is said


async def test_stream_text_and_request_recorded(fake: FakeOpenAIChat, adapter: OpenAIChatAdapter) -> None:
    fake.add(Reply.text("Hello there, world!", pieces=4))
    out = await collect(adapter, req(instructions="sys", max_output_tokens=9))
    assert text_of(out) == "Hello there, world!"
    assert out[-2:] == [Usage(11, 7), Finish("stop")]
    [rec] = fake.requests
    assert rec.method == "POST" and rec.path == "/v1/chat/completions"
    assert rec.headers["authorization"] == f"Bearer {SECRET}"
    assert rec.headers["x-extra"] == "1"
    assert rec.headers["content-type"] == "application/json"
    assert rec.body["stream"] is True and rec.body["stream_options"] == {"include_usage": True}
    assert rec.body["messages"][0] == {"role": "system", "content": "sys"}
    assert rec.body["max_tokens"] == 9


@pytest.mark.parametrize("nl", ["\n", "\r\n", "\r"])
@pytest.mark.parametrize("split", [1, 5, None])
async def test_stream_awkward_framing(
    fake: FakeOpenAIChat, adapter: OpenAIChatAdapter, nl: str, split: int | None
) -> None:
    text = "héllo 世界 🎉 — ok"
    fake.add(Reply.text(text, pieces=5, line_ending=nl, split=split))
    out = await collect(adapter)
    assert text_of(out) == text and out[-1] == Finish("stop")


async def test_stream_tool_call(fake: FakeOpenAIChat, adapter: OpenAIChatAdapter) -> None:
    fake.add(Reply.tool_calls([("get_weather", '{"city":"Paris"}', "call_1")]))
    out = await collect(adapter, req(tools=[TOOL]))
    assert out[0] == ToolCallStart(0, "get_weather", "call_1")
    args = "".join(d.delta for d in out if isinstance(d, ToolCallArgsDelta))
    assert args == '{"city":"Paris"}'
    assert out[-2:] == [Usage(20, 9), Finish("tool_calls")]
    assert fake.requests[0].body["tools"][0]["function"]["name"] == "get_weather"


async def test_stream_parallel_tool_calls(fake: FakeOpenAIChat, adapter: OpenAIChatAdapter) -> None:
    calls = [("a", '{"n":1}', "c_a"), ("b", '{"n":2}', "c_b"), ("c", "{}", "c_c")]
    fake.add(Reply.tool_calls(calls, text="Calling."))
    out = await collect(adapter, req(tools=[TOOL]))
    assert out[0] == TextDelta("Calling.")
    starts = [d for d in out if isinstance(d, ToolCallStart)]
    assert starts == [
        ToolCallStart(0, "a", "c_a"),
        ToolCallStart(1, "b", "c_b"),
        ToolCallStart(2, "c", "c_c"),
    ]
    for key, (_, args, _) in enumerate(calls):
        assert "".join(d.delta for d in out if isinstance(d, ToolCallArgsDelta) and d.key == key) == args


async def test_stream_usage_details_and_length(fake: FakeOpenAIChat, adapter: OpenAIChatAdapter) -> None:
    reply = Reply.text("abc", finish="length", usage=None)
    reply.chunks.append(usage_chunk(100, 3, cached=64, reasoning=2))
    fake.add(reply)
    out = await collect(adapter)
    assert out[-2:] == [Usage(100, 3, cached_tokens=64, reasoning_tokens=2), Finish("length")]


async def test_stream_reasoning_field(fake: FakeOpenAIChat, adapter: OpenAIChatAdapter) -> None:
    fake.add(Reply.text("answer", reasoning="think think", reasoning_field="reasoning", usage=None))
    out = await collect(adapter)
    assert "".join(d.text for d in out if isinstance(d, ReasoningDelta)) == "think think"
    assert text_of(out) == "answer" and out[-1] == Finish("stop")
    assert not any(isinstance(d, Usage) for d in out)


@pytest.mark.parametrize(
    ("status", "cls", "retryable"),
    [(429, UpstreamRateLimited, True), (500, UpstreamError, True), (400, UpstreamRejected, False)],
)
async def test_stream_upstream_status(
    fake: FakeOpenAIChat, adapter: OpenAIChatAdapter, status: int, cls: type[UpstreamError], retryable: bool
) -> None:
    body = {"error": {"message": f"{MARKER} {SECRET} {fake.base_url}", "type": "x_error", "code": None}}
    fake.add(Reply.error(status, body, headers={"retry-after": "2"}))
    with pytest.raises(UpstreamError) as info:
        await collect(adapter)
    err = info.value
    assert type(err) is cls and err.retryable is retryable and err.upstream_status == status
    if status == 429:
        assert err.retry_after == 2.0
    assert_clean(err, fake.base_url, said=status == 400)  # a rejection says why


async def test_stream_in_band_error(fake: FakeOpenAIChat, adapter: OpenAIChatAdapter) -> None:
    fake.add(Reply(chunks=[ch({"content": "par"}), {"error": {"message": MARKER, "code": 503}}], done=False))
    with pytest.raises(UpstreamError) as info:
        await collect(adapter)
    assert_clean(info.value, fake.base_url)


async def test_connect_refused() -> None:
    url = f"http://127.0.0.1:{unused_port()}/v1"
    a = OpenAIChatAdapter(settings(url))
    try:
        with pytest.raises(UpstreamConnectError) as info:
            await collect(a)
    finally:
        await a.aclose()
    assert info.value.retryable
    assert_clean(info.value, url)


async def test_read_timeout(fake: FakeOpenAIChat) -> None:
    fake.add(Reply.text("slow", chunk_delay=1.0, split=None))
    a = OpenAIChatAdapter(settings(fake.base_url, read=0.25))
    try:
        with pytest.raises(UpstreamTimeout) as info:
            await collect(a)
    finally:
        await a.aclose()
    assert info.value.retryable
    assert_clean(info.value, fake.base_url)


async def test_total_timeout(fake: FakeOpenAIChat) -> None:
    fake.add(Reply.text("x" * 40, pieces=40, chunk_delay=0.05, split=None))
    a = OpenAIChatAdapter(settings(fake.base_url, total=0.4))
    try:
        with pytest.raises(UpstreamTimeout):
            await collect(a)
    finally:
        await a.aclose()


async def test_mid_stream_disconnect(fake: FakeOpenAIChat, adapter: OpenAIChatAdapter) -> None:
    fake.add(Reply.text("abcdefghijkl", pieces=6, disconnect_after=3))
    got: list[Delta] = []
    with pytest.raises(UpstreamError) as info:
        async with asyncio.timeout(10):
            async for d in adapter.stream(req()):
                got.append(d)
    assert type(info.value) is UpstreamError and info.value.retryable
    assert text_of(got) == "abcd"  # role chunk, "ab", "cd", then the drop
    assert_clean(info.value, fake.base_url)


async def test_stream_ended_early_without_done(fake: FakeOpenAIChat, adapter: OpenAIChatAdapter) -> None:
    fake.add(Reply.text("abc", finish=None, usage=None, done=False))
    with pytest.raises(UpstreamError) as info:
        await collect(adapter)
    assert not info.value.retryable and "ended early" in info.value.message


async def test_closing_the_generator_closes_the_upstream_connection(
    fake: FakeOpenAIChat, adapter: OpenAIChatAdapter
) -> None:
    fake.add(Reply.text("x" * 200, pieces=200, chunk_delay=0.02, split=None))
    gen = adapter.stream(req())
    async with asyncio.timeout(10):
        first = await anext(gen)
        assert first == TextDelta("x")
        await gen.aclose()  # type: ignore[attr-defined]
        await fake.disconnected.wait()
    assert fake.disconnects == 1


async def test_cancelling_the_consumer_closes_the_upstream_connection(
    fake: FakeOpenAIChat, adapter: OpenAIChatAdapter
) -> None:
    fake.add(Reply.text("x" * 200, pieces=200, chunk_delay=0.02, split=None))

    first = asyncio.Event()

    async def consume() -> None:
        async for _ in adapter.stream(req()):
            first.set()

    task = asyncio.create_task(consume())
    async with asyncio.timeout(10):
        await first.wait()  # the upstream is mid-stream (on a loaded machine that can take a while)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(5):
        await fake.disconnected.wait()


async def test_connection_is_kept_alive_between_streams(
    fake: FakeOpenAIChat, adapter: OpenAIChatAdapter
) -> None:
    await collect(adapter)
    await collect(adapter)
    assert len(fake.requests) == 2
    assert fake.requests[0].client == fake.requests[1].client


async def test_fake_answers_non_stream_requests(fake: FakeOpenAIChat) -> None:
    fake.add(Reply.tool_calls([("f", '{"a":1}', "c1")], text="ok"))
    async with httpx.AsyncClient() as client:
        r = await client.post(fake.base_url + "/chat/completions", json={"model": "m", "messages": []})
    body = r.json()
    assert body["object"] == "chat.completion"
    msg = body["choices"][0]["message"]
    assert msg["content"] == "ok"
    assert msg["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a":1}'}
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["usage"]["prompt_tokens"] == 20


async def test_server_ignoring_stream_flag_still_works(
    fake: FakeOpenAIChat, adapter: OpenAIChatAdapter
) -> None:
    fake.add(Reply(chunks=[ch({"content": "whole"}, "stop"), usage_chunk(1, 1)], as_json=True))
    assert await collect(adapter) == [TextDelta("whole"), Usage(1, 1), Finish("stop")]
