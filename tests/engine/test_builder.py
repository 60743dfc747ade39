"""Property tests: any valid delta sequence yields an event stream that obeys the spec's ordering
graph of the spec's streaming events; invalid sequences are refused loudly."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.deltas import (
    Delta,
    Finish,
    ItemDone,
    ReasoningDelta,
    ReasoningSummaryDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
from gateway.engine.builder import OutputState, ResponseBuilder
from gateway.engine.resource import new_resource
from gateway.kernel.errors import IllegalTransition, UpstreamError
from gateway.kernel.spec.request import CreateResponseBody
from tests.engine.helpers import delta_sequences, fresh_builder

# -- an independent checker of the ordering graph ------------------------------------------------
DELTA_DONE = {
    "response.output_text.delta": "response.output_text.done",
    "response.refusal.delta": "response.refusal.done",
    "response.reasoning.delta": "response.reasoning.done",
}


def check_stream(events: list[dict[str, Any]]) -> None:
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert all(list(e)[:2] == ["type", "sequence_number"] for e in events), "envelope keys come first"
    assert events[0]["type"] == "response.created"
    assert events[1]["type"] == "response.in_progress"
    for snap in (events[0]["response"], events[1]["response"]):
        assert snap["status"] == "in_progress" and snap["output"] == []
    terminal = events[-1]["type"]
    assert terminal in ("response.completed", "response.incomplete", "response.failed")
    assert all(
        e["type"] not in ("response.completed", "response.incomplete", "response.failed") for e in events[:-1]
    )
    item: dict[str, Any] | None = None  # the open item
    part: tuple[str, int] | None = None  # (kind, index) of the open part
    part_text: list[str] = []
    sub_done = False
    next_oi = 0
    done_items: list[dict[str, Any]] = []
    for ev in events[2:-1]:
        t = ev["type"]
        if t == "error":
            assert terminal == "response.failed"
            continue
        if t == "response.output_item.added":
            assert item is None, "item added while another is open"
            assert ev["output_index"] == next_oi
            item = ev["item"]
            assert item["status"] == "in_progress"
            if item["type"] == "message":
                assert item["content"] == [] and item["role"] == "assistant"
            if item["type"] == "function_call":
                assert item["arguments"] == "" and item["name"]
            continue
        assert item is not None, f"{t} outside an item"
        if t != "response.output_item.done":
            assert ev["item_id"] == item["id"] and ev["output_index"] == next_oi
        if t in ("response.content_part.added", "response.reasoning_summary_part.added"):
            assert part is None
            kind = "content" if t == "response.content_part.added" else "summary"
            idx = ev["content_index" if kind == "content" else "summary_index"]
            part = (kind, idx)
            part_text = []
            sub_done = False
        elif t in DELTA_DONE or t == "response.reasoning_summary_text.delta":
            assert part is not None and not sub_done
            part_text.append(ev["delta"])
        elif t in DELTA_DONE.values() or t == "response.reasoning_summary_text.done":
            assert part is not None and not sub_done
            text = ev.get("text", ev.get("refusal"))
            assert text == "".join(part_text)
            sub_done = True
        elif t in ("response.content_part.done", "response.reasoning_summary_part.done"):
            assert part is not None and sub_done
            part = None
        elif t == "response.function_call_arguments.delta":
            assert item["type"] == "function_call"
            part_text.append(ev["delta"])
        elif t == "response.function_call_arguments.done":
            assert ev["arguments"] == "".join(part_text)
        elif t == "response.output_item.done":
            assert part is None, "item done with an open part"
            assert ev["output_index"] == next_oi and ev["item"]["id"] == item["id"]
            assert ev["item"]["status"] in ("completed", "incomplete")
            done_items.append(ev["item"])
            item = None
            part_text = []
            next_oi += 1
        else:
            raise AssertionError(f"unexpected event {t}")
    final = events[-1]["response"]
    if terminal != "response.failed":
        assert item is None
        assert final["output"] == done_items
        assert final["completed_at"] is not None
    incompletes = [i for i in done_items if i["status"] == "incomplete"]
    if incompletes:
        assert done_items[-1]["status"] == "incomplete" and terminal == "response.incomplete"


@settings(max_examples=200, deadline=None)
@given(delta_sequences())
def test_valid_sequences_obey_the_ordering_graph(deltas: list[Any]) -> None:
    b = fresh_builder()
    events = b.start()
    snapshots = copy.deepcopy(events)
    for d in deltas:
        events += b.feed(d)
    events += b.finish()
    assert events[:2] == snapshots, "snapshots inside created/in_progress must not change later"
    check_stream(events)
    final = events[-1]["response"]
    text_sent = "".join(d.text for d in deltas if isinstance(d, TextDelta))
    text_out = "".join(
        p["text"]
        for i in final["output"]
        if i["type"] == "message"
        for p in i["content"]
        if p["type"] == "output_text"
    )
    assert text_out == text_sent
    usage = [d for d in deltas if isinstance(d, Usage)]
    if usage:
        assert final["usage"]["input_tokens"] == usage[-1].input_tokens
    else:
        assert final["usage"] is None  # never invented


@settings(max_examples=100, deadline=None)
@given(delta_sequences(), st.integers(0, 20))
def test_failure_at_any_point_ends_with_error_then_failed(deltas: list[Any], cut: int) -> None:
    b = fresh_builder()
    events = b.start()
    for d in deltas[:cut]:
        events += b.feed(d)
    events += b.fail(UpstreamError("boom"))
    check_stream(events)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1]["response"]["error"] == {"code": "upstream_error", "message": "boom"}
    assert events[-2]["error"]["message"] == "boom"
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    kept = "".join(
        p.get("text", "")
        for i in events[-1]["response"]["output"]
        if i["type"] == "message"
        for p in i["content"]
        if p["type"] == "output_text"
    )
    assert kept == streamed  # a failed response still shows what reached the client


def test_args_for_an_unknown_call_are_refused() -> None:
    b = fresh_builder()
    b.start()
    with pytest.raises(IllegalTransition):
        b.feed(ToolCallArgsDelta(7, "{}"))
    failed = b.fail(UpstreamError("x"))
    assert failed[-1]["response"]["status"] == "failed"


def test_args_for_a_closed_call_are_refused() -> None:
    b = fresh_builder()
    b.start()
    b.feed(ToolCallStart(0, "a"))
    b.feed(ToolCallStart(1, "b"))
    with pytest.raises(IllegalTransition):
        b.feed(ToolCallArgsDelta(0, "{}"))


def test_duplicate_call_ids_are_refused() -> None:
    b = fresh_builder()
    b.start()
    b.feed(ToolCallStart(0, "a", call_id="call_x"))
    with pytest.raises(IllegalTransition):
        b.feed(ToolCallStart(1, "b", call_id="call_x"))


def test_no_delta_after_the_end_and_no_double_start() -> None:
    b = fresh_builder()
    with pytest.raises(IllegalTransition):
        b.feed(TextDelta("early"))
    b.start()
    with pytest.raises(IllegalTransition):
        b.start()
    b.finish()
    with pytest.raises(IllegalTransition):
        b.feed(TextDelta("late"))
    with pytest.raises(IllegalTransition):
        b.finish()
    with pytest.raises(IllegalTransition):
        b.fail(UpstreamError("late"))


def test_length_makes_the_last_item_and_the_response_incomplete() -> None:
    b = fresh_builder()
    events = b.start() + b.feed(TextDelta("abc")) + b.feed(Finish("length")) + b.finish()
    check_stream(events)
    final = events[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][-1]["status"] == "incomplete"


def test_revoke_replaces_the_unsent_terminal_event() -> None:
    b = fresh_builder()
    events = b.start() + b.feed(TextDelta("abc"))
    terminal = b.finish()
    terminal[-1:] = b.revoke(UpstreamError("store down", code="service_unavailable"))
    events += terminal
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1]["response"]["completed_at"] is None


def test_logprobs_ride_on_deltas_and_gather_on_the_part() -> None:
    b = fresh_builder()
    b.start()
    one = [{"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []}]
    two = [{"token": "b", "logprob": -0.2, "bytes": [98], "top_logprobs": []}]
    events = b.feed(TextDelta("a", one)) + b.feed(TextDelta("b", two)) + b.feed(TextDelta("c"))
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [d.get("logprobs") for d in deltas] == [one, two, None]
    events = b.feed(Finish("stop")) + b.finish()
    [done] = [e for e in events if e["type"] == "response.output_text.done"]
    assert done["text"] == "abc" and done["logprobs"] == one + two
    assert b.resource["output"][0]["content"][0]["logprobs"] == one + two
    # a part without any keeps the shape it always had
    plain = fresh_builder()
    plain.start()
    events = plain.feed(TextDelta("x")) + plain.feed(Finish("stop")) + plain.finish()
    [done] = [e for e in events if e["type"] == "response.output_text.done"]
    assert "logprobs" not in done and "logprobs" not in plain.resource["output"][0]["content"][0]


# -- error_event=False (a WebSocket): response.failed alone, numbers without gaps -----------------
@settings(max_examples=100, deadline=None)
@given(delta_sequences(), st.integers(0, 20))
def test_without_the_error_event_failure_is_response_failed_alone(deltas: list[Any], cut: int) -> None:
    b = fresh_builder(error_event=False)
    events = b.start()
    for d in deltas[:cut]:
        events += b.feed(d)
    events += b.fail(UpstreamError("boom"))
    check_stream(events)
    assert [e["type"] for e in events].count("error") == 0
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"] == {"code": "upstream_error", "message": "boom"}


@pytest.mark.parametrize("error_event", [True, False])
def test_failure_before_start_is_response_failed_numbered_zero(error_event: bool) -> None:
    events = fresh_builder(error_event=error_event).fail(UpstreamError("early"))
    assert [(e["type"], e["sequence_number"]) for e in events] == [("response.failed", 0)]
    assert events[0]["response"]["status"] == "failed"


def test_revoke_without_the_error_event_reuses_the_terminal_number() -> None:
    b = fresh_builder(error_event=False)
    events = b.start() + b.feed(TextDelta("abc")) + b.feed(Finish("length"))
    terminal = b.finish()
    number = terminal[-1]["sequence_number"]
    terminal[-1:] = b.revoke(UpstreamError("store down", code="service_unavailable"))
    events += terminal
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert (events[-1]["type"], events[-1]["sequence_number"]) == ("response.failed", number)
    assert "error" not in [e["type"] for e in events]
    final = events[-1]["response"]
    assert final["completed_at"] is None and final["incomplete_details"] is None
    assert final["error"] == {"code": "service_unavailable", "message": "store down"}


def test_error_event_is_keyword_only_and_on_by_default() -> None:
    body = CreateResponseBody(model="m", input="x")
    resource = new_resource(body, response_id="resp_test", model="m", store=False)
    with pytest.raises(TypeError):
        ResponseBuilder(resource, False)  # type: ignore[call-arg]
    b = ResponseBuilder(resource)
    b.start()
    assert [e["type"] for e in b.fail(UpstreamError("x"))] == ["error", "response.failed"]


# -- the state machines ---------------------------------------------------------------------------
def test_illegal_transition_is_an_upstream_protocol_error() -> None:
    assert issubclass(IllegalTransition, UpstreamError)
    err = IllegalTransition("bad sequence")
    assert (err.status, err.type, err.code) == (502, "server_error", "upstream_protocol_error")
    b = fresh_builder()
    b.start()
    with pytest.raises(IllegalTransition) as caught:
        b.feed(ToolCallArgsDelta("nope", "{}"))
    failed = b.fail(caught.value)
    assert failed[-1]["response"]["error"]["code"] == "upstream_protocol_error"


def test_item_and_part_states_carry_the_wire_strings() -> None:
    assert [s.value for s in OutputState] == ["in_progress", "completed", "incomplete"]
    b = fresh_builder()
    b.start()
    b.feed(TextDelta("a"))
    assert (b._open.state, b._open.part_state) == (OutputState.IN_PROGRESS, OutputState.IN_PROGRESS)
    b.feed(ItemDone())
    assert (b._open.state, b._open.part_state) == (OutputState.COMPLETED, OutputState.COMPLETED)
    b.feed(ItemDone())  # nothing open: nothing to close
    assert b.resource["output"][0]["status"] == "completed"


def test_an_item_or_part_closes_once() -> None:
    b = fresh_builder()
    b.start()
    with pytest.raises(IllegalTransition):
        b._open.end(OutputState.COMPLETED)  # no item yet
    b.feed(TextDelta("a"))
    with pytest.raises(IllegalTransition):
        b._open.end(OutputState.IN_PROGRESS)  # open is not an end
    b.feed(ItemDone())
    with pytest.raises(IllegalTransition):
        b._open.end(OutputState.INCOMPLETE)
    with pytest.raises(IllegalTransition):
        b._open.end_part(OutputState.COMPLETED)
    assert b.resource["output"][0]["status"] == "completed"


def test_a_closed_summary_part_takes_no_more_text() -> None:
    b = fresh_builder()
    b.start()
    b.feed(ReasoningSummaryDelta("first", 0))
    b.feed(ReasoningSummaryDelta("second", 1))
    with pytest.raises(IllegalTransition):
        b.feed(ReasoningSummaryDelta("late", 0))
    # a new reasoning item numbers its parts afresh
    b.feed(TextDelta("answer"))
    events = b.feed(ReasoningSummaryDelta("again", 0))
    assert [e["type"] for e in events][-2:] == [
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
    ]


def test_sparse_summary_numbers_become_dense_and_keep_their_text_together() -> None:
    b = fresh_builder()
    events = b.start()
    for d in [ReasoningSummaryDelta("a", 1), ReasoningSummaryDelta("b", 1), ReasoningSummaryDelta("c", 4)]:
        events += b.feed(d)
    events += b.feed(ReasoningSummaryDelta("d", 4)) + b.finish()
    check_stream(events)
    [item] = b.resource["output"]
    assert item["summary"] == [{"type": "summary_text", "text": "ab"}, {"type": "summary_text", "text": "cd"}]
    added = [e["summary_index"] for e in events if e["type"] == "response.reasoning_summary_part.added"]
    assert added == [0, 1]


def test_reasoning_text_after_a_summary_is_one_new_part() -> None:
    b = fresh_builder()
    events = b.start()
    deltas: list[Delta] = [
        ReasoningDelta("a"),
        ReasoningSummaryDelta("s"),
        ReasoningDelta("b"),
        ReasoningDelta("c"),
    ]
    for d in deltas:
        events += b.feed(d)
    events += b.finish()
    check_stream(events)
    [item] = b.resource["output"]
    assert [p["text"] for p in item["content"]] == ["a", "bc"]
    assert [p["text"] for p in item["summary"]] == ["s"]


def test_failure_keeps_the_arguments_streamed_so_far() -> None:
    b = fresh_builder()
    b.start()
    b.feed(ToolCallStart(0, "f", "call_1"))
    b.feed(ToolCallArgsDelta(0, '{"a"'))
    b.feed(ToolCallArgsDelta(0, ": 1"))
    final = b.fail(UpstreamError("cut"))[-1]["response"]
    assert final["output"][0]["arguments"] == '{"a": 1'
    assert final["output"][0]["status"] == "incomplete"


def test_each_delta_event_is_a_fresh_dict() -> None:
    b = fresh_builder()
    b.start()
    first = b.feed(TextDelta("a"))[-1]
    first["sequence_number"] = 99  # what a transport may do to the event it was given
    first["extra"] = True
    second = b.feed(TextDelta("b"))[-1]
    assert second == {
        "type": "response.output_text.delta",
        "sequence_number": 5,
        "item_id": b.resource["output"][0]["id"],
        "output_index": 0,
        "content_index": 0,
        "delta": "b",
    }
