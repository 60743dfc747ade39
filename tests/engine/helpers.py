"""What the builder tests share: a fresh builder, a strategy of valid delta sequences, and the
named scenarios that drive the builder through every event it can emit."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from adapters.deltas import (
    Delta,
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
from gateway.engine.builder import ResponseBuilder
from gateway.engine.resource import new_resource
from gateway.kernel.spec.request import CreateResponseBody


def fresh_builder(*, error_event: bool = True) -> ResponseBuilder:
    body = CreateResponseBody(model="m", input="x")
    resource = new_resource(body, response_id="resp_test", model="m", store=False)
    return ResponseBuilder(resource, error_event=error_event)


# -- strategies ----------------------------------------------------------------------------------
text = st.text(min_size=1, max_size=6)


@st.composite
def delta_sequences(draw: st.DrawFn) -> list[Any]:
    out: list[Any] = []
    call_no = 0
    summary_no = 0  # the adapter's summary part numbers only grow (a closed part takes no more text)
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(
            st.sampled_from(["text", "refusal", "reasoning", "summary", "call", "done", "usage", "encrypted"])
        )
        if kind == "text":
            out += [TextDelta(t) for t in draw(st.lists(text, min_size=1, max_size=4))]
        elif kind == "refusal":
            out += [RefusalDelta(t) for t in draw(st.lists(text, min_size=1, max_size=3))]
        elif kind == "reasoning":
            out += [ReasoningDelta(t) for t in draw(st.lists(text, min_size=1, max_size=3))]
        elif kind == "summary":
            part = summary_no + draw(st.integers(0, 2))  # gaps are numbered densely by the builder
            summary_no = part + 1
            out += [ReasoningSummaryDelta(t, part) for t in draw(st.lists(text, min_size=1, max_size=3))]
        elif kind == "encrypted":
            out.append(ReasoningEncrypted(draw(text)))
        elif kind == "call":
            key = call_no
            call_no += 1
            out.append(ToolCallStart(key=key, name="fn", call_id=draw(st.none() | st.just(f"call_{key}"))))
            out += [ToolCallArgsDelta(key, t) for t in draw(st.lists(text, max_size=3))]
        elif kind == "done":
            out.append(ItemDone())
        else:
            out.append(Usage(draw(st.integers(0, 99)), draw(st.integers(0, 99))))
    if draw(st.booleans()):
        out.append(Finish(draw(st.sampled_from(["stop", "length", "tool_calls", "content_filter"]))))
    return out


# Every event type the builder emits (the error event comes from GatewayError.stream_event).
BUILDER_EVENTS = {
    "response.created",
    "response.in_progress",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
    "response.output_item.added",
    "response.output_item.done",
    "response.content_part.added",
    "response.content_part.done",
    "response.output_text.delta",
    "response.output_text.done",
    "response.refusal.delta",
    "response.refusal.done",
    "response.reasoning.delta",
    "response.reasoning.done",
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_part.done",
    "response.reasoning_summary_text.delta",
    "response.reasoning_summary_text.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
}

LOGPROBS = [{"token": "Hi", "logprob": -0.25, "bytes": [72, 105], "top_logprobs": []}]
SCENARIOS: dict[str, list[Delta]] = {
    "text": [TextDelta("Hi", LOGPROBS), TextDelta(" there"), Usage(12, 3, cached_tokens=4), Finish("stop")],
    "refusal": [TextDelta("Well"), RefusalDelta("I can't"), RefusalDelta(" help."), Finish("stop")],
    "reasoning": [
        ReasoningSummaryDelta("Plan: ", 0),
        ReasoningSummaryDelta("add.", 0),
        ReasoningSummaryDelta("Check.", 1),
        ReasoningDelta("2 + 2 "),
        ReasoningDelta("= 4"),
        ReasoningEncrypted("opaque-state"),
        TextDelta("4"),
        Usage(5, 9, reasoning_tokens=7),
    ],
    "encrypted": [ReasoningEncrypted("state-1"), ItemDone(), ReasoningEncrypted("state-2")],
    "calls": [
        TextDelta("Calling."),
        ToolCallStart(0, "get_weather", "call_w"),
        ToolCallArgsDelta(0, '{"city":'),
        ToolCallArgsDelta(0, '"Paris"}'),
        ToolCallStart(1, "get_time"),
        ToolCallArgsDelta(1, "{}"),
        Finish("tool_calls"),
    ],
    "length": [TextDelta("cut sh"), Finish("length")],
    "content_filter": [RefusalDelta("no"), Finish("content_filter")],
    "empty": [],
}
