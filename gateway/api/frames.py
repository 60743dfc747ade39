"""A stream's events in as few socket writes as possible: WebSocket text frames (``FrameWriter``)
and SSE body chunks (``BodyWriter``).

Under uvicorn's ``websockets-sansio`` protocol (the gateway's, ``gateway/server/server.py``) each event is
framed by the connection's own ``websockets`` protocol object and the frames that are ready together
(everything produced before the turn next waits, e.g. for the upstream's next read) leave in one
transport write, at the end of the event loop's current step: one system call per burst instead of
one per event, and no ASGI/Starlette wrapper per event. Nothing is held back to wait for another
event: the write happens as soon as the turn's task yields. Backpressure is kept: while uvicorn has
paused writing (the client reads slowly), the next event waits for it to resume, as uvicorn's own
``send`` would. Anything else (another server or WebSocket implementation) gets one ASGI send per
event, as before. What it knows of uvicorn and websockets is in gateway/server/internals.py.

SSE alike: under uvicorn's httptools protocol the frames of one burst leave as one HTTP chunk in one
transport write (``BodyWriter``); the last body message still goes through the ASGI ``send``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, Protocol

from starlette.websockets import WebSocket

from gateway.server.internals import ChunkSink, WsSink, chunk_sink, ws_sink

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
    __slots__ = ("_loop", "_owner", "_pending", "_sink", "_size", "_ws")

    def __init__(self, websocket: WebSocket, owner: _Stamped) -> None:
        self._ws = websocket
        self._owner = owner
        self._pending = False  # a flush is scheduled
        self._size = 0  # bytes framed and not yet written
        self._sink: WsSink | None = ws_sink(websocket)
        self._loop = asyncio.get_running_loop()

    @property
    def direct(self) -> bool:
        """Frames go straight to uvicorn's protocol (False: one ASGI send per event)."""
        return self._sink is not None

    async def send(self, data: bytes) -> None:
        """One text frame (``data``: UTF-8 JSON), written with the others ready in this step."""
        sink = self._sink
        if sink is None:
            await _stamped(self._owner, self._ws.send({"type": "websocket.send", "text": data.decode()}))
            return
        if not sink.writable.is_set():  # uvicorn paused writing: wait like its own send would
            self.flush()
            await _stamped(self._owner, sink.writable.wait())
        sink.frame(data)
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
        if self._sink is not None:
            self._sink.write()


class BodyWriter:
    """An SSE response's event frames, after its ``http.response.start`` was sent: one chunk per
    burst of ready frames, straight to uvicorn's httptools transport (chunked encoding, as uvicorn
    writes it), else one ASGI send per frame. ``end(body)`` writes what is pending, then sends the
    last body message through ``send``."""

    __slots__ = ("_buf", "_loop", "_owner", "_pending", "_send", "_sink", "_size")

    def __init__(self, send: Any, owner: _Stamped) -> None:
        self._send = send
        self._owner = owner
        self._sink: ChunkSink | None = chunk_sink(send)
        self._buf: list[bytes] = []
        self._size = 0
        self._pending = False
        self._loop = asyncio.get_running_loop()

    @property
    def direct(self) -> bool:
        return self._sink is not None

    async def send(self, frame: bytes) -> None:
        sink = self._sink
        if sink is None:
            await _stamped(
                self._owner, self._send({"type": "http.response.body", "body": frame, "more_body": True})
            )
            return
        if not sink.open():
            if not sink.gone():  # paused: as uvicorn's send, wait to resume
                self.flush()
                await _stamped(self._owner, sink.drain())
            if sink.gone():
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
        if self._sink is not None:
            self._sink.write_chunk(body)

    async def end(self, body: bytes) -> None:
        """The last body message (``more_body: False``), after everything pending."""
        self.flush()
        owner = self._owner
        owner.since = time.monotonic()
        await self._send({"type": "http.response.body", "body": body, "more_body": False})
