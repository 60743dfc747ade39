"""A lean HTTP/1.1 keep-alive client for upstream calls: asyncio transports, the ``httptools``
response parser (the C parser uvicorn uses), a LIFO pool of idle connections, an optional
forward proxy (absolute-form requests for http://, ``CONNECT`` then TLS for https://).

Only what the gateway needs: POST/GET with a whole body, responses framed by Content-Length,
chunked or the connection's close, gzip/deflate decoding. :mod:`adapters.transport` is the
gateway-facing layer (errors, logging, SSE); nothing else imports this module.

Costs per call are kept to a few Python calls: the request head is one string built from a
per-client prefix, the parser runs once per socket read, a reader wakes once per socket read and
takes everything buffered as one bytes object, and the total and read timeouts are one timer per
call that re-checks the time of the last byte when it fires (no timer per chunk).

Error messages here are fixed words: no URL, key or body ever reaches one.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import zlib
from collections import deque
from collections.abc import Mapping, Sequence
from urllib.parse import SplitResult, unquote, urlsplit

import aiohappyeyeballs
import httptools

__all__ = [
    "ConnectError",
    "ConnectionLost",
    "HTTPClientError",
    "InvalidRequest",
    "Pool",
    "ProtocolError",
    "ReadTimeout",
    "Response",
]

IDLE_SECONDS = 30.0  # an idle pooled connection is closed after this long
HIGH_WATER = 256 * 1024  # bytes buffered unread before the socket stops being read
# Happy Eyeballs (RFC 8305, by aiohappyeyeballs, as aiohttp connects): a host's next address is
# tried after this long while the first still connects, so an address that never answers (an
# IPv6 route that drops packets) costs this delay, not the connect timeout
HAPPY_EYEBALLS_DELAY = 0.25
_DEFAULT_PORTS = {"http": 80, "https": 443}


class HTTPClientError(Exception):
    """A failure of an upstream call; the message is fixed (never a URL or a body)."""


class ConnectError(HTTPClientError):
    """No connection: refused, unresolvable, TLS refused, a proxy refused, or no connection (new
    or pooled) within the connect timeout."""


class ReadTimeout(HTTPClientError):
    """Nothing came from the server for the read timeout while a reader waited."""


class ConnectionLost(HTTPClientError):
    """The server closed or reset the connection before the response ended."""


class ProtocolError(HTTPClientError):
    """The server's bytes were not a valid HTTP/1.1 response."""


class InvalidRequest(HTTPClientError):
    """The request cannot be sent as given (a URL scheme other than http/https, a header with a
    line break or outside UTF-8)."""


class _LostBeforeAnswer(ConnectionLost):
    """A reused connection closed before any byte of the answer: the server had dropped it idle."""


class _Target:
    """A parsed upstream URL: the pool key, where to connect and the request line's target."""

    __slots__ = ("host", "host_header", "key", "path", "port", "tls")

    def __init__(self, parts: SplitResult) -> None:
        if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
            raise InvalidRequest("The upstream URL is not an HTTP or HTTPS URL.")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        try:
            port = parts.port
        except ValueError:
            raise InvalidRequest("The upstream URL's port is not valid.") from None
        self.port = port or _DEFAULT_PORTS[parts.scheme]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if port is None else f"{host}:{port}"
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.key = (self.tls, self.host, self.port)


class _Proxy:
    __slots__ = ("auth", "host", "port")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise InvalidRequest("The forward proxy URL must use plain HTTP.")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.auth = ""
        if parts.username is not None:
            cred = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self.auth = f"proxy-authorization: Basic {base64.b64encode(cred).decode()}\r\n"


