"""Lanes (``stream_id``) over a raw WebSocket: every event of a lane's turn echoes its stream_id
(error envelopes too) while the default lane's carry none, creates on one lane run FIFO and lanes
overlap in time, the lane cap and the queue bound count across lanes, lineage crosses lanes,
and the age limit waits for every lane."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from gateway.kernel.settings import Settings
from tests.harness import ServedApp
from tests.ws.helpers import (
    Recorder,
    Slow,
    assert_clean_turn,
    assert_envelope,
    create,
    install,
    output_text,
    read_turn,
    serve,
    ws_connect,
)
from tests.ws.test_connection import served_with_drain
from tests.ws.test_steer import Paced, words


async def recv(ws: ClientConnection, wait: float = 20.0) -> dict[str, Any]:
    raw = await asyncio.wait_for(ws.recv(), wait)
    assert isinstance(raw, str)
    event: dict[str, Any] = orjson.loads(raw)
    return event


async def collect(ws: ClientConnection, terminals: int) -> list[dict[str, Any]]:
    """Messages until ``terminals`` turns have ended (terminal events or envelopes)."""
    out: list[dict[str, Any]] = []
    while sum(e["type"] in ("response.completed", "response.incomplete", "error") for e in out) < terminals:
        out.append(await recv(ws))
    return out


def lane(events: list[dict[str, Any]], sid: str | None) -> list[dict[str, Any]]:
    return [e for e in events if e.get("stream_id") == sid]


async def test_lane_events_echo_the_stream_id_and_the_default_lane_is_unchanged(gw: ServedApp) -> None:
    async with ws_connect(gw) as ws:
        await ws.send(create(model="mock", input="hello", store=False))
        plain = await read_turn(ws)
        await ws.send(create(model="mock", input="hello", store=False, stream_id="a"))
        laned = await read_turn(ws)
        await ws.send(create(model="nope", input="x", stream_id="a"))
        envelope = await recv(ws)
        await ws.send(create(model="mock", input="x", stream_id=7))
        bad = await recv(ws)
    assert not any("stream_id" in e for e in plain)
    assert all(e["stream_id"] == "a" for e in laned)
    # The same events otherwise: the default lane is the lane without the field.
    strip = [{k: v for k, v in e.items() if k != "stream_id"} for e in laned]
    assert [e["type"] for e in strip] == [e["type"] for e in plain]
    assert output_text(assert_clean_turn(strip)) == output_text(assert_clean_turn(plain))
    assert list(laned[0]) == [*plain[0], "stream_id"]  # appended as encoded, nothing else moved
    assert_envelope(envelope, 400, "model_not_found")
    assert envelope["stream_id"] == "a"
    assert_envelope(bad, 400, "invalid_value", param="stream_id")
    assert "stream_id" not in bad


async def test_two_lanes_overlap_in_time_and_one_lane_is_fifo() -> None:
    with serve() as served:
        install(served, "slow", Slow(pieces=8, delay=0.1))
        async with ws_connect(served) as ws:
            await ws.send(create(model="slow", input="a1", store=False, stream_id="a"))
            await ws.send(create(model="slow", input="b1", store=False, stream_id="b"))
            await ws.send(create(model="slow", input="a2", store=False, stream_id="a"))
            events = await collect(ws, 3)
    a, b = lane(events, "a"), lane(events, "b")
    assert len(a) + len(b) == len(events)
    order = [(e["stream_id"], e["type"]) for e in events]
    # b started before a's first response ended: the two lanes overlapped on the one socket...
    assert order.index(("b", "response.created")) < order.index(("a", "response.completed"))
    # ...and a's second create waited for its first.
    a_terminals = [n for n, e in enumerate(a) if e["type"] == "response.completed"]
    a_created = [n for n, e in enumerate(a) if e["type"] == "response.created"]
    assert a_created[1] > a_terminals[0]
    assert_clean_turn(a[: a_terminals[0] + 1])
    assert_clean_turn(a[a_terminals[0] + 1 :])
    assert_clean_turn(b)


async def test_the_lane_cap_refuses_a_new_lane_with_an_envelope_on_that_lane() -> None:
    with serve({"limits": {"ws_max_lanes": 2}}) as served:
        install(served, "slow", Slow(pieces=5, delay=0.1))
        async with ws_connect(served) as ws:
            await ws.send(create(model="slow", input="x", store=False))  # the default lane counts
            await ws.send(create(model="slow", input="x", store=False, stream_id="b"))
            await ws.send(create(model="slow", input="x", store=False, stream_id="c"))
            events = await collect(ws, 3)
            await ws.send(create(model="slow", input="x", store=False, stream_id="c"))  # room again
            later = await read_turn(ws)
    [refused] = [e for e in events if e["type"] == "error"]
    assert_envelope(refused, 429, "websocket_lane_limit")
    assert refused["stream_id"] == "c"
    assert not lane(events, "c")[1:]
    assert_clean_turn(lane(events, None))
    assert_clean_turn(lane(events, "b"))
    assert all(e["stream_id"] == "c" for e in later)
    assert_clean_turn(later)


async def test_the_queue_bound_counts_the_waiting_turns_of_every_lane() -> None:
    with serve({"limits": {"ws_queue_size": 1}}) as served:
        install(served, "slow", Slow(pieces=5, delay=0.1))
        async with ws_connect(served) as ws:
            await ws.send(create(model="slow", input="a1", store=False, stream_id="a"))
            await ws.send(create(model="slow", input="a2", store=False, stream_id="a"))  # waits: 1
            await ws.send(create(model="slow", input="b1", store=False, stream_id="b"))  # runs now
            await ws.send(create(model="slow", input="b2", store=False, stream_id="b"))  # would wait: 2
            events = await collect(ws, 4)
    [full] = [e for e in events if e["type"] == "error"]
    assert_envelope(full, 429, "websocket_queue_full")
    assert full["stream_id"] == "b"
    assert [e["type"] for e in events].count("response.completed") == 3


async def test_previous_response_id_continues_a_response_of_another_lane() -> None:
    with serve() as served:
        recorder = Recorder()
        install(served, "mock", recorder)
        async with ws_connect(served) as ws:
            r1 = assert_clean_turn(
                [*await _turn(ws, model="mock", input="My color is cobalt.", store=False, stream_id="a")]
            )
            r2 = assert_clean_turn(
                await _turn(
                    ws,
                    model="mock",
                    input="And mine?",
                    store=False,
                    stream_id="b",
                    previous_response_id=r1["id"],
                )
            )
    assert r2["previous_response_id"] == r1["id"]
    roles = [i.get("role") for i in recorder.transcripts()[1]]
    assert roles == ["user", "assistant", "user"]


async def _turn(ws: ClientConnection, **body: Any) -> list[dict[str, Any]]:
    await ws.send(create(**body))
    return await read_turn(ws)


async def test_the_age_limit_waits_for_every_lane_then_closes() -> None:
    with serve({"limits": {"ws_connection_seconds": 1.0}}) as served:
        install(served, "paced", Paced(words(12), words(12), delay=0.15))
        async with ws_connect(served) as ws:
            await ws.send(create(model="paced", input="x", store=False, stream_id="a"))
            await ws.send(create(model="paced", input="x", store=False, stream_id="b"))
            events = await collect(ws, 2)
            limit = await recv(ws)
            await asyncio.wait_for(ws.wait_closed(), 10)
    assert [e["type"] for e in events].count("response.completed") == 2
    assert_envelope(limit, 400, "websocket_connection_limit_reached")
    assert "stream_id" not in limit
    assert ws.close_code == 1000


async def test_drain_finishes_every_lane_in_flight_and_starts_nothing_queued() -> None:
    served = served_with_drain(Settings(), drain_seconds=10)
    try:
        install(served, "slow", Slow(pieces=10, delay=0.1))
        async with ws_connect(served) as ws:
            await ws.send(create(model="slow", input="a1", store=False, stream_id="a"))
            await ws.send(create(model="slow", input="b1", store=False, stream_id="b"))
            await ws.send(create(model="slow", input="a2", store=False, stream_id="a"))  # queued
            events = [await recv(ws), await recv(ws)]  # both lanes under way
            served.server.should_exit = True  # what uvicorn's SIGTERM handler does
            with pytest.raises(ConnectionClosed):
                while True:
                    events.append(await recv(ws))
        assert ws.close_code == 1001
        assert [(e["stream_id"], e["type"]) for e in events if e["type"].startswith("response.c")].count(
            ("a", "response.created")
        ) == 1
        assert_clean_turn(lane(events, "a"))
        assert_clean_turn(lane(events, "b"))
    finally:
        served.stop()
