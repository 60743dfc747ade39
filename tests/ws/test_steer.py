"""``response.steer`` over a raw WebSocket: the exact events and fields, the safe boundary (text cut
where it is, a function call's arguments never cut), the automatic successor (settings inherited,
chained by previous_response_id, cache and store), pending steering after a tool call, and every
failure code."""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import ClientConnection

from adapters.base import UpstreamRequest
from adapters.deltas import Delta, Finish, TextDelta, ToolCallArgsDelta, ToolCallStart, Usage
from gateway.kernel.errors import UpstreamError
from tests.harness import ServedApp
from tests.ws.helpers import assert_clean_turn, create, install, serve, ws_connect

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ARGS = ['{"ci', 'ty": ', '"Par', 'is"}']

Script = Sequence[Delta | float] | UpstreamError  # a float: a pause of that many seconds


def words(n: int) -> list[Delta]:
    return [*(TextDelta(f"w{i} ") for i in range(n)), Usage(input_tokens=3, output_tokens=n), Finish("stop")]


def call_then_text(call_id: str = "call_a") -> list[Delta]:
    """A function call whose arguments stream in four pieces, then text (which a stop never reaches)."""
    return [
        ToolCallStart(key=0, name="get_weather", call_id=call_id),
        *(ToolCallArgsDelta(key=0, delta=p) for p in ARGS),
        TextDelta("after the call"),
        Finish("tool_calls"),
    ]


class Paced:
    """A model whose calls play ``scripts`` in turn (then ``words(3)``), ``delay`` seconds between
    deltas; an ``UpstreamError`` script refuses the call. Keeps each request and each close (the
    generator's ``finally`` is where a real adapter drops its upstream connection); ``close_delay``
    makes that close slow, as a real upstream's may be."""

    def __init__(self, *scripts: Script, delay: float = 0.2, close_delay: float = 0.0) -> None:
        self.scripts = list(scripts)
        self.delay = delay
        self.close_delay = close_delay
        self.requests: list[UpstreamRequest] = []
        self.closed: list[int] = []
        self.started = threading.Event()

    async def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
        n = len(self.requests)
        self.requests.append(copy.deepcopy(request))
        script = self.scripts.pop(0) if self.scripts else words(3)
        if isinstance(script, UpstreamError):
            raise script
        self.started.set()
        try:
            for delta in script:
                if isinstance(delta, float):
                    await asyncio.sleep(delta)
                    continue
                yield delta
                await asyncio.sleep(self.delay)
        finally:
            if self.close_delay:
                await asyncio.sleep(self.close_delay)
            self.closed.append(n)

    async def aclose(self) -> None:
        return None


@pytest.fixture(scope="module")
def gw() -> Iterator[ServedApp]:
    with serve({"limits": {"ws_max_pending_steers": 2}}) as served:
        yield served


_models = iter(range(10_000))


def model(served: ServedApp, adapter: Any) -> str:
    name = f"paced-{next(_models)}"
    install(served, name, adapter)
    return name


async def recv(ws: ClientConnection, wait: float = 20.0) -> dict[str, Any]:
    raw = await asyncio.wait_for(ws.recv(), wait)
    assert isinstance(raw, str)
    event: dict[str, Any] = orjson.loads(raw)
    return event