class _Conn(asyncio.Protocol):
    """One connection and the state of the response being read on it."""

    __slots__ = (
        "body",
        "body_end",
        "buffered",
        "closed",
        "complete",
        "deadline",
        "eof",
        "exc",
        "got_bytes",
        "headers",
        "headers_done",
        "idle_since",
        "keep_alive",
        "key",
        "last_data",
        "loop",
        "parser",
        "paused",
        "pool",
        "raw_headers",
        "read_timeout",
        "status",
        "timer",
        "transport",
        "tunnel",
        "until_close",
        "wait_since",
        "waiter",
    )

    def __init__(self, pool: Pool, key: tuple[bool, str, int]) -> None:
        self.pool = pool
        self.key = key
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.tunnel: bytearray | None = None  # a CONNECT answer's head being read
        self.closed = False
        self.eof = False
        self.idle_since = 0.0
        # the body's pieces, one per HTTP chunk, appended by the parser without a Python frame
        self.body: list[bytes] = []
        self.parser = httptools.HttpResponseParser(_Callbacks(self))  # one per connection
        self._reset()

    def _reset(self) -> None:
        """Ready for the next answer (the parser is between messages: the last one ended)."""
        self.body.clear()
        self.body_end = 0
        self.buffered = 0
        self.paused = False
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.headers: dict[str, str] = {}
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.until_close = False
        self.got_bytes = False
        self.exc: BaseException | None = None
        self.last_data = self.wait_since = 0.0
        self.deadline = 0.0
        self.read_timeout: float | None = None
        self.timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.tunnel is not None:
            self.tunnel += data
            if b"\r\n\r\n" in self.tunnel:
                self._wake()
            return
        if self.complete or self.exc is not None:
            self.eof = True  # bytes after the answer (or an idle connection talking): not reused
            return
        self.got_bytes = True
        self.last_data = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.exc = ProtocolError("The upstream server switched protocols.")
        except httptools.HttpParserError:
            self.exc = ProtocolError("The upstream server sent a malformed HTTP response.")
        if self.complete and len(self.body) > self.body_end:
            del self.body[self.body_end :]  # a second answer's body in the same read: dropped
        self.buffered += len(data)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._ended()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended()
        if not self.closed:
            self.closed = True
            self.pool._forget(self)

    # -- httptools callbacks -----------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.complete:  # (after it: a second answer in the same read, never used)
            self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.complete:
            self.eof = True  # a second answer nobody asked for: this connection is not reused
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

    # -- the client's side -------------------------------------------------------------------------
    def _ended(self) -> None:
        """The server closed its side (EOF or the connection is gone)."""
        self.eof = True
        if self.complete or self.exc is not None:
            pass
        elif self.headers_done and self.until_close:
            self.complete = True  # a body delimited by the connection's close: this is its end
        elif self.got_bytes:
            self.exc = ConnectionLost("The upstream server closed the connection mid-response.")
        else:
            self.exc = _LostBeforeAnswer("The upstream server closed the connection.")
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- the call's one timer: the total deadline and the silence between bytes -------------------
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
        self._wake()

    async def wait(self) -> None:
        loop = self.loop
        self.wait_since = loop.time()
        self.waiter = waiter = loop.create_future()
        try:
            await waiter
        finally:
            self.waiter = None

    def take(self) -> bytes:
        """Everything buffered, as one bytes object; reading resumes if it was paused."""
        body = self.body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self.buffered = 0
        if self.paused:
            self.paused = False
            self.last_data = self.loop.time()  # the server was silent because we stopped reading
            if self.transport is not None:
                self.transport.resume_reading()
        return data

    def close(self) -> None:
        self.disarm()
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
            self.pool._forget(self)

    @property
    def usable(self) -> bool:
        t = self.transport
        return not (self.closed or self.eof or t is None or t.is_closing())


class _Callbacks:
    """What the parser calls: the body straight into the connection's list (``list.append``, no
    Python frame per HTTP chunk), the rest through the connection's methods."""

    __slots__ = ("on_body", "on_header", "on_headers_complete", "on_message_complete")

    def __init__(self, conn: _Conn) -> None:
        self.on_body = conn.body.append
        self.on_header = conn.on_header
        self.on_headers_complete = conn.on_headers_complete
        self.on_message_complete = conn.on_message_complete


