"""The openai-responses adapter: request translation (pure), stream translation (pure, incl. a
stream recorded from the Responses API reference), and the adapter against the fake."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from adapters.base import UpstreamRequest
from adapters.deltas import (
    Finish,
    ItemDone,
    ReasoningDelta,
    ReasoningEncrypted,
    ReasoningSummaryDelta,
    RefusalDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
from adapters.openai_responses import OpenAIResponsesAdapter
from adapters.openai_responses.request import build_body, build_input, unwrap_encrypted, wrap_encrypted
from adapters.openai_responses.stream import ResponsesStreamTranslator
from adapters.streaming import merge_ready
from gateway.kernel.errors import UpstreamError, UpstreamRateLimited, UpstreamRejected
from gateway.kernel.settings import ProviderSettings
from tests.adapters.helpers import collector, text_of, translator_run
from tests.fakes.openai_responses import FakeOpenAIResponses, Reply
from tests.helpers import fake_fixtures

SECRET = "sk-SECRET-42"
MARKER = "RAW-BODY-MARKER"


def req(items: list[dict[str, Any]] | None = None, **kw: Any) -> UpstreamRequest:
    return UpstreamRequest(model="gpt-x", items=items if items is not None else [user("hi")], **kw)


def user(*texts: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": "msg_gw",
        "role": "user",
        "content": [{"type": "input_text", "text": t} for t in texts],
    }


def call(call_id: str, name: str = "f", args: str = "{}") -> dict[str, Any]:
    return {"type": "function_call", "id": "fc_gw", "call_id": call_id, "name": name, "arguments": args}


def output(call_id: str, out: Any = "ok") -> dict[str, Any]:
    return {"type": "function_call_output", "id": "fco_gw", "call_id": call_id, "output": out}


TOOL = {
    "type": "function",
    "name": "f",
    "description": None,
    "parameters": {"type": "object"},
    "strict": None,
}


# == request translation =====================================================================
def test_body_is_stateless_and_complete() -> None:
    fmt = {
        "type": "json_schema",
        "name": "x",
        "description": None,
        "schema": {"type": "object"},
        "strict": True,
    }
    body = build_body(
        req(
            instructions="sys",
            tools=[TOOL],
            tool_choice={
                "type": "allowed_tools",
                "tools": [{"type": "function", "name": "f"}],
                "mode": "auto",
            },
            max_output_tokens=100,
            temperature=0.5,
            top_p=0.9,
            parallel_tool_calls=False,
            text_format=fmt,
            metadata={"k": "v"},
            prompt_cache_key="pck",
        )
    )
    assert body["stream"] is True and body["store"] is False
    assert "previous_response_id" not in body
    assert body["instructions"] == "sys"
    assert body["tools"] == [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    tool_choice = body["tool_choice"]
    assert isinstance(tool_choice, dict) and tool_choice["type"] == "allowed_tools"
    assert body["max_output_tokens"] == 100 and body["temperature"] == 0.5 and body["top_p"] == 0.9
    assert body["parallel_tool_calls"] is False and body["metadata"] == {"k": "v"}
    assert body["text"] == {
        "format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": True}
    }
    assert body["prompt_cache_key"] == "pck" and "include" not in body and "reasoning" not in body


def test_verbosity_rides_in_text_and_an_unstreamed_request_says_so() -> None:
    body = build_body(req(verbosity="low", stream=False))
    assert body["text"] == {"verbosity": "low"} and body["stream"] is False
    assert "text" not in build_body(req())


def test_input_items_drop_gateway_ids_and_keep_phase_and_images() -> None:
    items = [
        {
            "type": "message",
            "id": "msg_1",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "data:image/png;base64,AA"},
            ],
        },
        {
            "type": "message",
            "id": "msg_2",
            "role": "assistant",
            "phase": "commentary",
            "content": [{"type": "output_text", "text": "hm"}, {"type": "refusal", "refusal": "no"}],
        },
        call("c1", "f", ""),
        output("c1", [{"type": "input_text", "text": "r"}]),
    ]
    assert build_input(items) == [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "auto"},
            ],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "hm", "annotations": []},
                {"type": "refusal", "refusal": "no"},
            ],
            "phase": "commentary",
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "r"}]},
    ]


def test_reasoning_items_round_trip_encrypted_content() -> None:
    wrapped = wrap_encrypted("rs_upstream", "ENC")
    assert unwrap_encrypted(wrapped) == ("rs_upstream", "ENC")
    assert unwrap_encrypted("PLAIN") == (None, "PLAIN")
    summary = [{"type": "summary_text", "text": "s"}]
    items = [
        user("q"),
        {"type": "reasoning", "id": "rs_gw1", "summary": summary, "encrypted_content": wrapped},
        {"type": "reasoning", "id": "rs_client", "summary": [], "encrypted_content": "FROM-OPENAI"},
        {"type": "reasoning", "id": "rs_gw2", "summary": summary},  # no state: dropped
    ]
    body = build_body(req(items))
    assert body["input"][1:] == [
        {"type": "reasoning", "summary": summary, "encrypted_content": "ENC", "id": "rs_upstream"},
        {"type": "reasoning", "summary": [], "encrypted_content": "FROM-OPENAI", "id": "rs_client"},
    ]
    assert body["include"] == ["reasoning.encrypted_content"]


def test_reasoning_param_asks_for_encrypted_content() -> None:
    body = build_body(
        req(reasoning={"effort": "low", "summary": None}, include=["message.output_text.logprobs"])
    )
    assert body["reasoning"] == {"effort": "low"}
    assert body["include"] == ["message.output_text.logprobs", "reasoning.encrypted_content"]


# == stream translation =========================================================================
# Adapted from the Responses API reference's streaming example (ids shortened).
RECORDED: list[dict[str, Any]] = [
    {
        "type": "response.created",
        "sequence_number": 0,
        "response": {"id": "resp_67c9", "status": "in_progress", "output": []},
    },
    {
        "type": "response.in_progress",
        "sequence_number": 1,
        "response": {"id": "resp_67c9", "status": "in_progress"},
    },
    {
        "type": "response.output_item.added",
        "sequence_number": 2,
        "output_index": 0,
        "item": {
            "id": "msg_67c9",
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        },
    },
    {
        "type": "response.content_part.added",
        "sequence_number": 3,
        "item_id": "msg_67c9",
        "output_index": 0,
        "content_index": 0,
        "part": {"type": "output_text", "text": "", "annotations": []},
    },
    {
        "type": "response.output_text.delta",
        "sequence_number": 4,
        "item_id": "msg_67c9",
        "output_index": 0,
        "content_index": 0,
        "delta": "Hi",
    },
    {
        "type": "response.output_text.delta",
        "sequence_number": 5,
        "item_id": "msg_67c9",
        "output_index": 0,
        "content_index": 0,
        "delta": " there!",
    },
    {
        "type": "response.output_text.done",
        "sequence_number": 6,
        "item_id": "msg_67c9",
        "output_index": 0,
        "content_index": 0,
        "text": "Hi there!",
    },
    {
        "type": "response.content_part.done",
        "sequence_number": 7,
        "item_id": "msg_67c9",
        "output_index": 0,
        "content_index": 0,
        "part": {"type": "output_text", "text": "Hi there!", "annotations": []},
    },
    {
        "type": "response.output_item.done",
        "sequence_number": 8,
        "output_index": 0,
        "item": {
            "id": "msg_67c9",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi there!", "annotations": []}],
        },
    },
    {
        "type": "response.completed",
        "sequence_number": 9,
        "response": {
            "id": "resp_67c9",
            "status": "completed",
            "usage": {
                "input_tokens": 37,
                "output_tokens": 11,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 48,
                "input_tokens_details": {"cached_tokens": 0},
            },
        },
    },
]


translate = translator_run(ResponsesStreamTranslator)


def test_recorded_stream() -> None:
    assert translate(RECORDED) == [
        TextDelta("Hi"),
        TextDelta(" there!"),
        ItemDone(),
        Usage(37, 11),
        Finish("stop"),
    ]


def test_items_only_in_done_events_and_raw_reasoning() -> None:
    events: list[dict[str, Any]] = [
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "a"}, {"type": "summary_text", "text": "b"}],
                "content": [{"type": "reasoning_text", "text": "raw"}],
                "encrypted_content": "E",
            },
        },
        {
            "type": "response.output_item.done",
            "output_index": 1,
            "item": {"type": "message", "content": [{"type": "refusal", "refusal": "no"}]},
        },
        {
            "type": "response.output_item.done",
            "output_index": 2,
            "item": {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        },
        {"type": "response.output_item.done", "output_index": 3, "item": {"type": "web_search_call"}},
        {"type": "response.completed", "response": {"status": "completed"}},
    ]
    assert translate(events) == [
        ReasoningSummaryDelta("a", 0),
        ReasoningSummaryDelta("b", 1),
        ReasoningDelta("raw"),
        ReasoningEncrypted(wrap_encrypted("rs_1", "E")),
        ItemDone(),
        RefusalDelta("no"),
        ItemDone(),
        ToolCallStart(2, "f", "c"),
        ToolCallArgsDelta(2, "{}"),
        ItemDone(),
        Finish("tool_calls"),
    ]


def test_reasoning_text_deltas_both_names() -> None:
    events: list[dict[str, Any]] = [
        {"type": "response.reasoning_text.delta", "output_index": 0, "delta": "a"},
        {"type": "response.reasoning.delta", "output_index": 0, "delta": "b"},
        {
            "type": "response.reasoning_summary_text.delta",
            "output_index": 0,
            "summary_index": 1,
            "delta": "s",
        },
        {"type": "response.completed", "response": {}},
    ]
    assert translate(events) == [
        ReasoningDelta("a"),
        ReasoningDelta("b"),
        ReasoningSummaryDelta("s", 1),
        Finish("stop"),
    ]


@pytest.mark.parametrize(
    ("reason", "finish"), [("max_output_tokens", "length"), ("content_filter", "content_filter")]
)
def test_incomplete(reason: str, finish: str) -> None:
    event = {
        "type": "response.incomplete",
        "response": {"status": "incomplete", "incomplete_details": {"reason": reason}},
    }
    assert translate([event]) == [Finish(finish)]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("event", "cls", "retryable"),
    [
        (
            {"type": "response.failed", "response": {"error": {"code": "server_error", "message": MARKER}}},
            UpstreamError,
            True,
        ),
        (
            {"type": "error", "code": "rate_limit_exceeded", "message": MARKER, "param": None},
            UpstreamRateLimited,
            True,
        ),
        (
            {"type": "error", "error": {"code": "context_length_exceeded", "message": MARKER}},
            UpstreamRejected,
            False,
        ),
        ({"type": "error", "code": "weird_thing", "message": MARKER}, UpstreamError, False),
    ],
)
def test_failures(event: dict[str, Any], cls: type[UpstreamError], retryable: bool) -> None:
    with pytest.raises(UpstreamError) as info:
        ResponsesStreamTranslator().feed(event)
    assert type(info.value) is cls and info.value.retryable is retryable
    # the provider's reason is passed on only for what a retry cannot fix
    assert (MARKER in repr(info.value.error_object())) is not retryable


def test_an_incomplete_item_is_left_open_for_the_builder_to_mark() -> None:
    events: list[dict[str, Any]] = [
        {"type": "response.output_text.delta", "output_index": 0, "delta": "cut"},
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {"type": "message", "status": "incomplete"},
        },
        {"type": "response.incomplete", "response": {"incomplete_details": {"reason": "max_output_tokens"}}},
    ]
    events[-1]["response"]["status"] = "incomplete"
    assert translate(events) == [TextDelta("cut"), Finish("length")]


def test_no_terminal_event_raises() -> None:
    with pytest.raises(UpstreamError):
        translate(RECORDED[:-1])


def test_whole_response_object() -> None:
    whole = {
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "cut"}]}],
        "usage": {"input_tokens": 1, "output_tokens": 2},
    }
    assert ResponsesStreamTranslator().unstreamed_deltas(whole) == [
        TextDelta("cut"),
        ItemDone(),
        Usage(1, 2),
        Finish("length"),
    ]


def test_logprobs_pass_through_streamed_and_whole() -> None:
    lp = [{"token": "hi", "logprob": -0.3, "bytes": [104, 105], "top_logprobs": []}]
    t = ResponsesStreamTranslator()
    assert t.feed(
        {"type": "response.output_text.delta", "output_index": 0, "delta": "hi", "logprobs": lp}
    ) == [TextDelta("hi", lp)]
    whole = {
        "status": "completed",
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi", "logprobs": lp}]}],
    }
    assert ResponsesStreamTranslator().unstreamed_deltas(whole)[0] == TextDelta("hi", lp)
    body = build_body(req(include=["message.output_text.logprobs"], top_logprobs=3))
    assert "message.output_text.logprobs" in body["include"] and body["top_logprobs"] == 3


# == the adapter against the fake ===============================================================
fake_server, fake = fake_fixtures(FakeOpenAIResponses)
collect = collector(req)


@pytest.fixture
async def adapter(fake: FakeOpenAIResponses) -> AsyncIterator[OpenAIResponsesAdapter]:
    a = OpenAIResponsesAdapter(
        ProviderSettings(kind="openai-responses", base_url=fake.base_url, api_key=SECRET)
    )
    yield a
    await a.aclose()


async def test_headers_path_and_text(fake: FakeOpenAIResponses, adapter: OpenAIResponsesAdapter) -> None:
    out = await collect(adapter)
    assert text_of(out) == "Hello! You said: hi"
    [rec] = fake.requests
    assert rec.path == "/v1/responses" and rec.headers["authorization"] == f"Bearer {SECRET}"
    assert rec.body["store"] is False and rec.body["stream"] is True


@pytest.mark.parametrize("split", [1, None])
async def test_recorded_stream_over_the_wire(
    fake: FakeOpenAIResponses, adapter: OpenAIResponsesAdapter, split: int | None
) -> None:
    fake.add(Reply(events=[(e["type"], e) for e in RECORDED], split=split))
    # the shell merges pieces that arrive in one read (adapters.streaming.merge_ready)
    assert merge_ready(await collect(adapter)) == merge_ready(translate(RECORDED))


async def test_encrypted_reasoning_round_trip(
    fake: FakeOpenAIResponses, adapter: OpenAIResponsesAdapter
) -> None:
    fake.add(Reply.tool_calls([("f", "{}", "call_1")], reasoning="plan", signature="ENC-1"))
    out = await collect(adapter, req(tools=[TOOL], reasoning={"effort": "low"}))
    [enc] = [d.content for d in out if isinstance(d, ReasoningEncrypted)]
    assert fake.requests[0].body["include"] == ["reasoning.encrypted_content"]
    reasoning = {
        "type": "reasoning",
        "id": "rs_gw",
        "summary": [{"type": "summary_text", "text": "plan"}],
        "encrypted_content": enc,
    }
    out = await collect(
        adapter, req([user("hi"), reasoning, call("call_1"), output("call_1", "42")], tools=[TOOL])
    )
    assert text_of(out) == "The tool returned: 42"
    sent = fake.requests[1].body["input"][1]
    assert sent["encrypted_content"] == "ENC-1" and sent["id"].startswith("rs_") and sent["id"] != "rs_gw"


async def test_failed_response_and_truncated_stream(
    fake: FakeOpenAIResponses, adapter: OpenAIResponsesAdapter
) -> None:
    fake.add(Reply.text("part", stream_error="server"), Reply.text("part", terminal=False))
    with pytest.raises(UpstreamError) as info:
        await collect(adapter)
    assert info.value.retryable
    with pytest.raises(UpstreamError):
        await collect(adapter)


async def test_max_output_tokens_incomplete(
    fake: FakeOpenAIResponses, adapter: OpenAIResponsesAdapter
) -> None:
    out = await collect(adapter, req([user("one two three four five")], max_output_tokens=3))
    assert text_of(out) == "Hello! You said:"
    assert out[-1] == Finish("length")
