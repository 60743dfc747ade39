"""Everything the gateway knows of uvicorn's and websockets' internals, in one place.

The API layer writes a stream's frames straight to uvicorn's connection objects when it can reach
them (``ws_sink``, ``chunk_sink``: gateway/api/frames.py), drops a client that stopped reading by
aborting its socket (``abort_transport``, ``abort_websocket``: gateway/api/stall.py's watch) and
reads the scope key the read bounds set (``LATE_BODY``). gateway/logs.py sends uvicorn's loggers
through the root handler by editing ``LOGGING_CONFIG``, the dictConfig uvicorn applies. The server
(gateway/server/) subclasses uvicorn's ``Server`` and HTTP protocols: their classes come from here.

What each of these relies on (classes, methods, the attributes a constructor sets) is checked once
at import (``FEATURES``; ``missing()`` names what is not there). A sink whose feature is missing is
never tried: its caller falls back to the plain ASGI ``send``, as it does for any other server.
Where the gateway has no fallback (the read bounds, the shutdown drain) the check only reports, and
``serve`` logs it at start. tests/server/test_internals.py asserts that every check finds the real
thing with the installed versions, so an upgrade that changes one fails there by name.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.websockets import WebSocket, WebSocketDisconnect
from uvicorn import Config, Server
from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http import h11_impl, httptools_impl
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState
from websockets.exceptions import InvalidState
from websockets.protocol import SERVER, State
from websockets.protocol import Protocol as WsProtocol
from websockets.server import ServerProtocol

__all__ = [
    "LATE_BODY",
    "LOGGING_CONFIG",
    "ChunkSink",
    "Config",
    "Feature",
    "FlowControl",
    "H11Protocol",
    "HttpToolsProtocol",
    "Server",
    "ServerState",
    "WsSink",
    "abort_transport",
    "abort_websocket",
    "chunk_sink",
    "missing",
    "ws_sink",
]

# The ASGI scope key of a request whose body was late (gateway/server/server_protocol.py sets it):
# the 408 it was answered, for its handler to log (its read of the body ends as a disconnect).
LATE_BODY = "gateway.late_body"

_GONE = 1006  # what Starlette reports when uvicorn says the client disconnected


# -- feature detection ----------------------------------------------------------------------------
def _names(cls: type, *methods: str) -> set[str]:
    """The attribute names ``cls``'s ``methods`` use (what a constructor assigns is among them)."""
    found: set[str] = set()
    for method in methods:
        code = getattr(getattr(cls, method, None), "__code__", None)
        if code is not None:
            found.update(code.co_names)
    return found


def _has(cls: type, attributes: tuple[str, ...], methods: tuple[str, ...] = ("__init__",)) -> bool:
    """Whether ``cls`` has each of ``attributes``: its own, or one its ``methods`` assign."""
    assigned = _names(cls, *methods)
    return all(hasattr(cls, name) or name in assigned for name in attributes)


def _ws_protocol_shape() -> bool:
    conn = ServerProtocol(state=State.OPEN)
    return (
        isinstance(conn, WsProtocol)
        and callable(getattr(conn, "send_text", None))
        and callable(getattr(conn, "data_to_send", None))
        and conn.side is SERVER
    )


def _ws_plain_frames() -> bool:
    conn = ServerProtocol(state=State.OPEN)
    return (
        isinstance(getattr(conn, "writes", None), list)
        and getattr(conn, "expect_continuation_frame", None) is False
        and getattr(conn, "extensions", None) == []
        and isinstance(getattr(conn, "debug", None), bool)
        and conn.data_to_send() == []
    )


class Feature(enum.Enum):
    """What the gateway relies on; each value says what, for the message when it is missing."""

    WS_DIRECT = (
        "uvicorn's websockets-sansio protocol (uvicorn.protocols.websockets.websockets_sansio_impl"
        ".WebSocketsSansIOProtocol) with send() and the attributes conn, writable, transport,"
        " disconnected, close_sent; and websockets' sans-I/O Protocol with send_text(), data_to_send()"
    )
    WS_PLAIN_FRAMES = (
        "websockets.protocol.Protocol's writes (its output queue), expect_continuation_frame,"
        " extensions, debug, side (the gateway frames unmasked text frames itself)"
    )
    SSE_DIRECT = (
        "uvicorn's httptools RequestResponseCycle with send() and the attributes chunked_encoding,"
        " response_started, flow, transport, disconnected; FlowControl.write_paused and drain()"
    )
    CLIENT_ABORT = (
        "the object behind uvicorn's ASGI send (both HTTP cycles and the websockets-sansio protocol)"
        " holding the connection's transport; Starlette's WebSocket._send"
    )
    READ_BOUNDS = (
        "uvicorn's HttpToolsProtocol and H11Protocol with data_received, connection_made, connection_lost,"
        " shutdown, handle_websocket_upgrade, httptools' on_message_begin/on_headers_complete/"
        "on_message_complete, the attributes transport, loop, server_state, flow, cycle, conn (h11),"
        " pipeline (httptools); their cycles' scope, waiting_for_100_continue, disconnected,"
        " message_event, response_started, response_complete; FlowControl.read_paused;"
        " ServerState.default_headers"
    )
    LOG_CONFIG = (
        "uvicorn.config.LOGGING_CONFIG, the logging dictConfig uvicorn.Config applies, with its"
        " handlers and loggers (uvicorn, uvicorn.error, uvicorn.access)"
    )
    GRACEFUL_SHUTDOWN = (
        "uvicorn.Server's startup(), shutdown(), on_tick(), the attributes server_state, servers,"
        " started, should_exit, force_exit; ServerState.connections and tasks; each connection's"
        " transport"
    )


