"""A stream's events in as few socket writes as possible: WebSocket text frames (``FrameWriter``)
and SSE body chunks (``BodyWriter``).

Under uvicorn's ``websockets-sansio`` protocol (the gateway's, ``gateway/cli.py``) each event is
framed by the connection's own ``websockets`` protocol object and the frames that are ready together
(everything produced before the turn next waits, e.g. for the upstream's next read) leave in one
transport write, at the end of the event loop's current step: one system call per burst instead of
one per event, and no ASGI/Starlette wrapper per event. Nothing is held back to wait for another
event: the write happens as soon as the turn's task yields. Backpressure is kept: while uvicorn has
paused writing (the client reads slowly), the next event waits for it to resume, as uvicorn's own
``send`` would. Anything else (another server or WebSocket implementation) gets one ASGI send per
event, as before.

SSE alike: under uvicorn's httptools protocol the frames of one burst leave as one HTTP chunk in one
transport write (``BodyWriter``); the last body message still goes through the ASGI ``send``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, Protocol

from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.exceptions import InvalidState
from websockets.protocol import SERVER, State
from websockets.protocol import Protocol as WsProtocol

_GONE = 1006  # what Starlette reports when uvicorn says the client disconnected
# A burst longer than this is written at once (and backpressure applies from there on): frames
# never pile up in the process, however many events are ready at once.
FLUSH_BYTES = 64 * 1024
# A response's last event: its frame is written at once (the caller flushes after it).
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class _Stamped(Protocol):
    since: float  # gateway/api/stall.py: when the send in progress began; 0.0: none


async def _stamped(owner: _Stamped, waiting: Awaitable[Any]) -> None:
    """Await a send (or a wait to send) with ``owner.since`` set, so the stall watch sees it."""
    owner.since = time.monotonic()
    await waiting
    owner.since = 0.0


class FrameWriter:
    __slots__ = ("_conn", "_loop", "_owner", "_pending", "_plain", "_proto", "_size", "_transport", "_ws")

    def __init__(self, websocket: WebSocket, owner: _Stamped) -> None:
        self._ws = websocket
        self._owner = owner
        self._pending = False  # a flush is scheduled
        self._size = 0  # bytes framed and not yet written
        proto: Any = getattr(websocket._send, "__self__", None)  # uvicorn's protocol, when unwrapped
        conn = getattr(proto, "conn", None)
        fast = (
            isinstance(conn, WsProtocol)
            and isinstance(getattr(proto, "writable", None), asyncio.Event)
            and hasattr(proto, "transport")
            and hasattr(proto, "disconnected")
            and hasattr(proto, "close_sent")
        )
        self._proto: Any = proto if fast else None
        self._conn: WsProtocol | None = conn if fast else None
        self._transport: asyncio.WriteTransport | None = proto.transport if fast else None
        self._loop = asyncio.get_running_loop()
        # No extension negotiated (the gateway declines permessage-deflate) and a server's
        # unmasked frames: the frame is its 2-10 byte header and the payload, made here rather
        # than by websockets' general Frame.serialize, and queued on the protocol's own output
        # (``writes``, what data_to_send returns), so anything it queues keeps its place.
        self._plain = (
            isinstance(conn, WsProtocol)
            and fast
            and conn.side is SERVER
            and not conn.extensions
            and not conn.debug
        )

    @property
    def direct(self) -> bool:
        """Frames go straight to uvicorn's protocol (False: one ASGI send per event)."""
        return self._conn is not None

    async def send(self, data: bytes) -> None:
        """One text frame (``data``: UTF-8 JSON), written with the others ready in this step."""
        conn = self._conn
        if conn is None:
            await _stamped(self._owner, self._ws.send({"type": "websocket.send", "text": data.decode()}))
            return
        proto = self._proto
        if not proto.writable.is_set():  # uvicorn paused writing: wait like its own send would
            self.flush()
            await _stamped(self._owner, proto.writable.wait())
        if proto.disconnected or proto.close_sent:
            raise WebSocketDisconnect(_GONE)
        if self._plain and conn.state is State.OPEN and not conn.expect_continuation_frame:
            n = len(data)
            if n < 126:
                head = bytes((0x81, n))  # FIN + text, unmasked length
            elif n < 65536:
                head = b"\x81\x7e" + n.to_bytes(2, "big")
            else:
                head = b"\x81\x7f" + n.to_bytes(8, "big")
            conn.writes.append(head + data)
        else:
            try:
                conn.send_text(data)
            except InvalidState:
                raise WebSocketDisconnect(_GONE) from None
        self._size += len(data)
        if self._size >= FLUSH_BYTES:
            self.flush()
        elif not self._pending:
            self._pending = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write what is framed and not yet written (before any other send, to keep the order)."""
        self._pending = False
        self._size = 0
        conn = self._conn
        if conn is None:
            return
        data = conn.data_to_send()
        transport = self._transport
        if data and transport is not None and not transport.is_closing():
            transport.write(b"".join(data))


class BodyWriter:
    """An SSE response's event frames, after its ``http.response.start`` was sent: one chunk per
    burst of ready frames, straight to uvicorn's httptools transport (chunked encoding, as uvicorn
    writes it), else one ASGI send per frame. ``end(body)`` writes what is pending, then sends the
    last body message through ``send``."""

    __slots__ = ("_buf", "_cycle", "_loop", "_owner", "_pending", "_send", "_size")

    def __init__(self, send: Any, owner: _Stamped) -> None:
        self._send = send
        self._owner = owner
        cycle: Any = getattr(send, "__self__", None)  # uvicorn's RequestResponseCycle
        fast = (
            getattr(cycle, "chunked_encoding", None) is True
            and getattr(cycle, "response_started", None) is True
            and hasattr(getattr(cycle, "flow", None), "write_paused")
            and hasattr(cycle, "transport")
            and hasattr(cycle, "disconnected")
        )
        self._cycle: Any = cycle if fast else None
        self._buf: list[bytes] = []
        self._size = 0
        self._pending = False
        self._loop = asyncio.get_running_loop()

    @property
    def direct(self) -> bool:
        return self._cycle is not None

    async def send(self, frame: bytes) -> None:
        cycle = self._cycle
        if cycle is None:
            await _stamped(
                self._owner, self._send({"type": "http.response.body", "body": frame, "more_body": True})
            )
            return
        if cycle.flow.write_paused and not cycle.disconnected:  # as uvicorn's send: wait to resume
            self.flush()
            await _stamped(self._owner, cycle.flow.drain())
        if cycle.disconnected:
            return  # as uvicorn's send: dropped (the DisconnectWatch ends the turn)
        self._buf.append(frame)
        self._size += len(frame)
        if self._size >= FLUSH_BYTES:
            self.flush()
        elif not self._pending:
            self._pending = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._pending = False
        buf = self._buf
        if not buf:
            return
        body = b"".join(buf)
        self._buf = []
        self._size = 0
        cycle = self._cycle
        if cycle is not None and not cycle.disconnected and not cycle.transport.is_closing():
            cycle.transport.write(b"%x\r\n%s\r\n" % (len(body), body))

    async def end(self, body: bytes) -> None:
        """The last body message (``more_body: False``), after everything pending."""
        self.flush()
        owner = self._owner
        owner.since = time.monotonic()
        await self._send({"type": "http.response.body", "body": body, "more_body": False})
