"""The HTTP/1.1 connection protocol: uvicorn's own (httptools, else h11) with the read bounds uvicorn
lacks, so that a client cannot hold a connection, or the event loop, by sending slowly or too much.

* The request head (request line and headers, through the blank line) is capped at
  ``limits.max_header_bytes``: beyond it the answer is 431 and the connection closes. The bytes are
  counted before the parser sees them (httptools has no limit of its own and re-copies a growing
  header value on every read, so a 128 MiB header stalled the loop for seconds).
* A head must arrive within ``limits.header_read_seconds`` of its first byte (of the connection's
  opening, for its first request); a body within ``limits.body_read_seconds`` of the end of its head.
  Late: 408 (or a plain close when a response is already under way, or nothing was sent at all).

A head that begins inside a read, after a pipelined request, is counted from the next read on.

The refusals carry the spec's error body. The bounds cost the hot path a byte count per read while a
head is open and no timer at all for a request that arrives in one read.
"""

from __future__ import annotations

import asyncio
import http
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
import structlog

from gateway.api.encode import json_bytes
from gateway.kernel.errors import ErrorCode, GatewayError, InvalidRequest
from gateway.kernel.settings import Limits
from gateway.server.internals import (
    LATE_BODY,
    Config,
    FlowControl,
    H11Protocol,
    HttpToolsProtocol,
    ServerState,
)

log = structlog.get_logger("gateway.http")

# What the connection is reading: nothing yet (a new connection), a head, a body; or nothing bounded
# here, between requests or while one is answered (uvicorn's keep-alive timeout covers an idle
# connection); or nothing any more (refused, upgraded, gone).
OPEN, HEAD, BODY, IDLE, CLOSED = "open", "head", "body", "idle", "closed"
READ_SIZE = 256 * 1024  # the most one read of the event loop hands over
LINGER_SECONDS = 2.0  # after a refusal: reading (and dropping) what the client still sends, so
# that closing with unread data does not reset the connection before the client reads the answer


def refusal(code: ErrorCode, message: str) -> InvalidRequest:
    """431 ``request_headers_too_large`` or 408 ``request_timeout``: errors of the connection, not
    of the engine (an InvalidRequest with the code's status)."""
    return InvalidRequest(message, code=code)


@dataclass(frozen=True, slots=True)
class ReadBounds:
    max_header_bytes: int
    header_seconds: float
    body_seconds: float

    @classmethod
    def from_limits(cls, limits: Limits) -> ReadBounds:
        return cls(limits.max_header_bytes, limits.header_read_seconds, limits.body_read_seconds)


def _blank_line_within(tail: bytes, data: bytes, room: int) -> bool:
    """Whether the head's blank line ends in the first ``room`` bytes of ``data`` (``tail``: the
    last bytes before it)."""
    if room <= 0:
        return False
    if data.find(b"\n\r\n", 0, room) >= 0 or data.find(b"\n\n", 0, room) >= 0:
        return True
    joint = tail + data[: min(2, room)]
    return b"\n\r\n" in joint or b"\n\n" in joint