async def until(ws: ClientConnection, done: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """Messages through the first one ``done`` accepts."""
    out: list[dict[str, Any]] = []
    while True:
        out.append(await recv(ws))
        if done(out[-1]):
            return out


def typed(kind: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["type"] == kind


def steer(previous: str, input_: Any, **extra: Any) -> str:
    return orjson.dumps(
        {"type": "response.steer", "previous_response_id": previous, "input": input_, **extra}
    ).decode()


def text_of(item: dict[str, Any]) -> str:
    """The text of a transcript item (normalized: content is a list of typed parts)."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [])


async def first_created(ws: ClientConnection, **body: Any) -> dict[str, Any]:
    await ws.send(create(**body))
    [*_, created] = await until(ws, typed("response.created"))
    return created["response"]


# -- the safe boundary: text ----------------------------------------------------------------------
async def test_steer_mid_text_cuts_at_the_text_so_far_and_starts_the_successor(gw: ServedApp) -> None:
    paced = Paced(words(40), words(2), delay=0.15)
    name = model(gw, paced)
    async with ws_connect(gw) as ws:
        first = await first_created(
            ws, model=name, input="Tell me a story.", instructions="Be brief.", store=False, temperature=0.5
        )
        head = await until(ws, typed("response.output_text.delta"))
        await ws.send(steer(first["id"], "Actually, make it about a cat."))
        events = await until(ws, lambda e: e["type"] == "response.completed")
    assert first["status"] == "in_progress"
    kinds = [e["type"] for e in events]
    accepted = events[kinds.index("response.steer.accepted")]
    assert set(accepted) == {"type", "sequence_number", "steer"}
    assert accepted["steer"]["previous_response_id"] == first["id"]
    assert accepted["steer"]["id"].startswith("steer_")
    cut = kinds.index("response.incomplete")
    closing = [k for k in kinds[:cut] if not k.endswith(".delta") and k != "response.steer.accepted"]
    assert closing == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    steered = events[cut]["response"]
    assert steered["status"] == "incomplete" and steered["incomplete_details"] == {"reason": "steered"}
    deltas = [e["delta"] for e in head + events[:cut] if e["type"] == "response.output_text.delta"]
    text = "".join(deltas)
    assert 0 < len(deltas) < 40
    [done] = [e for e in events[:cut] if e["type"] == "response.output_text.done"]
    assert done["text"] == text
    [message] = steered["output"]
    assert message["status"] == "incomplete" and message["content"][0]["text"] == text
    # The steered response's own events: numbered from 0 without gaps, one terminal.
    own = [e for e in [*head, *events[: cut + 1]] if e["type"] != "response.steer.accepted"]
    assert [e["sequence_number"] for e in own] == list(range(1, 1 + len(own)))
    # The successor: inherits the settings, continues the steered response, commits the input.
    successor = events[cut + 1]
    assert successor["type"] == "response.created" and successor["sequence_number"] == 0
    s = successor["response"]
    assert s["id"] != steered["id"] and s["previous_response_id"] == steered["id"]
    assert (s["model"], s["instructions"], s["temperature"], s["store"]) == (name, "Be brief.", 0.5, False)
    assert_clean_turn(events[cut + 1 :])
    assert not any("stream_id" in e for e in events)  # the default lane
    # Upstream: the first call was cancelled before it ended; the successor ran on the whole chain.
    assert paced.closed[0] == 0 and len(paced.requests) == 2
    transcript = paced.requests[1].items
    assert [(i.get("role"), i["type"]) for i in transcript] == [
        ("user", "message"),
        ("assistant", "message"),
        ("user", "message"),
    ]
    assert text_of(transcript[1]) == text
    assert text_of(transcript[2]) == "Actually, make it about a cat."
    assert paced.requests[1].instructions == "Be brief." and paced.requests[1].temperature == 0.5


async def test_several_steers_before_the_successor_all_go_into_it_in_order(gw: ServedApp) -> None:
    # A slow upstream close keeps the steered turn ending while the second steer arrives.
    paced = Paced(words(40), words(2), delay=0.15, close_delay=0.5)
    name = model(gw, paced)
    async with ws_connect(gw) as ws:
        first = await first_created(ws, model=name, input="Go.", store=False)
        await until(ws, typed("response.output_text.delta"))
        await ws.send(steer(first["id"], "one"))
        await ws.send(
            steer(first["id"], [{"role": "user", "content": [{"type": "input_text", "text": "two"}]}])
        )
        events = await until(ws, typed("response.completed"))
    accepted = [e for e in events if e["type"] == "response.steer.accepted"]
    assert len(accepted) == 2 and accepted[0]["steer"]["id"] != accepted[1]["steer"]["id"]
    assert [e["type"] for e in events].count("response.created") == 1
    steering = paced.requests[1].items[2:]
    assert [text_of(i) for i in steering] == ["one", "two"]


async def test_a_steer_that_arrives_while_the_successor_is_created_steers_the_successor(
    gw: ServedApp,
) -> None:
    paced = Paced(words(40), [0.8, *words(30)], words(2), delay=0.15)  # the successor is slow to open
    name = model(gw, paced)
    async with ws_connect(gw) as ws:
        first = await first_created(ws, model=name, input="Go.", store=False)
        await until(ws, typed("response.output_text.delta"))
        await ws.send(steer(first["id"], "one"))
        await until(ws, typed("response.incomplete"))
        await ws.send(steer(first["id"], "two"))  # the successor is not created yet
        events = await until(ws, typed("response.completed"))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.steer.accepted"
    successor = events[kinds.index("response.created")]["response"]
    assert successor["previous_response_id"] == first["id"]
    [cut] = [e["response"] for e in events if e["type"] == "response.incomplete"]
    assert cut["id"] == successor["id"] and cut["incomplete_details"] == {"reason": "steered"}
    assert cut["output"] == []  # stopped before its first delta
    final = events[-1]["response"]
    assert final["previous_response_id"] == successor["id"]
    assert [text_of(i) for i in paced.requests[1].items if i.get("role") == "user"] == ["Go.", "one"]
    assert [text_of(i) for i in paced.requests[2].items if i.get("role") == "user"] == ["Go.", "one", "two"]


async def test_steer_on_a_lane_with_store_true_is_stored_incomplete_and_chained(gw: ServedApp) -> None:
    paced = Paced(words(40), words(2), delay=0.15)
    name = model(gw, paced)
    async with ws_connect(gw) as ws:
        first = await first_created(ws, model=name, input="Go.", store=True, stream_id="lane-7")
        await until(ws, typed("response.output_text.delta"))
        await ws.send(steer(first["id"], "Stop and summarize."))
        events = await until(ws, typed("response.completed"))
        # The chain goes on from the successor, through the store as well as the cache.
        third = await first_created(
            ws, model=name, input="Thanks.", store=True, previous_response_id=events[-1]["response"]["id"]
        )
        await until(ws, typed("response.completed"))
    assert all(e["stream_id"] == "lane-7" for e in events)
    [steered] = [e["response"] for e in events if e["type"] == "response.incomplete"]
    async with httpx.AsyncClient(base_url=gw.base_url) as http:
        stored = (await http.get(f"/v1/responses/{steered['id']}")).json()
    assert stored["status"] == "incomplete" and stored["incomplete_details"] == {"reason": "steered"}
    assert stored["output"] == steered["output"]
    assert third["previous_response_id"] == events[-1]["response"]["id"]
    roles = [i.get("role") for i in paced.requests[2].items]
    assert roles == ["user", "assistant", "user", "assistant", "user"]


# -- the safe boundary: a function call -----------------------------------------------------------
async def test_a_call_in_progress_finishes_before_the_stop_then_the_steer_is_pending(gw: ServedApp) -> None:
    paced = Paced(call_then_text(), delay=0.25)
    name = model(gw, paced)
    async with ws_connect(gw) as ws:
        first = await first_created(ws, model=name, input="Weather?", tools=[TOOL], store=False)
        await until(ws, typed("response.function_call_arguments.delta"))  # the first piece
        await ws.send(steer(first["id"], "Use Celsius."))
        events = await until(ws, typed("response.steer.pending"))
        kinds = [e["type"] for e in events]
        assert kinds.index("response.steer.accepted") < kinds.index("response.function_call_arguments.done")
        [args_done] = [e for e in events if e["type"] == "response.function_call_arguments.done"]
        assert args_done["arguments"] == "".join(ARGS)  # never cut
        cut = kinds.index("response.incomplete")
        assert kinds[cut - 2 : cut] == ["response.function_call_arguments.done", "response.output_item.done"]
        steered = events[cut]["response"]
        assert steered["incomplete_details"] == {"reason": "steered"}
        [call] = steered["output"]  # the text after the call was never produced
        assert call["type"] == "function_call" and call["status"] == "completed"
        pending = events[-1]
        assert kinds[cut + 1 :] == ["response.steer.pending"]
        assert pending["reason"] == "waiting_for_required_input"
        assert pending["required_input"] == [
            {"type": "function_call_output", "call_id": "call_a", "name": "get_weather"}
        ]
        assert pending["steer"] == events[kinds.index("response.steer.accepted")]["steer"]
        assert paced.closed == [0] and len(paced.requests) == 1  # cancelled, and no successor
        # The client's continuation carries the tool result; the steering joins it.
        output = {"type": "function_call_output", "call_id": "call_a", "output": "18C"}
        await ws.send(create(model=name, input=[output], store=False, previous_response_id=steered["id"]))
        cont = await until(ws, typed("response.completed"))
        assert_clean_turn(cont)
        await ws.send(steer(steered["id"], "more"))  # committed: the response is done with
        late = await recv(ws)
    items = paced.requests[1].items
    assert [i["type"] for i in items] == ["message", "function_call", "function_call_output", "message"]
    assert text_of(items[3]) == "Use Celsius."
    assert late["type"] == "response.steer.failed" and late["error"]["code"] == "response_not_active"


async def test_steer_after_a_tool_call_is_pending_and_prepended_to_the_continuation(gw: ServedApp) -> None:
    paced = Paced([*call_then_text()[:5], Finish("tool_calls")], delay=0.01)
    name = model(gw, paced)
    async with ws_connect(gw) as ws:
        await ws.send(create(model=name, input="Weather?", tools=[TOOL], store=True, stream_id="s"))
        r1 = (await until(ws, typed("response.completed")))[-1]["response"]
        assert r1["output"][0]["type"] == "function_call"
        await ws.send(steer(r1["id"], "first"))
        one = [await recv(ws), await recv(ws)]
        await ws.send(steer(r1["id"], [{"type": "message", "role": "user", "content": "second"}]))
        two = [await recv(ws), await recv(ws)]
        await ws.send(steer(r1["id"], "third"))  # the module's cap is 2
        three = await recv(ws)
        output = {"type": "function_call_output", "call_id": "call_a", "output": "sunny"}
        await ws.send(
            create(
                model=name,
                input=[output, {"role": "user", "content": "and tomorrow?"}],
                store=True,
                stream_id="s",
                previous_response_id=r1["id"],
                instructions="Own settings.",
            )
        )
        cont = await until(ws, typed("response.completed"))
    for pair in (one, two):
        assert [e["type"] for e in pair] == ["response.steer.accepted", "response.steer.pending"]
        assert all(e["stream_id"] == "s" for e in pair)
        assert pair[0]["steer"] == pair[1]["steer"]
        assert pair[1]["required_input"] == [
            {"type": "function_call_output", "call_id": "call_a", "name": "get_weather"}
        ]
    assert three["type"] == "response.steer.failed"
    assert three["error"] == {
        "type": "invalid_request_error",
        "code": "too_many_pending_steers",
        "message": three["error"]["message"],
    }
    assert (
        three["steer"] == {"previous_response_id": r1["id"], "input": "third"} and three["stream_id"] == "s"
    )
    assert cont[0]["response"]["instructions"] == "Own settings."
    items = paced.requests[1].items
    assert [(i["type"], text_of(i)) for i in items[2:]] == [
        ("function_call_output", ""),
        ("message", "first"),
        ("message", "second"),
        ("message", "and tomorrow?"),
    ]


# -- failures ----------------------------------------------------------------------------------------
BAD_INPUTS = [
    ("", "empty"),
    ([], "empty list"),
    ([{"role": "assistant", "content": "x"}], "assistant"),
    ([{"role": "system", "content": "x"}], "system"),
    ([{"type": "function_call_output", "call_id": "c", "output": "x"}], "tool output"),
    ([{"role": "user", "content": "x", "id": "msg_1"}], "extra field"),
    ([{"role": "user", "content": [{"type": "output_text", "text": "x"}]}], "output part"),
    ([{"role": "user", "content": 5}], "content type"),
    ({"role": "user", "content": "x"}, "not a list"),
    (None, "missing"),
]


async def test_invalid_steering_input_fails_with_the_input_returned(gw: ServedApp) -> None:
    paced = Paced([*call_then_text()[:5], Finish("tool_calls")], delay=0.01)
    name = model(gw, paced)
    async with ws_connect(gw) as ws:
        await ws.send(create(model=name, input="Weather?", tools=[TOOL], stream_id="x"))
        r1 = (await until(ws, typed("response.completed")))[-1]["response"]
        answers = []
        for value, _ in BAD_INPUTS:
            await ws.send(steer(r1["id"], value))
            answers.append(await recv(ws))
        await ws.send(steer(r1["id"], "x", stream_id="x"))  # the target decides the lane
        answers.append(await recv(ws))
        await ws.send(orjson.dumps({"type": "response.steer", "input": "x"}).decode())
        answers.append(await recv(ws))
    for (value, why), event in zip(
        [*BAD_INPUTS, ("x", "stream_id"), ("x", "no target")], answers, strict=True
    ):
        assert event["type"] == "response.steer.failed", why
        assert event["error"]["code"] == "invalid_input", why
        assert event["error"]["type"] == "invalid_request_error" and event["error"]["message"], why
        assert "id" not in event["steer"] and event["steer"]["input"] == value, why
        assert isinstance(event["sequence_number"], int)
    assert all(e["stream_id"] == "x" for e in answers[:-1])
    assert "stream_id" not in answers[-1] and answers[-1]["steer"]["previous_response_id"] == ""


async def test_not_found_already_completed_and_not_active(gw: ServedApp) -> None:
    name = model(gw, Paced(words(2), words(40), delay=0.01))
    async with ws_connect(gw) as ws:
        await ws.send(steer("resp_nowhere", "x"))
        missing = await recv(ws)
        await ws.send(create(model=name, input="hi", store=False))
        done = (await until(ws, typed("response.completed")))[-1]["response"]
        await ws.send(steer(done["id"], "x"))
        completed = await recv(ws)
        await ws.send(create(model="mock", input="x" * 100, max_output_tokens=16, store=False))
        cut = (await until(ws, typed("response.incomplete")))[-1]["response"]
        await ws.send(steer(cut["id"], "x"))
        inactive = await recv(ws)
    assert missing["error"]["code"] == "response_not_found" and "stream_id" not in missing
    assert missing["steer"] == {"previous_response_id": "resp_nowhere", "input": "x"}
    assert completed["error"]["code"] == "response_already_completed"
    assert inactive["error"]["code"] == "response_not_active"
    assert {e["type"] for e in (missing, completed, inactive)} == {"response.steer.failed"}


async def test_a_successor_that_cannot_be_created_returns_the_input(gw: ServedApp) -> None:
    refused = UpstreamError("The upstream refused.", code="upstream_error", retryable=False)
    paced = Paced(words(40), refused, delay=0.15)
    name = model(gw, paced)
    async with ws_connect(gw) as ws:
        first = await first_created(ws, model=name, input="Go.", store=False, stream_id="b")
        await until(ws, typed("response.output_text.delta"))
        await ws.send(steer(first["id"], [{"role": "user", "content": "redo"}]))
        events = await until(ws, typed("response.steer.failed"))
        await ws.send(create(model=name, input="still here", store=False, stream_id="b"))
        after = await until(ws, typed("response.completed"))
    kinds = [e["type"] for e in events]
    assert "response.incomplete" in kinds and "error" not in kinds and kinds.count("response.created") == 0
    failed = events[-1]
    accepted = events[kinds.index("response.steer.accepted")]
    assert failed["error"]["code"] == "successor_creation_failed"
    assert "The upstream refused." in failed["error"]["message"]
    assert failed["steer"] == {
        "id": accepted["steer"]["id"],
        "previous_response_id": first["id"],
        "input": [{"role": "user", "content": "redo"}],
    }
    assert failed["stream_id"] == "b"
    assert_clean_turn(after)  # the socket and the lane go on


async def test_a_failed_continuation_returns_the_pending_input_after_its_envelope(gw: ServedApp) -> None:
    name = model(gw, Paced([*call_then_text()[:5], Finish("tool_calls")], delay=0.01))
    async with ws_connect(gw) as ws:
        await ws.send(create(model=name, input="Weather?", tools=[TOOL], store=False))
        r1 = (await until(ws, typed("response.completed")))[-1]["response"]
        await ws.send(steer(r1["id"], "pending one"))
        await until(ws, typed("response.steer.pending"))
        output = {"type": "function_call_output", "call_id": "call_a", "output": "x"}
        await ws.send(
            create(model="no-such-model", input=[output], previous_response_id=r1["id"], store=False)
        )
        envelope, failed = await recv(ws), await recv(ws)
    assert envelope["type"] == "error" and envelope["error"]["code"] == "model_not_found"
    assert failed["type"] == "response.steer.failed"
    assert failed["error"]["code"] == "successor_creation_failed"
    assert failed["steer"]["input"] == "pending one" and failed["steer"]["id"].startswith("steer_")