def _detect() -> dict[Feature, bool]:
    protocol_methods = ("data_received", "connection_made", "connection_lost", "shutdown")
    cycle_attrs = (
        "scope",
        "waiting_for_100_continue",
        "disconnected",
        "message_event",
        "response_started",
        "response_complete",
        "transport",
        "flow",
    )
    protocol_attrs = ("transport", "loop", "server_state", "flow", "cycle")
    cycles = (httptools_impl.RequestResponseCycle, h11_impl.RequestResponseCycle)
    return {
        Feature.WS_DIRECT: _ws_protocol_shape()
        and callable(getattr(WebSocketsSansIOProtocol, "send", None))
        and _has(WebSocketsSansIOProtocol, ("conn", "writable", "transport", "disconnected", "close_sent")),
        Feature.WS_PLAIN_FRAMES: _ws_plain_frames(),
        Feature.SSE_DIRECT: callable(getattr(httptools_impl.RequestResponseCycle, "send", None))
        and _has(
            httptools_impl.RequestResponseCycle,
            ("chunked_encoding", "response_started", "flow", "transport", "disconnected"),
        )
        and _has(FlowControl, ("write_paused", "drain")),
        Feature.CLIENT_ABORT: all(_has(cls, ("transport", "send")) for cls in cycles)
        and _has(WebSocketsSansIOProtocol, ("transport", "send"))
        and _has(WebSocket, ("_send",)),
        Feature.READ_BOUNDS: all(
            hasattr(cls, m) for cls in (HttpToolsProtocol, H11Protocol) for m in protocol_methods
        )
        and all(
            hasattr(HttpToolsProtocol, m)
            for m in (
                "on_message_begin",
                "on_headers_complete",
                "on_message_complete",
                "handle_websocket_upgrade",
            )
        )
        and hasattr(H11Protocol, "handle_websocket_upgrade")
        and _has(HttpToolsProtocol, (*protocol_attrs, "pipeline"), ("__init__", "connection_made", "on_url"))
        and _has(H11Protocol, (*protocol_attrs, "conn"), ("__init__", "connection_made", "handle_events"))
        and all(_has(cls, cycle_attrs) for cls in cycles)
        and _has(FlowControl, ("read_paused",))
        and _has(ServerState, ("default_headers",)),
        Feature.LOG_CONFIG: isinstance(LOGGING_CONFIG.get("handlers"), dict)
        and isinstance(loggers := LOGGING_CONFIG.get("loggers"), dict)
        and {"uvicorn", "uvicorn.error", "uvicorn.access"} <= loggers.keys(),
        Feature.GRACEFUL_SHUTDOWN: all(
            callable(getattr(Server, m, None)) for m in ("startup", "shutdown", "on_tick")
        )
        and _has(
            Server,
            ("server_state", "servers", "started", "should_exit", "force_exit"),
            ("__init__", "startup"),
        )
        and _has(ServerState, ("connections", "tasks")),
    }


FEATURES: dict[Feature, bool] = _detect()
_WS_DIRECT = FEATURES[Feature.WS_DIRECT]
_WS_PLAIN = _WS_DIRECT and FEATURES[Feature.WS_PLAIN_FRAMES]
_SSE_DIRECT = FEATURES[Feature.SSE_DIRECT]


def missing() -> list[Feature]:
    """The features not found with the installed uvicorn and websockets."""
    return [feature for feature, found in FEATURES.items() if not found]


