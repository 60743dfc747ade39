"""One HTTP/1.1 exchange on a connection: the response being read (the ``httptools`` parser's
callbacks, the head's limits, the body's pieces and flow control, the call's one timer) apart
from the connection that carries it, as uvicorn's ``RequestResponseCycle`` is apart from its
protocol; and :class:`Response`, the caller's view of it, with a bounded content decoder.

Costs per call stay a few Python calls: the parser runs once per socket read and appends the
body's pieces straight to a list (no Python frame per HTTP chunk), a reader wakes once per socket
read and takes everything buffered as one bytes object, and the total and read timeouts are one
timer per call that re-checks the time of the last byte when it fires (no timer per chunk). The
head's limits are counted in the callbacks the parser calls anyway and in reads that end inside
the head; the body's decoding is bounded only when it is compressed.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import TYPE_CHECKING

import httptools

from adapters.http1.errors import ConnectionLost, ProtocolError, ReadTimeout, ResponseTooLarge

if TYPE_CHECKING:
    from adapters.http1.connection import Connection

__all__ = ["HIGH_WATER", "MAX_HEADERS", "MAX_HEADER_LINE", "MAX_HEAD_BYTES", "Exchange", "Response"]

HIGH_WATER = 256 * 1024  # bytes buffered unread before the socket stops being read
# the response head's limits (aiohttp's line and count; a total as h11 bounds an incomplete head)
MAX_HEADER_LINE = 8190  # bytes of one header's name and value
MAX_HEADERS = 128  # header lines, interim (1xx) answers' included
MAX_HEAD_BYTES = 64 * 1024  # bytes of the head(s) before the final answer's body
DECODE_CHUNK = HIGH_WATER  # bytes one decompress call may produce

_OVERSIZED_HEAD = "The upstream server sent an oversized response head."


class _HeadTooLarge(Exception):
    """Raised in a parser callback to stop the parser (the exchange holds the real error)."""


class Exchange:
    """One request's response on ``conn``: its parser (a new one per exchange; the connection's
    bytes go here while it is current), head, body pieces and timer."""

    __slots__ = (
        "body",
        "body_end",
        "buffered",
        "complete",
        "conn",
        "deadline",
        "exc",
        "got_bytes",
        "head_bytes",
        "header_count",
        "headers",
        "headers_done",
        "keep_alive",
        "last_data",
        "loop",
        "on_body",
        "parser",
        "paused",
        "raw_headers",
        "read_timeout",
        "status",
        "timer",
        "until_close",
        "wait_since",
        "waiter",
    )

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.loop = conn.loop
        self.body: list[bytes] = []
        self.on_body = self.body.append  # the parser's body callback: no Python frame per chunk
        self.body_end = 0
        self.buffered = 0
        self.paused = False
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.headers: dict[str, str] = {}
        self.status = 0
        self.head_bytes = 0  # bytes of reads that ended inside the head, then of its header lines
        self.header_count = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.until_close = False
        self.got_bytes = False
        self.exc: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.last_data = self.wait_since = 0.0
        self.deadline = 0.0
        self.read_timeout: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.parser = httptools.HttpResponseParser(self)  # reads the callbacks off self, once

    # -- the connection's bytes ------------------------------------------------------------------
    def received(self, data: bytes) -> None:
        self.got_bytes = True
        self.last_data = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.exc = ProtocolError("The upstream server switched protocols.")
        except httptools.HttpParserError:
            if self.exc is None:  # (a callback's own error stays)
                self.exc = ProtocolError("The upstream server sent a malformed HTTP response.")
        if not self.headers_done and self.exc is None:
            self.head_bytes += len(data)  # a head still unfinished: a line may be growing
            if self.head_bytes > MAX_HEAD_BYTES:
                self.exc = ResponseTooLarge(_OVERSIZED_HEAD)
        if self.complete and len(self.body) > self.body_end:
            del self.body[self.body_end :]  # a second answer's body in the same read: dropped
        self.buffered += len(data)
        if self.buffered > HIGH_WATER and not self.paused:
            self.paused = True
            self.conn.pause_reading()
        self.wake()

    def ended(self) -> None:
        """The server closed its side (EOF or the connection is gone)."""
        if self.complete or self.exc is not None:
            pass
        elif self.headers_done and self.until_close:
            self.complete = True  # a body delimited by the connection's close: this is its end
        elif self.got_bytes:
            self.exc = ConnectionLost("The upstream server closed the connection mid-response.")
        else:
            self.exc = ConnectionLost("The upstream server closed the connection before answering.")
        self.wake()

    # -- httptools callbacks -----------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.complete:  # a second answer in the same read, never used
            return
        size = len(name) + len(value)
        self.header_count += 1
        self.head_bytes += size
        if size > MAX_HEADER_LINE or self.header_count > MAX_HEADERS or self.head_bytes > MAX_HEAD_BYTES:
            self.exc = ResponseTooLarge(_OVERSIZED_HEAD)
            raise _HeadTooLarge
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.complete:
            self.conn.spoiled = True  # a second answer nobody asked for: not reused
            return
        self.status = status = self.parser.get_status_code()
        headers = self.headers
        framed = False
        for name, value in self.raw_headers:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
            if key == "content-length" or key == "transfer-encoding":
                framed = True
        self.until_close = not framed and status >= 200 and status not in (204, 304)
        self.headers_done = True

    def on_message_complete(self) -> None:
        if self.complete:
            return
        if self.status < 200:  # an interim answer (100 Continue): the real one follows
            self.raw_headers.clear()
            self.headers.clear()
            self.headers_done = False
            return
        self.complete = True
        self.body_end = len(self.body)
        self.keep_alive = self.parser.should_keep_alive() and not self.until_close

    # -- waiting, and the call's one timer: the total deadline and the silence between bytes ------
    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self) -> None:
        loop = self.loop
        self.wait_since = loop.time()
        self.waiter = waiter = loop.create_future()
        try:
            await waiter
        finally:
            self.waiter = None

    def arm(self, deadline: float, read_timeout: float | None) -> None:
        """Start the call's timer: the call fails at ``deadline``, or when the server is silent
        for ``read_timeout`` while a reader waits. One timer for the whole call: when it fires
        early it re-checks the time of the last byte and sets itself again (no timer per read)."""
        self.deadline = deadline
        self.read_timeout = read_timeout
        self.last_data = now = self.loop.time()
        due = deadline if read_timeout is None else min(deadline, now + read_timeout)
        self.timer = self.loop.call_at(due, self._on_timer)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def detach(self) -> None:
        """Done with this exchange: its timer stops, and the parser goes (it refers back to this
        object: left in place, the pair would wait for the cyclic garbage collector)."""
        self.disarm()
        if hasattr(self, "parser"):
            del self.parser

    def _on_timer(self) -> None:
        self.timer = None
        if self.complete or self.exc is not None:
            return
        now = self.loop.time()
        if now >= self.deadline:
            self._fail(TimeoutError())  # the call's total deadline
            return
        due = self.deadline
        if (timeout := self.read_timeout) is not None:
            if self.waiter is None:  # the reader is busy elsewhere: the server is not late
                silent_until = now + timeout
            else:  # silent for ``timeout`` while the reader waited
                silent_until = max(self.last_data, self.wait_since) + timeout
            if silent_until <= now:
                self._fail(ReadTimeout("The upstream server sent nothing within the read timeout."))
                return
            due = min(due, silent_until)
        self.timer = self.loop.call_at(due, self._on_timer)

    def _fail(self, exc: BaseException) -> None:
        self.exc = exc
        self.wake()

    def take(self) -> bytes:
        """Everything buffered, as one bytes object; reading resumes if it was paused."""
        body = self.body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self.buffered = 0
        if self.paused:
            self.paused = False
            self.last_data = self.loop.time()  # the server was silent because we stopped reading
            self.conn.resume_reading()
        return data


class _Decoder:
    """``Content-Encoding: gzip`` or ``deflate`` (zlib-wrapped, or raw as some servers send it),
    bounded: one call yields at most :data:`DECODE_CHUNK` bytes (the compressed input it did not
    get to is kept, ``unconsumed_tail``, for the next), and the whole decoded body at most
    ``limit`` bytes (a compression bomb fails there, not in the gateway's memory)."""

    __slots__ = ("_left", "_raw", "_tail", "_z", "pending")

    def __init__(self, encoding: str, limit: int) -> None:
        self._raw = encoding == "deflate"
        self._z = zlib.decompressobj(zlib.MAX_WBITS | 16 if encoding == "gzip" else zlib.MAX_WBITS)
        self._tail = b""
        self._left = limit
        self.pending = False  # output may remain for a call with no new input

    def decode(self, data: bytes) -> bytes:
        if self._tail:
            data = self._tail + data
        bound = min(DECODE_CHUNK, self._left + 1)
        try:
            out = self._z.decompress(data, bound)
        except zlib.error:
            if self._raw:  # a raw deflate stream: retry once without the zlib wrapper
                self._raw = False
                self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                self._tail = b""
                return self.decode(data)
            raise ProtocolError("The upstream server sent a body that does not decompress.") from None
        self._raw = False  # it decoded as sent
        self._tail = self._z.unconsumed_tail
        self.pending = bool(self._tail) or len(out) == bound
        self._count(len(out))
        return out

    def flush(self) -> bytes:
        try:
            out = self._z.flush()  # small: every decode call before ran until it ran short
        except zlib.error:
            raise ProtocolError("The upstream server sent a body that does not decompress.") from None
        self._count(len(out))
        return out

    def _count(self, n: int) -> None:
        self._left -= n
        if self._left < 0:
            raise ResponseTooLarge("The upstream server sent a body larger than the gateway accepts.")


class Response:
    """An answer whose head has arrived: ``status``, ``headers`` (lower-case names), and the
    body through :meth:`read` until it returns None. :meth:`release` gives the connection back to
    the pool if the body was read to its end with keep-alive and closes it otherwise."""

    __slots__ = ("_decoder", "_exchange", "headers", "status")

    def __init__(self, exchange: Exchange, body_limit: int) -> None:
        self._exchange: Exchange | None = exchange
        self.status = exchange.status
        self.headers = exchange.headers
        encoding = exchange.headers.get("content-encoding", "").strip().lower()
        self._decoder = _Decoder(encoding, body_limit) if encoding in ("gzip", "deflate") else None

    @property
    def at_eof(self) -> bool:
        ex = self._exchange
        return ex is None or (ex.complete and not ex.body and not (self._decoder and self._decoder.pending))

    async def read(self) -> bytes | None:
        """Body bytes that arrived since the last read (waiting for some), None at the end; a
        compressed body comes out at most :data:`DECODE_CHUNK` decoded bytes per read."""
        ex = self._exchange
        if ex is None:
            return None
        decoder = self._decoder
        while True:
            if decoder is not None and decoder.pending:
                if data := decoder.decode(b""):
                    return data
                continue
            if ex.body:
                data = ex.take()
                if decoder is None:
                    return data
                if data := decoder.decode(data):
                    return data
                continue
            if ex.exc is not None:
                raise ex.exc
            if ex.complete:
                if decoder is not None:
                    self._decoder = None
                    if tail := decoder.flush():
                        return tail
                self.release()
                return None
            await ex.wait()

    def release(self) -> None:
        """Done with the answer: a finished keep-alive one returns the connection to the pool,
        anything else (unread body, error, ``Connection: close``) closes it."""
        ex = self._exchange
        if ex is None:
            return
        self._exchange = None
        ex.detach()
        conn = ex.conn
        conn.exchange = None
        if ex.complete and ex.keep_alive and ex.exc is None and not ex.body and conn.usable:
            conn.pool.release(conn)
        else:
            conn.close()