def refusal_bytes(err: GatewayError, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A whole ``connection: close`` response carrying ``err``'s JSON body."""
    body = json_bytes(err.http_body())
    parts = [b"HTTP/1.1 %d %s\r\n" % (err.status, http.HTTPStatus(err.status).phrase.encode())]
    for name, value in default_headers:
        parts += [name, b": ", value, b"\r\n"]
    parts.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
    parts += [b"connection: close\r\n\r\n", body]
    return b"".join(parts)


class BoundedReads(asyncio.Protocol):
    """The bounds, over either uvicorn protocol (the concrete classes below say how their parser
    reports where a request is)."""

    bounds: ClassVar[ReadBounds]
    # uvicorn's protocols set these
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    server_state: ServerState
    flow: FlowControl
    cycle: Any  # the request's RequestResponseCycle (each protocol has its own class)

    _phase: str = OPEN
    _head_bytes = 0  # read since the open head began
    _tail = b""  # the open head's last two bytes (its blank line may straddle two reads)
    _timer: asyncio.TimerHandle | None = None
    _timer_phase: str = IDLE  # what ``_timer`` bounds

    # -- what the concrete class knows ----------------------------------------------------------
    def _parsed(self) -> None:
        """Update ``_phase`` after the parser has had a read (callbacks may have done it already)."""

    def _may_answer(self) -> bool:
        """Whether a refusal can still be written: no response of this connection is under way."""
        raise NotImplementedError

    def _cut_request(self, err: GatewayError) -> None:
        """The request whose body was late (answered ``err``): its handler's next ``receive`` says
        the client is gone, its scope holds ``err`` under ``LATE_BODY``, and nothing it sends is
        written."""
        cycle = self.cycle
        cycle.scope[LATE_BODY] = err
        cycle.waiting_for_100_continue = False
        cycle.disconnected = True
        cycle.message_event.set()

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        phase = self._phase
        if phase is not BODY:
            if phase is CLOSED:
                return  # refused: what still comes is dropped
            if phase is IDLE:  # a new head starts with this read
                self._head_bytes = 0
                self._tail = b""
            self._head_bytes += len(data)
            limit = self.bounds.max_header_bytes
            if self._head_bytes > limit and not _blank_line_within(
                self._tail, data, limit - self._head_bytes + len(data)
            ):
                message = f"The request headers exceed {limit} bytes."
                self._refuse(
                    refusal(ErrorCode.REQUEST_HEADERS_TOO_LARGE, message), received_bytes=self._head_bytes
                )
                return
        super().data_received(data)
        self._parsed()
        phase = self._phase
        if phase is HEAD or phase is OPEN:
            self._tail = (self._tail + data[-2:])[-2:]
        else:
            self._head_bytes = 0
        if phase is not self._timer_phase:
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._detach()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if self._phase is CLOSED:
            self.transport.close()
            return
        super().shutdown()  # type: ignore[misc]

    # -- timers --------------------------------------------------------------------------------
    def _detach(self) -> None:
        """No more bounds: the connection is gone, refused or upgraded to a WebSocket."""
        self._phase = CLOSED
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        if self._phase is HEAD and self._timer_phase is OPEN:
            self._timer_phase = HEAD  # the first head is due within the time from the opening
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        phase = self._timer_phase = self._phase
        if phase is HEAD or phase is OPEN:
            self._timer = self.loop.call_later(self.bounds.header_seconds, self._expired)
        elif phase is BODY:
            self._timer = self.loop.call_later(self.bounds.body_seconds, self._expired)

    def _expired(self) -> None:
        self._timer = None
        phase = self._phase
        if phase is BODY and self.flow.read_paused:
            # We stopped reading (the handler has not taken the body yet, or a pipelined request
            # waits its turn): not the client's delay.
            self._arm()
            return
        if phase is OPEN:
            self._detach()  # nothing sent at all: no request to answer
            self.transport.close()
            return
        seconds = self.bounds.header_seconds if phase is HEAD else self.bounds.body_seconds
        if not self._may_answer():  # a response is under way: it cannot be answered any more
            log.warning("request_timeout_closed", phase=phase, seconds=seconds)
            self._detach()
            self.transport.close()
            return
        message = f"The request {'headers' if phase is HEAD else 'body'} did not arrive within {seconds:g} s."
        err = refusal(ErrorCode.REQUEST_TIMEOUT, message)
        if phase is BODY:
            self._cut_request(err)
        self._refuse(err, phase=phase)

    def _refuse(self, err: GatewayError, **fields: Any) -> None:
        """Answer the error, then close: at once when the client has closed its side, else after a
        short linger that reads and drops what it still sends."""
        log.warning("request_refused", status=err.status, code=err.code, **fields)
        self._detach()
        transport = self.transport
        transport.write(refusal_bytes(err, self.server_state.default_headers))
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = self.loop.call_later(LINGER_SECONDS, transport.abort)


class HttpToolsBounded(BoundedReads, HttpToolsProtocol):
    """httptools: its callbacks mark where the request is."""

    def on_message_begin(self) -> None:
        if self._phase is not CLOSED:
            self._phase = HEAD
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        if self._phase is not CLOSED:
            self._phase = BODY
            self._head_bytes = 0  # a pipelined head begun later in this read goes uncounted
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        if self._phase is not CLOSED:
            self._phase = IDLE
        super().on_message_complete()

    def handle_websocket_upgrade(self) -> None:
        self._detach()
        super().handle_websocket_upgrade()

    def _may_answer(self) -> bool:
        cycle = self.cycle
        if self._phase is HEAD:
            return cycle is None or cycle.response_complete
        return not self.pipeline and cycle is not None and not cycle.response_started


class H11Bounded(BoundedReads, H11Protocol):
    """h11: its connection state says where the request is. Its own limit on an incomplete head is
    raised above ours, so that the 431 (not h11's plain 400) is what a client gets."""

    _seen_cycle: object = None

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.conn = h11.Connection(h11.SERVER, self.bounds.max_header_bytes + READ_SIZE)

    def _parsed(self) -> None:
        if self._phase is CLOSED:
            return
        if self.cycle is not self._seen_cycle:  # a head ended in this read
            self._seen_cycle = self.cycle
            self._head_bytes = 0
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._phase = BODY
        elif state is h11.IDLE:
            if self.conn.trailing_data[0]:
                self._phase = HEAD
        else:
            self._phase = IDLE

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._detach()
        super().handle_websocket_upgrade(event)

    def _may_answer(self) -> bool:
        cycle = self.cycle
        if self._phase is HEAD:
            return cycle is None or cycle.response_complete
        return cycle is not None and not cycle.response_started


def bounded_protocol(limits: Limits, base: type[BoundedReads] | None = None) -> type[BoundedReads]:
    """The protocol class to hand uvicorn (``uvicorn.Config(http=...)``): httptools when installed
    (as uvicorn's ``auto``), else h11; ``base`` picks one."""
    if base is None:
        try:
            import httptools  # noqa: F401
        except ImportError:  # pragma: no cover
            base = H11Bounded
        else:
            base = HttpToolsBounded
    return type(base.__name__, (base,), {"bounds": ReadBounds.from_limits(limits)})