# -- WebSocket: text frames straight to uvicorn's protocol -----------------------------------------
class WsSink:
    """uvicorn's websockets-sansio protocol behind a Starlette WebSocket: ``frame`` queues a text
    frame on its websockets protocol, ``write`` sends what is queued in one transport write.
    ``writable``: uvicorn's own event, clear while it has paused writing (the client reads slowly)."""

    __slots__ = ("_conn", "_plain", "_proto", "_transport", "writable")

    def __init__(self, proto: Any, conn: WsProtocol) -> None:
        self._proto = proto
        self._conn = conn
        self._transport: asyncio.WriteTransport | None = proto.transport
        self.writable: asyncio.Event = proto.writable
        # No extension negotiated (the gateway declines permessage-deflate) and a server's
        # unmasked frames: the frame is its 2-10 byte header and the payload, made here rather
        # than by websockets' general Frame.serialize, and queued on the protocol's own output
        # (``writes``, what data_to_send returns), so anything it queues keeps its place.
        self._plain = _WS_PLAIN and conn.side is SERVER and not conn.extensions and not conn.debug

    def frame(self, data: bytes) -> None:
        """Queue one text frame (``data``: UTF-8); WebSocketDisconnect when the client is gone."""
        proto = self._proto
        if proto.disconnected or proto.close_sent:
            raise WebSocketDisconnect(_GONE)
        conn = self._conn
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

    def write(self) -> None:
        """Write what is queued, unless the connection is closing."""
        data = self._conn.data_to_send()
        transport = self._transport
        if data and transport is not None and not transport.is_closing():
            transport.write(b"".join(data))


def ws_sink(websocket: WebSocket) -> WsSink | None:
    """The direct way to ``websocket``'s client, or None (another server or WebSocket
    implementation, a wrapped ``send``): then each frame is one ASGI send."""
    if not _WS_DIRECT:
        return None
    proto: Any = getattr(websocket._send, "__self__", None)  # uvicorn's protocol, when unwrapped
    conn = getattr(proto, "conn", None)
    if (
        isinstance(conn, WsProtocol)
        and isinstance(getattr(proto, "writable", None), asyncio.Event)
        and hasattr(proto, "transport")
        and hasattr(proto, "disconnected")
        and hasattr(proto, "close_sent")
    ):
        return WsSink(proto, conn)
    return None


# -- SSE: body chunks straight to uvicorn's httptools transport -------------------------------------
class _Flow(Protocol):  # uvicorn's FlowControl
    write_paused: bool

    def drain(self) -> Awaitable[None]: ...


class _Cycle(Protocol):  # uvicorn's httptools RequestResponseCycle
    flow: _Flow
    transport: asyncio.WriteTransport
    disconnected: bool


class ChunkSink:
    """uvicorn's httptools ``RequestResponseCycle`` behind an ASGI ``send``, its response started
    with chunked encoding: ``write_chunk`` writes one HTTP chunk, as uvicorn writes it."""

    __slots__ = ("_cycle",)

    def __init__(self, cycle: _Cycle) -> None:
        self._cycle = cycle

    def open(self) -> bool:
        """A chunk can be written now: the client is there and uvicorn has not paused writing
        (one call per event; when it is False, ``gone`` says which)."""
        cycle = self._cycle
        return not cycle.flow.write_paused and not cycle.disconnected

    def drain(self) -> Awaitable[None]:
        """Until uvicorn resumes writing (the client reads slowly)."""
        return self._cycle.flow.drain()

    def gone(self) -> bool:
        """The client disconnected (what is sent now is dropped, as uvicorn's send drops it)."""
        return self._cycle.disconnected

    def write_chunk(self, body: bytes) -> None:
        cycle = self._cycle
        if not cycle.disconnected and not cycle.transport.is_closing():
            cycle.transport.write(b"%x\r\n%s\r\n" % (len(body), body))


def chunk_sink(send: Callable[..., Any]) -> ChunkSink | None:
    """The direct way to the client of a started chunked response, or None (another server or
    protocol, a wrapped ``send``): then each chunk is one ASGI send."""
    if not _SSE_DIRECT:
        return None
    cycle: Any = getattr(send, "__self__", None)  # uvicorn's RequestResponseCycle
    if (
        getattr(cycle, "chunked_encoding", None) is True
        and getattr(cycle, "response_started", None) is True
        and hasattr(getattr(cycle, "flow", None), "write_paused")
        and hasattr(cycle, "transport")
        and hasattr(cycle, "disconnected")
    ):
        return ChunkSink(cycle)
    return None


# -- dropping a client ----------------------------------------------------------------------------
def abort_transport(send: object) -> None:
    """Close the client's socket at once, discarding what is buffered for it (a close frame or the
    end of a response could never be delivered to a client that does not read). uvicorn's ASGI
    ``send`` is a bound method of the object holding the transport; elsewhere this does nothing,
    and cancelling the turn is all that happens."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    abort = getattr(transport, "abort", None)
    if callable(abort):
        abort()


def abort_websocket(websocket: WebSocket) -> None:
    """``abort_transport`` for a Starlette WebSocket's connection."""
    abort_transport(websocket._send)