class _Decoder:
    """``Content-Encoding: gzip`` or ``deflate`` (zlib-wrapped, or raw as some servers send it)."""

    __slots__ = ("_raw", "_z")

    def __init__(self, encoding: str) -> None:
        self._raw = encoding == "deflate"
        self._z = zlib.decompressobj(zlib.MAX_WBITS | 16 if encoding == "gzip" else zlib.MAX_WBITS)

    def decode(self, data: bytes) -> bytes:
        try:
            return self._z.decompress(data)
        except zlib.error:
            if self._raw:  # a raw deflate stream: retry once without the zlib wrapper
                self._raw = False
                self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                return self.decode(data)
            raise ProtocolError("The upstream server sent a body that does not decompress.") from None

    def flush(self) -> bytes:
        try:
            return self._z.flush()
        except zlib.error:
            raise ProtocolError("The upstream server sent a body that does not decompress.") from None


class Response:
    """An answer whose head has arrived: ``status``, ``headers`` (lower-case names), and the
    body through :meth:`read` until it returns None. :meth:`release` gives the connection back to
    the pool if the body was read to its end with keep-alive and closes it otherwise."""

    __slots__ = ("_conn", "_decoder", "headers", "status")

    def __init__(self, conn: _Conn) -> None:
        self._conn: _Conn | None = conn
        self.status = conn.status
        self.headers = conn.headers
        encoding = conn.headers.get("content-encoding", "").strip().lower()
        self._decoder = _Decoder(encoding) if encoding in ("gzip", "deflate") else None

    @property
    def at_eof(self) -> bool:
        conn = self._conn
        return conn is None or (conn.complete and not conn.body)

    async def read(self) -> bytes | None:
        """All body bytes that arrived since the last read (waiting for some), None at the end."""
        conn = self._conn
        if conn is None:
            return None
        while True:
            if conn.body:
                data = conn.take()
                if self._decoder is None:
                    return data
                if data := self._decoder.decode(data):
                    return data
                continue
            if conn.exc is not None:
                raise conn.exc
            if conn.complete:
                if self._decoder is not None:
                    decoder, self._decoder = self._decoder, None
                    if tail := decoder.flush():
                        return tail
                self.release()
                return None
            await conn.wait()

    def release(self) -> None:
        """Done with the answer: a finished keep-alive one returns the connection to the pool,
        anything else (unread body, error, ``Connection: close``) closes it."""
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        conn.disarm()
        if conn.complete and conn.keep_alive and conn.exc is None and not conn.body and conn.usable:
            conn.pool._release(conn)
        else:
            conn.close()


