"""The pool: one provider's connections (idle keep-alive ones reused newest first, at most
``max_connections`` open, idle ones closed after :data:`IDLE_SECONDS`), the request head (its
header names and values validated as h11 validates them), and getting a connection: a pooled one
checked for stale bytes or an EOF first, or a new one (direct, or through a forward proxy:
absolute-form requests for http://, a ``CONNECT`` tunnel then TLS for https://).

A request is written once. Once its bytes went out, a connection that closes before the answer
is :class:`~adapters.http1.errors.ConnectionLost` (the server may have processed it: sending it
again could run a generation twice); whether to try again is the route's retry policy.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections import deque
from collections.abc import Mapping, Sequence
from urllib.parse import SplitResult, urlsplit

import aiohappyeyeballs

from adapters.http1 import network
from adapters.http1.connection import Connection, PoolKey
from adapters.http1.errors import ConnectError, ConnectFailure, RequestNotSent
from adapters.http1.exchange import Response
from adapters.http1.proxy import Proxy, ProxyChoice, open_tunnel

__all__ = ["IDLE_SECONDS", "Pool"]

IDLE_SECONDS = 30.0  # an idle pooled connection is closed after this long
_DEFAULT_PORTS = {"http": 80, "https": 443}
# The caller's header lines, whole: a token for the name (h11's and RFC 9110's) and a value of
# visible ASCII, spaces and tabs (h11's field-value without obs-text: no byte >= 0x80; the
# spaces around a value it drops are left as given). A NUL, another control byte, DEL, a line
# break or a non-ASCII character anywhere fails it.
_HEADER_LINES = re.compile(r"(?:[-!#$%&'*+.^_`|~0-9A-Za-z]+: [\t -~]*\r\n)*")
# framing headers the client writes itself; a caller's would be a second one
_OWN_HEADERS = frozenset({"host", "content-length", "transfer-encoding"})


class _Target:
    """A parsed upstream URL: the pool key, where to connect, the request line's target and the
    proxy it goes through."""

    __slots__ = ("authority", "host", "host_header", "key", "path", "port", "proxy", "tls")

    def __init__(self, parts: SplitResult, choose: ProxyChoice) -> None:
        if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
            raise RequestNotSent("The upstream URL is not an HTTP or HTTPS URL.")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        try:
            port = parts.port
        except ValueError:
            raise RequestNotSent("The upstream URL's port is not valid.") from None
        self.port = port or _DEFAULT_PORTS[parts.scheme]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if port is None else f"{host}:{port}"
        self.authority = f"{host}:{self.port}"
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.proxy = choose(parts.scheme, self.authority)
        self.key: PoolKey = (self.tls, self.host, self.port)


class Pool:
    """One provider's connections. Made inside the running loop; :meth:`aclose` closes all.
    ``body_limit`` bounds a compressed answer's decoded body; ``proxy`` is used for every call,
    or, when there is none and ``trust_env``, the environment's proxy settings."""

    def __init__(
        self,
        *,
        max_connections: int,
        connect_timeout: float,
        tls: ssl.SSLContext,
        proxy: str | None,
        user_agent: str,
        body_limit: int,
        trust_env: bool = False,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.tls = tls
        self.body_limit = body_limit
        self.proxies = ProxyChoice(proxy, trust_env=trust_env)
        self.idle: dict[PoolKey, list[Connection]] = {}
        self.open = 0  # connections counted against max_connections (connecting ones included)
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.closed = False
        self._sweeper: asyncio.TimerHandle | None = None
        self._targets: dict[str, _Target] = {}
        self._names: set[str] = set()  # request header names that passed the full check
        # The request head's fixed lines, after Host (with and without the default content type)
        fixed = f"user-agent: {user_agent}\r\naccept-encoding: gzip, deflate\r\n"
        self._prefix = (fixed + "content-type: application/json\r\n", fixed)

    # -- the request ----------------------------------------------------------------------------
    def _target(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            target = _Target(urlsplit(url), self.proxies)
            if len(self._targets) >= 256:
                self._targets.clear()
            self._targets[url] = target
        return target

    def _head(self, method: str, target: _Target, headers: Mapping[str, str], length: int) -> bytes:
        extra = "".join([f"{k}: {v}\r\n" for k, v in headers.items()])
        # the usual case in a few C calls: names seen before (so none of ours), values printable
        # ASCII (no control byte, DEL, line break or tab); anything else goes to the full check
        if not (
            extra.isascii()
            and extra.count("\r\n") == len(headers)
            and extra.replace("\r\n", "").isprintable()
            and self._names.issuperset(headers)
        ):
            self._check_headers(headers, extra)
        proxy = target.proxy
        if proxy is not None and not target.tls:
            line = f"{method} http://{target.host_header}{target.path} HTTP/1.1\r\n"
            extra += proxy.auth
        else:
            line = f"{method} {target.path} HTTP/1.1\r\n"
        default_type = not any(k.lower() == "content-type" for k in headers)
        head = (
            f"{line}host: {target.host_header}\r\n{self._prefix[0 if default_type else 1]}"
            f"content-length: {length}\r\n{extra}\r\n"
        )
        try:
            return head.encode()
        except UnicodeEncodeError:  # a lone surrogate in the URL's path
            raise RequestNotSent("The upstream URL is not valid text; the request was not sent.") from None

    def _check_headers(self, headers: Mapping[str, str], extra: str) -> None:
        """Refuse a header h11 would refuse, or one the client writes itself; remember the names
        of headers that pass (so that the next request's check is the fast one)."""
        if _HEADER_LINES.fullmatch(extra) is None or extra.count("\n") != len(headers):
            raise RequestNotSent(
                "A request header has a name that is not a token or a value with a control "
                "character, a line break or a non-ASCII character; the request was not sent."
            )
        if not _OWN_HEADERS.isdisjoint(k.lower() for k in headers):
            raise RequestNotSent(
                "A request header names Host, Content-Length or Transfer-Encoding, which the client "
                "writes itself; the request was not sent."
            )
        if len(self._names) > 256:
            self._names.clear()
        self._names.update(headers)

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
        """Send the request, once; return once the answer's head has arrived. ``total`` bounds
        the whole call (the body's reading too, until :meth:`Response.release`); ``read_timeout``
        bounds each silence from the server while a reader waits (None: only ``total``)."""
        target = self._target(url)
        head = self._head(method, target, headers, len(body))
        deadline = self.loop.time() + total
        conn = await self._acquire(target, deadline)
        try:
            ex = conn.start()
            ex.arm(deadline, read_timeout)
            assert conn.transport is not None
            conn.transport.write(head + body)
            while not ex.headers_done and ex.exc is None:
                await ex.wait()
            if ex.exc is not None:
                raise ex.exc
            return Response(ex, self.body_limit)
        except BaseException:
            conn.close()
            raise

    # -- connections ----------------------------------------------------------------------------
    def _idle_for(self, target: _Target) -> Connection | None:
        """The newest idle connection to ``target`` still fit for a request; unfit ones close."""
        idle = self.idle.get(target.key)
        while idle:
            conn = idle.pop()
            if conn.reusable():
                return conn
            conn.close()
        return None

    async def _acquire(self, target: _Target, deadline: float) -> Connection:
        """A connection for ``target``: an idle one (newest first), else a new one once fewer
        than ``max_connections`` are open."""
        if self.closed:
            raise ConnectError(ConnectFailure.CLIENT_CLOSED)
        if (conn := self._idle_for(target)) is not None:
            return conn
        if self.open >= self.max_connections:
            self._evict_idle()  # an idle connection to another host gives up its place
        if self.open < self.max_connections and not self.waiters:
            return await self._connect(target, deadline)
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
                    if (conn := self._idle_for(target)) is not None:
                        self._wake_waiter()  # pass the turn on if more remain
                        return conn
                    if self.open < self.max_connections:
                        break
        except TimeoutError:
            raise self._late(limit, ConnectFailure.POOL_FULL) from None
        return await self._connect(target, deadline)

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

    def _late(self, limit: float, reason: ConnectFailure) -> BaseException:
        if limit < self.connect_timeout:
            return TimeoutError()  # the call's total deadline came first
        return ConnectError(reason)

    async def _connect(self, target: _Target, deadline: float) -> Connection:
        loop = self.loop
        self.open += 1
        conn = Connection(self, target.key)
        limit = min(self.connect_timeout, deadline - loop.time())
        try:
            async with asyncio.timeout(limit):
                await self._open(conn, target)
        except TimeoutError:
            conn.abort()
            raise self._late(limit, ConnectFailure.TIMED_OUT) from None
        except OSError as exc:  # refused, unresolvable, unreachable, TLS refused (ssl.SSLError)
            conn.abort()
            raise ConnectError(network.connect_failure(exc)) from None
        except BaseException:
            conn.abort()
            raise
        if conn.closed:  # lost while connecting; already forgotten
            raise ConnectError(ConnectFailure.CLOSED)
        return conn

    async def _open(self, conn: Connection, target: _Target) -> None:
        loop = self.loop
        proxy: Proxy | None = target.proxy
        if proxy is None:
            sock = await network.open_socket(loop, await self.resolve(target.host, target.port))
            await loop.create_connection(
                lambda: conn,
                sock=sock,
                ssl=self.tls if target.tls else None,
                server_hostname=target.host if target.tls else None,
            )
            return
        sock = await network.open_socket(loop, await self.resolve(proxy.host, proxy.port))
        await loop.create_connection(lambda: conn, sock=sock)
        if target.tls:
            await open_tunnel(conn, target.authority, proxy)
            assert conn.transport is not None
            transport = await loop.start_tls(conn.transport, conn, self.tls, server_hostname=target.host)
            if transport is None:  # pragma: no cover - start_tls returns None only for a closed loop
                raise ConnectError(ConnectFailure.TLS)
            conn.transport = transport

    async def resolve(self, host: str, port: int) -> Sequence[aiohappyeyeballs.AddrInfoType]:
        """The addresses to connect to, in the resolver's order (the system's, via the loop)."""
        return await network.resolve(self.loop, host, port)

    def release(self, conn: Connection) -> None:
        if self.closed:
            conn.close()
            return
        conn.idle_since = self.loop.time()
        self.idle.setdefault(conn.key, []).append(conn)
        if self._sweeper is None:
            self._sweeper = self.loop.call_at(conn.idle_since + IDLE_SECONDS, self._sweep)
        self._wake_waiter()

    def forget(self, conn: Connection) -> None:
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
