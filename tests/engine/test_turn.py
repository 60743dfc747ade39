"""The one turn runner: open (retries, fallbacks) → events → drain, and its end-of-turn hooks, which
run exactly once whatever the outcome, before the terminal event of a turn that reached one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from adapters.base import UpstreamRequest
from adapters.deltas import Delta, Finish, TextDelta, ToolCallArgsDelta, ToolCallStart, Usage
from gateway.engine.context import Context
from gateway.engine.resource import new_resource
from gateway.engine.routing import Route
from gateway.engine.turn import Turn, TurnResult
from gateway.kernel.errors import ServiceUnavailable, UpstreamError, UpstreamRejected, UpstreamTimeout
from gateway.kernel.settings import RetrySettings
from gateway.kernel.spec.request import CreateResponseBody

Event = dict[str, Any]


class Scripted:
    """An adapter that answers each call with the next script: a list of deltas, or an exception
    raised before the first delta. ``hold`` parks the stream after its deltas until released."""

    def __init__(self, *scripts: list[Delta] | Exception, hold: asyncio.Event | None = None) -> None:
        self.scripts = list(scripts)
        self.models: list[str] = []
        self.closed = 0
        self.hold = hold

    async def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
        self.models.append(request.model)
        script = self.scripts.pop(0)
        try:
            if isinstance(script, Exception):
                raise script
            for delta in script:
                yield delta
            if self.hold is not None:
                await asyncio.Event().wait()  # until cancelled
        finally:
            self.closed += 1

    async def aclose(self) -> None:
        return None


def route(
    adapter: Any,
    *,
    model: str = "m",
    attempts: int = 0,
    fallbacks: tuple[Route, ...] = (),
    total: float = 600.0,
) -> Route:
    return Route(
        total_seconds=total,
        model=model,
        provider=f"p-{model}",
        adapter=adapter,
        upstream_model=f"up-{model}",
        retry=RetrySettings(attempts=attempts, backoff_base=0, backoff_max=0),
        fallbacks=fallbacks,
    )


def make_turn(r: Route, *, error_event: bool = True, **body: Any) -> Turn:
    parsed = CreateResponseBody.model_validate({"model": r.model, "input": "hi", **body})
    resource = new_resource(parsed, response_id="resp_1", model=r.model, store=False)
    request = UpstreamRequest(
        model=r.upstream_model,
        items=[],
        tools=resource["tools"],
        tool_choice=resource["tool_choice"],
    )
    return Turn(
        request=request,
        route=r,
        context=Context(history=[], new_items=[]),
        resource=resource,
        max_events=1000,
        error_event=error_event,
    )


class Tap:
    """Collects emitted events and every hook call (with the events emitted by then)."""

    def __init__(self, turn: Turn) -> None:
        self.events: list[Event] = []
        self.calls: list[tuple[str, str, int]] = []
        self.streaming = asyncio.Event()
        turn.on_end(self.hook("first"))
        turn.on_end(self.hook("second"))

    def hook(self, name: str) -> Any:
        def record(result: TurnResult) -> None:
            self.calls.append((name, result.status, len(self.events)))

        return record

    async def emit(self, event: Event) -> None:
        self.events.append(event)
        if event["type"] == "response.output_text.delta":
            self.streaming.set()

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]


def assert_numbered(events: list[Event]) -> None:
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


async def test_hooks_run_once_in_order_before_the_terminal_event() -> None:
    turn = make_turn(route(Scripted([TextDelta("hel"), TextDelta("lo"), Usage(3, 2), Finish("stop")])))
    tap = Tap(turn)
    result = await turn.run(tap.emit)
    assert result.status == "completed" and result.ended and result.started
    assert result.usage is not None and result.usage["total_tokens"] == 5
    assert result.output[0]["content"][0]["text"] == "hello"
    assert tap.types()[-1] == "response.completed"
    # the hooks ran once each, in order, before the terminal event (and the closes before it) went out
    assert [c[:2] for c in tap.calls] == [("first", "completed"), ("second", "completed")]
    assert all(seen < tap.types().index("response.completed") for _, _, seen in tap.calls)
    assert_numbered(tap.events)


async def test_a_failure_while_opening_raises_and_emits_nothing() -> None:
    adapter = Scripted(UpstreamRejected("no", code="upstream_invalid_request"))
    turn = make_turn(route(adapter))
    tap = Tap(turn)
    opened = False

    async def on_open() -> None:
        nonlocal opened
        opened = True

    with pytest.raises(UpstreamRejected):
        await turn.run(tap.emit, opened=on_open)
    assert not opened and tap.events == []
    assert tap.calls == [("first", "failed", 0), ("second", "failed", 0)]
    assert turn.result.error is not None and not turn.result.started
    assert adapter.closed == 1


@pytest.mark.parametrize("error_event", [True, False])
async def test_a_failure_mid_stream_ends_with_one_terminal_event(error_event: bool) -> None:
    class Broken(Scripted):
        async def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
            yield TextDelta("partial")
            raise UpstreamError("lost", code="upstream_error")

    turn = make_turn(route(Broken()), error_event=error_event)
    tap = Tap(turn)
    result = await turn.run(tap.emit)
    assert result.status == "failed" and result.error is not None
    expected_tail = ["error", "response.failed"] if error_event else ["response.failed"]
    assert tap.types()[-len(expected_tail) :] == expected_tail
    assert "error" not in tap.types()[: -len(expected_tail)]
    assert_numbered(tap.events)  # no gap, whichever events the transport gets
    assert [c[1] for c in tap.calls] == ["failed", "failed"]


async def test_a_hook_that_cannot_keep_its_promise_revokes_the_terminal_event() -> None:
    turn = make_turn(route(Scripted([TextDelta("x"), Finish("stop")])))
    seen: list[str] = []

    def store(result: TurnResult) -> None:
        raise ServiceUnavailable("The state store is unavailable.")

    turn.on_end(store)
    turn.on_end(lambda result: seen.append(result.status))
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    result = await turn.run(emit)
    assert result.status == "failed" and isinstance(result.error, ServiceUnavailable)
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert "response.completed" not in [e["type"] for e in events]
    assert_numbered(events)
    assert seen == ["failed"]


async def test_a_cancelled_turn_closes_the_upstream_and_ends_once() -> None:
    adapter = Scripted([TextDelta("x")], hold=asyncio.Event())
    turn = make_turn(route(adapter))
    tap = Tap(turn)
    task = asyncio.create_task(turn.run(tap.emit))
    await asyncio.wait_for(tap.streaming.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [c[1] for c in tap.calls] == ["cancelled", "cancelled"]
    assert adapter.closed == 1
    assert not any(t.startswith("response.completed") for t in tap.types())


async def test_retries_then_falls_back_without_touching_the_request() -> None:
    retryable = UpstreamError("busy", retryable=True, upstream_status=503)
    primary = Scripted(retryable, UpstreamError("busy", retryable=True, upstream_status=503))
    backup = Scripted([TextDelta("from backup"), Finish("stop")])
    r = route(primary, attempts=1, fallbacks=(route(backup, model="b"),))
    turn = make_turn(r)
    result = await turn.run()
    assert result.status == "completed" and result.provider == "p-b"
    assert primary.models == ["up-m", "up-m"] and backup.models == ["up-b"]
    assert turn.request.model == "up-m"  # each route got its own copy of the request
    assert result.output[0]["content"][0]["text"] == "from backup"


async def test_a_call_to_a_tool_the_choice_does_not_permit_is_dropped() -> None:
    tools = [
        {"type": "function", "name": "ok", "parameters": {"type": "object"}},
        {"type": "function", "name": "no", "parameters": {"type": "object"}},
    ]
    script: list[Delta] = [
        ToolCallStart(key=0, name="no", call_id="c0"),
        ToolCallArgsDelta(key=0, delta="{}"),
        ToolCallStart(key=1, name="ok", call_id="c1"),
        ToolCallArgsDelta(key=1, delta="{}"),
        Finish("tool_calls"),
    ]
    choice = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "ok"}]}
    turn = make_turn(route(Scripted(script)), tools=tools, tool_choice=choice)
    result = await turn.run()
    assert [o["name"] for o in result.output] == ["ok"]
    assert result.status == "completed"


async def test_the_total_deadline_bounds_retries_and_skips_a_retry_after_past_it() -> None:
    later = UpstreamError("busy", retryable=True, retry_after=30.0, upstream_status=429)
    adapter = Scripted(later, later, later)
    turn = make_turn(route(adapter, attempts=2, total=5.0))
    t0 = time.monotonic()
    with pytest.raises(UpstreamError) as caught:
        await turn.run()
    assert time.monotonic() - t0 < 2  # the 30 s Retry-After was not waited for
    assert caught.value.retry_after == 30.0  # it is passed on to the client instead
    assert len(adapter.models) == 1


async def test_the_total_deadline_bounds_a_hung_upstream_across_attempts() -> None:
    class Hung(Scripted):
        """Like every adapter, bounds its call by what is left of the request's deadline."""

        async def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
            self.models.append(request.model)
            await asyncio.sleep(request.seconds_left(60.0))
            raise UpstreamTimeout("no answer", retryable=True)
            yield TextDelta("never")

    adapter = Hung()
    turn = make_turn(route(adapter, attempts=3, total=0.3))
    t0 = time.monotonic()
    with pytest.raises(UpstreamError) as caught:
        await turn.run()
    assert caught.value.code == "upstream_timeout"
    assert time.monotonic() - t0 < 1.5
    assert len(adapter.models) == 1  # no retry starts after the deadline


async def test_an_event_the_transport_cannot_encode_still_ends_with_a_terminal_event() -> None:
    turn = make_turn(route(Scripted([TextDelta("a"), TextDelta("b"), Finish("stop")])))
    sent: list[Event] = []

    async def emit(event: Event) -> None:
        if event["type"] == "response.output_text.delta":
            raise TypeError("cannot serialize")
        sent.append(event)

    result = await turn.run(emit)
    assert result.status == "failed" and result.error is not None
    assert result.error.code == "server_error"
    assert [e["type"] for e in sent][-2:] == ["error", "response.failed"]
