"""The stream writers (gateway/api/frames.py): the events ready in one step leave in one transport
write, in order; backpressure still holds a sender; a gone client is reported as before. Driven
against uvicorn's protocol objects' shape, with websockets' own parser reading the frames back;
the gateway under uvicorn (tests/ws, tests/api/http/test_stream_schema.py) runs the same code end to end."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from gateway.api.frames import FLUSH_BYTES, BodyWriter, FrameWriter
from tests.harness import serve_gateway


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing


class Stamp:
    since = 0.0


class WsProto:
    """What FrameWriter reads of uvicorn's websockets-sansio protocol."""

    def __init__(self) -> None:
        self.conn = ServerProtocol(state=State.OPEN)
        self.transport = Transport()
        self.writable = asyncio.Event()
        self.writable.set()
        self.disconnected = False
        self.close_sent = False
        self.asgi: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        self.asgi.append(message)


def frames_of(data: bytes) -> list[Frame]:
    client = ClientProtocol(parse_uri("ws://x/"), state=State.OPEN)
    client.receive_data(data)
    return [f for f in client.events_received() if isinstance(f, Frame)]


def writer() -> tuple[FrameWriter, WsProto, Stamp]:
    proto = WsProto()
    stamp = Stamp()
    ws = WebSocket({"type": "websocket", "path": "/", "headers": []}, receive=None, send=proto.send)  # type: ignore[arg-type]
    return FrameWriter(ws, stamp), proto, stamp


async def test_a_burst_of_frames_is_one_write_at_the_end_of_the_step() -> None:
    w, proto, _ = writer()
    assert w.direct
    payloads = [b'{"n":1}', b"x" * 300, orjson.dumps({"t": "é" * 30_000})]  # 1- and 2-byte lengths
    for p in payloads:
        await w.send(p)
    assert proto.transport.writes == []  # not yet: the step has not ended
    await asyncio.sleep(0)
    [data] = proto.transport.writes
    got = frames_of(data)
    assert [f.opcode for f in got] == [Opcode.TEXT] * 3 and all(f.fin for f in got)
    assert [f.data for f in got] == payloads
    assert proto.asgi == []  # no ASGI send per event


async def test_more_than_the_flush_size_is_written_at_once() -> None:
    w, proto, _ = writer()
    big = b"y" * FLUSH_BYTES  # (an 8-byte length too)
    await w.send(big)
    assert len(proto.transport.writes) == 1  # at once, so that backpressure can apply
    await w.send(b"z")
    await asyncio.sleep(0)
    assert [f.data for f in frames_of(b"".join(proto.transport.writes))] == [big, b"z"]


async def test_a_paused_transport_holds_the_sender_and_stamps_it() -> None:
    w, proto, stamp = writer()
    await w.send(b"a")
    proto.writable.clear()  # uvicorn's pause_writing
    task = asyncio.create_task(w.send(b"b"))
    await asyncio.sleep(0.05)
    assert not task.done() and stamp.since > 0.0
    assert [f.data for f in frames_of(b"".join(proto.transport.writes))] == [b"a"]  # flushed first
    proto.writable.set()
    await asyncio.wait_for(task, 5)
    await asyncio.sleep(0)
    assert stamp.since == 0.0
    assert [f.data for f in frames_of(b"".join(proto.transport.writes))] == [b"a", b"b"]


async def test_a_gone_client_raises_disconnect() -> None:
    w, proto, _ = writer()
    proto.disconnected = True
    with pytest.raises(WebSocketDisconnect):
        await w.send(b"a")
    w, proto, _ = writer()
    proto.conn = ServerProtocol(state=State.CLOSED)
    w2 = FrameWriter(
        WebSocket({"type": "websocket", "path": "/", "headers": []}, receive=None, send=proto.send),  # type: ignore[arg-type]
        Stamp(),
    )
    with pytest.raises(WebSocketDisconnect):
        await w2.send(b"a")


async def test_without_uvicorns_protocol_each_event_is_one_asgi_send() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    ws = WebSocket({"type": "websocket", "path": "/", "headers": []}, receive=None, send=send)  # type: ignore[arg-type]
    ws.application_state = ws.client_state = ws.application_state.CONNECTED
    w = FrameWriter(ws, Stamp())
    assert not w.direct
    await w.send(b'{"a":1}')
    assert sent == [{"type": "websocket.send", "text": '{"a":1}'}]


# -- SSE --------------------------------------------------------------------------------------------
class Flow:
    def __init__(self) -> None:
        self.write_paused = False
        self.resumed = asyncio.Event()

    async def drain(self) -> None:
        await self.resumed.wait()


class Cycle:
    """What BodyWriter reads of uvicorn's httptools RequestResponseCycle."""

    def __init__(self) -> None:
        self.chunked_encoding = True
        self.response_started = True
        self.flow = Flow()
        self.transport = Transport()
        self.disconnected = False
        self.asgi: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        self.asgi.append(message)


async def test_sse_frames_of_one_step_are_one_chunk_and_the_end_goes_through_send() -> None:
    cycle = Cycle()
    w = BodyWriter(cycle.send, Stamp())
    assert w.direct
    await w.send(b"event: a\ndata: 1\n\n")
    await w.send(b"event: b\ndata: 2\n\n")
    assert cycle.transport.writes == []
    await asyncio.sleep(0)
    body = b"event: a\ndata: 1\n\nevent: b\ndata: 2\n\n"
    assert cycle.transport.writes == [b"%x\r\n%s\r\n" % (len(body), body)]
    await w.send(b"event: c\ndata: 3\n\n")
    await w.end(b"data: [DONE]\n\n")  # what is pending goes first
    assert cycle.transport.writes[-1] == b"12\r\nevent: c\ndata: 3\n\n\r\n"
    assert cycle.asgi == [{"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False}]


async def test_sse_backpressure_and_a_gone_client() -> None:
    cycle = Cycle()
    stamp = Stamp()
    w = BodyWriter(cycle.send, stamp)
    cycle.flow.write_paused = True
    task = asyncio.create_task(w.send(b"data: x\n\n"))
    await asyncio.sleep(0.05)
    assert not task.done() and stamp.since > 0.0
    cycle.flow.write_paused = False
    cycle.flow.resumed.set()
    await asyncio.wait_for(task, 5)
    cycle.disconnected = True
    await w.send(b"data: y\n\n")  # dropped, as uvicorn's send drops it
    await asyncio.sleep(0)
    assert cycle.transport.writes == [b"9\r\ndata: x\n\n\r\n"]


async def test_the_gateway_under_uvicorn_writes_sse_bursts_directly() -> None:
    """Under uvicorn (httptools) the direct path is the one taken, and the stream is whole."""
    import httpx

    seen: list[bool] = []
    real = BodyWriter.__init__

    def spy(self: BodyWriter, send: Any, owner: Any) -> None:
        real(self, send, owner)
        seen.append(self.direct)

    BodyWriter.__init__ = spy  # type: ignore[method-assign]
    try:
        with serve_gateway() as served:
            async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
                r = await c.post("/v1/responses", json={"model": "mock", "input": "hi", "stream": True})
    finally:
        BodyWriter.__init__ = real  # type: ignore[method-assign]
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    assert seen == [True]
    assert '"type":"response.completed"' in r.text