class Pool:
    """One provider's connections: idle keep-alive ones reused newest first, at most
    ``max_connections`` open (a caller waits for one within the connect timeout), idle ones
    closed after :data:`IDLE_SECONDS`. Made inside the running loop; :meth:`aclose` closes all."""

    def __init__(
        self,
        *,
        max_connections: int,
        connect_timeout: float,
        tls: ssl.SSLContext,
        proxy: str | None,
        user_agent: str,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.tls = tls
        self.proxy = _Proxy(proxy) if proxy else None
        self.idle: dict[tuple[bool, str, int], list[_Conn]] = {}
        self.open = 0  # connections counted against max_connections (connecting ones included)
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.closed = False
        self._sweeper: asyncio.TimerHandle | None = None
        self._targets: dict[str, _Target] = {}
        # The request head's fixed lines, after Host (with and without the default content type)
        fixed = f"user-agent: {user_agent}\r\naccept-encoding: gzip, deflate\r\n"
        self._prefix = (fixed + "content-type: application/json\r\n", fixed)

    # -- the request ----------------------------------------------------------------------------
    def _target(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            target = _Target(urlsplit(url))
            if len(self._targets) >= 256:
                self._targets.clear()
            self._targets[url] = target
        return target

    def _head(self, method: str, target: _Target, headers: Mapping[str, str], length: int) -> bytes:
        extra = "".join([f"{k}: {v}\r\n" for k, v in headers.items()])
        n = len(headers)
        # each line brings one CR and one LF; any more is a header trying to add a line
        if extra.count("\n") != n or extra.count("\r") != n:
            raise InvalidRequest("A request header contains a line break; the request was not sent.")
        default_type = not any(k.lower() == "content-type" for k in headers)
        if self.proxy is not None and not target.tls:
            line = f"{method} http://{target.host_header}{target.path} HTTP/1.1\r\n"
            extra += self.proxy.auth
        else:
            line = f"{method} {target.path} HTTP/1.1\r\n"
        head = (
            f"{line}host: {target.host_header}\r\n{self._prefix[0 if default_type else 1]}"
            f"content-length: {length}\r\n{extra}\r\n"
        )
        try:
            return head.encode()
        except UnicodeEncodeError:  # a lone surrogate
            raise InvalidRequest("A request header is not valid text; the request was not sent.") from None

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes,
        headers: Mapping[str, str],
        total: float,
        read_timeout: float | None,
    ) -> Response:
        """Send the request; return once the answer's head has arrived. ``total`` bounds the
        whole call (the body's reading too, until :meth:`Response.release`); ``read_timeout``
        bounds each silence from the server while a reader waits (None: only ``total``)."""
        loop = self.loop
        target = self._target(url)
        head = self._head(method, target, headers, len(body))
        deadline = loop.time() + total
        conn: _Conn | None = None
        try:
            for attempt in (0, 1):
                conn, reused = await self._acquire(target, deadline, fresh=attempt > 0)
                conn.arm(deadline, read_timeout)
                assert conn.transport is not None
                conn.transport.write(head + body)
                while not conn.headers_done and conn.exc is None:
                    await conn.wait()
                if conn.exc is None:
                    return Response(conn)
                exc = conn.exc
                conn.close()
                conn = None
                if not (reused and attempt == 0 and isinstance(exc, _LostBeforeAnswer)):
                    raise exc  # (a server that dropped an idle connection gets one fresh try)
            raise AssertionError("unreachable")  # pragma: no cover
        except BaseException:
            if conn is not None:
                conn.close()
            raise

    # -- connections ----------------------------------------------------------------------------
    async def _acquire(self, target: _Target, deadline: float, *, fresh: bool) -> tuple[_Conn, bool]:
        """A connection for ``target`` and whether it was pooled: an idle one (newest first;
        not if ``fresh``), else a new one once fewer than ``max_connections`` are open."""
        if self.closed:
            raise ConnectError("The upstream client is closed.")
        idle = None if fresh else self.idle.get(target.key)
        while idle:
            conn = idle.pop()
            if conn.usable:
                conn._reset()
                return conn, True
            conn.close()
        if self.open >= self.max_connections:
            self._evict_idle()  # an idle connection to another host gives up its place
        if self.open < self.max_connections and not self.waiters:
            return await self._connect(target, deadline), False
        loop = self.loop
        limit = min(self.connect_timeout, deadline - loop.time())
        try:
            async with asyncio.timeout(limit):
                while True:
                    waiter = loop.create_future()
                    self.waiters.append(waiter)
                    try:
                        await waiter
                    except BaseException:
                        if waiter.done() and not waiter.cancelled():
                            self._wake_waiter()  # woken, but leaving: hand the turn on
                        else:
                            self.waiters.remove(waiter)
                        raise
                    idle = self.idle.get(target.key)
                    while idle:
                        conn = idle.pop()
                        if conn.usable:
                            conn._reset()
                            self._wake_waiter()  # pass the turn on if more remain
                            return conn, True
                        conn.close()
                    if self.open < self.max_connections:
                        break
        except TimeoutError:
            raise self._late(limit) from None
        return await self._connect(target, deadline), False

    def _evict_idle(self) -> None:
        for idle in self.idle.values():
            if idle:
                idle[0].close()  # the oldest
                return

    def _wake_waiter(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _late(self, limit: float) -> BaseException:
        if limit < self.connect_timeout:
            return TimeoutError()  # the call's total deadline came first
        return ConnectError("No connection to the upstream server within the connect timeout.")

    async def _connect(self, target: _Target, deadline: float) -> _Conn:
        loop = self.loop
        self.open += 1
        conn = _Conn(self, target.key)
        limit = min(self.connect_timeout, deadline - loop.time())
        try:
            async with asyncio.timeout(limit):
                proxy = self.proxy
                if proxy is None:
                    await loop.create_connection(
                        lambda: conn,
                        sock=await self._socket(target.host, target.port),
                        ssl=self.tls if target.tls else None,
                        server_hostname=target.host if target.tls else None,
                    )
                else:
                    sock = await self._socket(proxy.host, proxy.port)
                    await loop.create_connection(lambda: conn, sock=sock)
                    if target.tls:
                        await self._tunnel(conn, target, proxy)
        except TimeoutError:
            self._abandon(conn)
            raise self._late(limit) from None
        except ConnectError:
            self._abandon(conn)
            raise
        except OSError:  # refused, unresolvable, unreachable, TLS refused (ssl.SSLError)
            self._abandon(conn)
            raise ConnectError("The gateway could not connect to the upstream server.") from None
        except BaseException:
            self._abandon(conn)
            raise
        if conn.closed:  # lost while connecting; already forgotten
            raise ConnectError("The gateway could not connect to the upstream server.")
        return conn

    async def _socket(self, host: str, port: int) -> socket.socket:
        """A connected TCP socket to ``host``: its addresses resolved by the loop, then raced
        (Happy Eyeballs, :data:`HAPPY_EYEBALLS_DELAY`). Raises OSError when none connects."""
        infos = await self.resolve(host, port)
        if not infos:
            raise OSError("no address")
        return await aiohappyeyeballs.start_connection(
            infos, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY, interleave=1, loop=self.loop
        )

    async def resolve(self, host: str, port: int) -> Sequence[aiohappyeyeballs.AddrInfoType]:
        """The addresses to connect to, in the resolver's order (the system's, via the loop)."""
        return await self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)

    async def _tunnel(self, conn: _Conn, target: _Target, proxy: _Proxy) -> None:
        """``CONNECT`` through the proxy, then TLS to the upstream over the tunnel."""
        assert conn.transport is not None
        conn.tunnel = bytearray()
        host = f"[{target.host}]" if ":" in target.host else target.host
        authority = f"{host}:{target.port}"
        conn.transport.write(
            f"CONNECT {authority} HTTP/1.1\r\nhost: {authority}\r\n{proxy.auth}\r\n".encode()
        )
        while b"\r\n\r\n" not in conn.tunnel:
            if conn.eof or conn.closed:
                raise ConnectError("The forward proxy closed the connection.")
            if len(conn.tunnel) > 64 * 1024:
                raise ConnectError("The forward proxy sent an oversized answer.")
            await conn.wait()
        status = bytes(conn.tunnel).split(b"\r\n", 1)[0].split(b" ")
        conn.tunnel = None
        if len(status) < 2 or status[1] != b"200":
            raise ConnectError("The forward proxy refused the tunnel.")
        transport = await self.loop.start_tls(conn.transport, conn, self.tls, server_hostname=target.host)
        if transport is None:  # pragma: no cover - start_tls returns None only for a closed loop
            raise ConnectError("The TLS handshake through the proxy failed.")
        conn.transport = transport  # type: ignore[assignment]

    def _abandon(self, conn: _Conn) -> None:
        if conn.transport is not None:
            conn.transport.abort()  # nothing to flush; connection_lost comes later and is a no-op
        if not conn.closed:
            conn.closed = True
            self._forget(conn)

    def _release(self, conn: _Conn) -> None:
        if self.closed:
            conn.close()
            return
        conn.idle_since = self.loop.time()
        self.idle.setdefault(conn.key, []).append(conn)
        if self._sweeper is None:
            self._sweeper = self.loop.call_at(conn.idle_since + IDLE_SECONDS, self._sweep)
        self._wake_waiter()

    def _forget(self, conn: _Conn) -> None:
        """``conn`` is closed: it no longer counts, and a waiter may open another."""
        self.open -= 1
        idle = self.idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)
        self._wake_waiter()

    def _sweep(self) -> None:
        self._sweeper = None
        now = self.loop.time()
        oldest = now
        for idle in self.idle.values():
            for conn in [c for c in idle if now - c.idle_since >= IDLE_SECONDS]:
                conn.close()
            oldest = min([oldest, *(c.idle_since for c in idle)])
        if any(self.idle.values()):
            self._sweeper = self.loop.call_at(oldest + IDLE_SECONDS, self._sweep)

    async def aclose(self) -> None:
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for idle in list(self.idle.values()):
            for conn in list(idle):
                conn.close()
        self.idle.clear()
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)
        await asyncio.sleep(0)  # let the transports' close callbacks run
