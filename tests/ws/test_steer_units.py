"""The engine's part of steering, in process: ``ResponseBuilder.interrupt`` (the one place a response
ends at a safe boundary), ``Turn.stop`` (a text stream stops at once, even mid-wait on the upstream;
a call's arguments finish first; a real cancellation is never mistaken for the stop's own), and
the steering input rules (``gateway/engine/steer_input.py``), and the socket's bounded book of
steerable responses (``gateway/api/steer_book.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from adapters.base import UpstreamRequest
from adapters.deltas import Delta, Finish, TextDelta, ToolCallArgsDelta, ToolCallStart, Usage
from gateway.api.steer_book import SteerBook
from gateway.engine.builder import ResponseBuilder
from gateway.engine.steer_input import required_input, steer_items, with_steering
from gateway.engine.turn import Turn, TurnResult
from gateway.kernel.errors import IllegalTransition, InvalidRequest, ServiceUnavailable
from tests.engine.test_turn import Scripted, make_turn, route

Event = dict[str, Any]


def builder() -> ResponseBuilder:
    resource: dict[str, Any] = {
        "id": "resp_1",
        "status": "in_progress",
        "output": [],
        "incomplete_details": None,
    }
    b = ResponseBuilder(resource, error_event=False)
    b.start()
    return b


def test_interrupt_closes_the_open_text_where_it_is() -> None:
    b = builder()
    b.feed(TextDelta("ab"))
    b.feed(TextDelta("cd"))
    events = b.interrupt("steered")
    assert [e["type"] for e in events] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert events[0]["text"] == "abcd" and events[1]["part"]["text"] == "abcd"
    assert events[2]["item"]["status"] == "incomplete"
    res = events[-1]["response"]
    assert res["status"] == "incomplete" and res["incomplete_details"] == {"reason": "steered"}
    assert [e["sequence_number"] for e in events] == [6, 7, 8, 9]  # created .. the two deltas: 0-5
    with pytest.raises(IllegalTransition):
        b.feed(TextDelta("more"))
    with pytest.raises(IllegalTransition):
        b.interrupt("steered")


def test_interrupt_keeps_a_call_whole_and_completed() -> None:
    b = builder()
    b.feed(TextDelta("let me look"))
    b.feed(ToolCallStart(key=0, name="f", call_id="c1"))
    b.feed(ToolCallArgsDelta(key=0, delta='{"a": 1}'))
    assert b.call_open
    events = b.interrupt("steered")
    assert [e["type"] for e in events] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    message, call = b.resource["output"]
    assert message["status"] == "completed"  # closed when the call opened
    assert call["status"] == "completed" and call["arguments"] == '{"a": 1}'
    assert not b.call_open


def test_interrupt_with_nothing_open_and_after_the_end() -> None:
    b = builder()
    assert [e["type"] for e in b.interrupt("steered")] == ["response.incomplete"]
    done = builder()
    done.finish()
    with pytest.raises(IllegalTransition):
        done.interrupt("steered")


class Gated:
    """Plays ``before``, waits for ``gate``, plays ``after``; counts closes."""

    def __init__(self, before: list[Delta], after: list[Delta]) -> None:
        self.before, self.after = before, after
        self.gate = asyncio.Event()
        self.closed = 0

    async def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
        try:
            for d in self.before:
                yield d
            await self.gate.wait()
            for d in self.after:
                yield d
        finally:
            self.closed += 1

    async def aclose(self) -> None:
        return None


async def start(turn: Turn, first: str) -> tuple[asyncio.Task[Any], list[Event]]:
    """Run ``turn`` in a task until an event of type ``first`` went out."""
    events: list[Event] = []
    seen = asyncio.Event()

    async def emit(event: Event) -> None:
        events.append(event)
        if event["type"] == first:
            seen.set()

    task = asyncio.create_task(turn.run(emit))
    await asyncio.wait_for(seen.wait(), 5)
    return task, events


async def test_stop_cuts_the_wait_on_the_upstream_between_text_deltas() -> None:
    adapter = Gated([TextDelta("so far")], [TextDelta("never"), Finish("stop")])
    turn = make_turn(route(adapter))
    task, events = await start(turn, "response.output_text.delta")
    await asyncio.sleep(0.05)  # the turn now waits on the upstream
    assert turn.stop("steered")
    result = await asyncio.wait_for(task, 5)
    assert result.status == "incomplete" and adapter.closed == 1
    assert result.resource["incomplete_details"] == {"reason": "steered"}
    assert result.output[0]["content"][0]["text"] == "so far"
    assert events[-1]["type"] == "response.incomplete"
    assert not turn.stop("steered")  # decided


async def test_stop_lets_a_call_in_progress_finish_first() -> None:
    adapter = Gated(
        [ToolCallStart(key=0, name="f", call_id="c1"), ToolCallArgsDelta(key=0, delta='{"a":')],
        [ToolCallArgsDelta(key=0, delta=" 1}"), TextDelta("never"), Finish("tool_calls")],
    )
    turn = make_turn(route(adapter), tools=[{"type": "function", "name": "f"}])
    task, events = await start(turn, "response.function_call_arguments.delta")
    assert turn.stop("steered")
    await asyncio.sleep(0.1)
    assert not task.done()  # not cut mid-arguments
    adapter.gate.set()
    result = await asyncio.wait_for(task, 5)
    [call] = result.output
    assert call["arguments"] == '{"a": 1}' and call["status"] == "completed"
    assert result.status == "incomplete" and adapter.closed == 1
    assert [e["type"] for e in events][-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.incomplete",
    ]


async def test_abort_cuts_even_a_call_in_progress_and_fails() -> None:
    adapter = Gated(
        [ToolCallStart(key=0, name="f", call_id="c1"), ToolCallArgsDelta(key=0, delta='{"a":')],
        [ToolCallArgsDelta(key=0, delta=" 1}"), Finish("tool_calls")],
    )
    turn = make_turn(route(adapter), tools=[{"type": "function", "name": "f"}])
    task, events = await start(turn, "response.function_call_arguments.delta")
    await asyncio.sleep(0.05)  # waiting on the upstream, mid-arguments
    turn.stop("steered")  # a steer first: it would wait for the call
    assert turn.abort(ServiceUnavailable("shutting down"))
    result = await asyncio.wait_for(task, 5)  # cut at once, the gate never opened
    assert result.status == "failed" and adapter.closed == 1
    assert result.error is not None and result.error.code == "service_unavailable"
    [call] = result.output
    assert call["status"] == "incomplete" and call["arguments"] == '{"a":'
    assert events[-1]["type"] == "response.failed"
    assert not turn.abort(ServiceUnavailable("again"))  # decided


async def test_abort_while_the_upstream_holds_its_first_delta_starts_and_fails_the_response() -> None:
    adapter = Gated([], [TextDelta("never"), Finish("stop")])  # nothing before the gate
    turn = make_turn(route(adapter))
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    task = asyncio.create_task(turn.run(emit))
    await asyncio.sleep(0.05)  # opening: waiting on the upstream's first delta
    assert not events
    assert turn.abort(ServiceUnavailable("shutting down"))
    result = await asyncio.wait_for(task, 5)  # cut at once, the gate never opened
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "error",
        "response.failed",
    ]
    assert result.status == "failed" and result.started and adapter.closed == 1
    assert result.error is not None and result.error.code == "service_unavailable"
    assert result.output == []
    assert not turn.abort(ServiceUnavailable("again"))  # decided


async def test_a_steer_while_opening_waits_for_the_first_delta() -> None:
    adapter = Gated([], [TextDelta("x"), Finish("stop")])
    turn = make_turn(route(adapter))
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(0.05)
    assert turn.stop("steered")  # not a cut: only an abort ends the opening
    await asyncio.sleep(0.05)
    assert not task.done()
    adapter.gate.set()
    result = await asyncio.wait_for(task, 5)
    assert result.status == "incomplete" and result.output == []


async def test_a_real_cancellation_while_opening_goes_on() -> None:
    adapter = Gated([], [Finish("stop")])
    turn = make_turn(route(adapter))
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(0.05)
    turn.abort(ServiceUnavailable("shutting down"))
    task.cancel()  # the client left at the same moment
    with pytest.raises(asyncio.CancelledError):
        await task
    assert turn.result.status == "cancelled" and adapter.closed == 1


async def test_stop_before_the_first_delta_ends_at_it() -> None:
    turn = make_turn(
        route(Scripted([TextDelta("x"), Usage(input_tokens=1, output_tokens=1), Finish("stop")]))
    )
    assert turn.stop("steered")
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    result = await turn.run(emit)
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.incomplete"]
    assert result.output == []


async def test_a_real_cancellation_during_the_cut_goes_on() -> None:
    adapter = Gated([TextDelta("a")], [Finish("stop")])
    turn = make_turn(route(adapter))
    task, _ = await start(turn, "response.output_text.delta")
    await asyncio.sleep(0.05)
    turn.stop("steered")
    task.cancel()  # the client left at the same moment
    with pytest.raises(asyncio.CancelledError):
        await task
    assert turn.result.status == "cancelled" and adapter.closed == 1


async def test_a_natural_end_while_a_call_is_open_completes() -> None:
    adapter = Gated(
        [ToolCallStart(key=0, name="f", call_id="c1"), ToolCallArgsDelta(key=0, delta="{}")],
        [Usage(input_tokens=1, output_tokens=1), Finish("tool_calls")],
    )
    turn = make_turn(route(adapter), tools=[{"type": "function", "name": "f"}])
    task, _ = await start(turn, "response.function_call_arguments.delta")
    turn.stop("steered")
    adapter.gate.set()
    result = await asyncio.wait_for(task, 5)
    assert result.status == "completed"  # the upstream ended on its own: nothing was cut
    assert required_input(result.output) == [{"type": "function_call_output", "call_id": "c1", "name": "f"}]


# -- steering input -------------------------------------------------------------------------------
def test_steer_items_accept_what_the_sdk_documents() -> None:
    assert steer_items("hi", 10) == [{"type": "message", "role": "user", "content": "hi"}]
    parts = [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"},
        {"type": "input_file", "filename": "a.txt", "file_data": "data:text/plain;base64,aGk="},
    ]
    items = steer_items(
        [{"role": "user", "content": parts}, {"type": "message", "role": "user", "content": "x"}], 10
    )
    assert items == [
        {"type": "message", "role": "user", "content": parts},
        {"type": "message", "role": "user", "content": "x"},
    ]
    with pytest.raises(InvalidRequest):
        steer_items([{"role": "user", "content": "x"}] * 3, 2)


def test_steering_goes_after_the_tool_results_that_open_a_continuation() -> None:
    steering = [{"type": "message", "role": "user", "content": "s"}]
    out = {"type": "function_call_output", "call_id": "c", "output": "x"}
    assert with_steering([out, {"role": "user", "content": "own"}], steering) == [
        out,
        *steering,
        {"role": "user", "content": "own"},
    ]
    assert with_steering("own", steering) == [
        *steering,
        {"type": "message", "role": "user", "content": "own"},
    ]
    assert with_steering(None, steering) == steering


# -- the socket's book of steerable responses -------------------------------------------------------
def test_the_book_keeps_a_bounded_memory_of_finished_and_waiting_responses() -> None:
    book = SteerBook(max_pending=8, max_items=100)
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    for n in range(300):
        target = book.open(f"resp_{n}", "lane" if n % 2 else None, cast(Turn, None), {})
        waits = n >= 200  # the last hundred stop for a tool result that never comes
        target.result = cast(
            TurnResult, SimpleNamespace(ended=True, status="completed", output=[call] if waits else [])
        )
        assert book.after_turn(target, closing=False) == ([], None)
    assert len(book.finished) == 128 and len(book.targets) == 64

    def code(rid: str) -> tuple[str, str | None]:
        [event] = book.submit({"type": "response.steer", "previous_response_id": rid, "input": "x"})
        return event.get("error", {}).get("code", event["type"]), event.get("stream_id")

    assert code("resp_0") == ("response_not_found", None)  # forgotten
    assert code("resp_199") == ("response_already_completed", "lane")
    assert code("resp_200") == ("response_not_active", None)  # given up on (the oldest waiting)
    accepted, pending = book.submit(
        {"type": "response.steer", "previous_response_id": "resp_299", "input": "x"}
    )
    assert (accepted["type"], pending["type"]) == ("response.steer.accepted", "response.steer.pending")
    assert accepted["stream_id"] == "lane" and pending["required_input"][0]["call_id"] == "c"


def test_steering_of_a_response_that_completes_anyway_goes_to_a_successor() -> None:
    book = SteerBook(max_pending=8, max_items=100)

    class Late:  # a turn whose outcome was already decided when the steer came
        def stop(self, reason: str) -> bool:
            return False

    data = {"model": "m", "input": "first", "instructions": "be brief", "tools": []}
    target = book.open("resp_a", "s", cast(Turn, Late()), data)
    [accepted] = book.submit({"type": "response.steer", "previous_response_id": "resp_a", "input": "more"})
    target.result = cast(TurnResult, SimpleNamespace(ended=True, status="completed", output=[]))
    events, handoff = book.after_turn(target, closing=False)
    assert events == [] and handoff is not None and handoff.automatic
    assert handoff.successor() == {
        "model": "m",
        "input": [{"type": "message", "role": "user", "content": "more"}],
        "instructions": "be brief",
        "tools": [],
        "type": "response.create",
        "previous_response_id": "resp_a",
    }
    # closing instead (drain, age limit): the input comes back
    other = book.open("resp_b", None, cast(Turn, Late()), data)
    book.submit({"type": "response.steer", "previous_response_id": "resp_b", "input": "more"})
    other.result = cast(TurnResult, SimpleNamespace(ended=True, status="completed", output=[]))
    [failed], none = book.after_turn(other, closing=True)
    assert none is None and failed["error"]["code"] == "successor_creation_failed"
    assert failed["steer"]["input"] == "more" and accepted["steer"]["id"] != failed["steer"]["id"]
