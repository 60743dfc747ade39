"""The upstream HTTP transport: one pooled aiohttp client per provider (TLS from the system trust
store, an optional forward proxy), a call whose response body is read within one total deadline,
bounded reads of error bodies, the mapping of aiohttp's failures to ``gateway.kernel.errors``, and
the one log line per call (:class:`UpstreamCall`).

Messages are the gateway's own words: no upstream URL, key or raw body ever reaches one.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import structlog

from adapters.sse import SSEDecodeError, SSEDecoder, SSEEvent
from adapters.upstream_errors import map_status_error
from gateway.kernel.errors import UpstreamConnectError, UpstreamError, UpstreamTimeout
from gateway.kernel.ids import safe_id
from gateway.kernel.settings import ProviderSettings

__all__ = [
    "ERROR_BODY_LIMIT",
    "UpstreamCall",
    "UpstreamClient",
    "UpstreamStream",
    "map_transport_error",
    "open_stream",
]

# aiohttp's client logs nothing per request at INFO; keep it that way even under a DEBUG root.
logging.getLogger("aiohttp.client").setLevel(logging.WARNING)
log = structlog.get_logger("adapters.upstream")

ERROR_BODY_LIMIT = 64 * 1024  # bytes of an error body read to pick a code; the rest is dropped
# The provider's own id for a call, in a response header: OpenAI's x-request-id, Anthropic's request-id.
_ID_HEADERS = ("x-request-id", "request-id")


class UpstreamCall:
    """One upstream call's ``upstream_call`` log line (info): ``request_id`` (the request's, sent as
    X-Request-Id when id-shaped), the provider ``kind``, the HTTP ``status`` (None: no answer), the provider's
    ``upstream_request_id``, ``duration_ms`` to the end of the body and the ``error_code`` of a
    failed call. :func:`open_stream` notes the answer; the caller calls :meth:`log` once, at the end."""

    __slots__ = ("error_code", "kind", "request_id", "start", "status", "upstream_request_id")

    def __init__(self, kind: str, request_id: str | None) -> None:
        self.kind = kind
        self.request_id = request_id
        self.start = time.perf_counter()
        self.status: int | None = None
        self.upstream_request_id: str | None = None
        self.error_code: str | None = None

    def answered(self, status: int, headers: Mapping[str, str]) -> None:
        self.status = status
        for name in _ID_HEADERS:
            if (found := safe_id(headers.get(name))) is not None:
                self.upstream_request_id = found
                return

    def body_id(self, value: object) -> None:
        """An id the body names (Gemini's ``responseId``), for a provider whose headers had none."""
        if self.upstream_request_id is None:
            self.upstream_request_id = safe_id(value)

    def log(self) -> None:
        log.info(
            "upstream_call",
            request_id=self.request_id,
            kind=self.kind,
            status=self.status,
            upstream_request_id=self.upstream_request_id,
            duration_ms=round((time.perf_counter() - self.start) * 1000, 3),
            error_code=self.error_code,
        )


def _tls_context() -> ssl.SSLContext:
    """The system's trust store; certifi's bundle when the system has none (slim containers)."""
    ctx = ssl.create_default_context()
    if not ctx.cert_store_stats().get("x509_ca"):
        try:
            import certifi

            ctx.load_verify_locations(certifi.where())
        except ImportError:  # pragma: no cover - certifi is usually present
            pass
    return ctx


class UpstreamClient:
    """One provider's pooled HTTP/1.1 keep-alive connections (an ``aiohttp.ClientSession`` made
    lazily inside the running loop) and its timeouts.

    aiohttp directly, not through httpx: measured here, httpx's request/response layer cost
    ~165 µs of CPU per upstream call on top of the connection engine, about a fifth of the
    gateway's whole cost per proxied request. aiohttp's ``total`` timeout is checked at each
    await inside aiohttp (never across the caller's ``yield``), so one timer bounds a call.
    """

    __slots__ = ("_session", "_tls", "connect_timeout", "max_connections", "proxy", "read_timeout")

    def __init__(self, settings: ProviderSettings) -> None:
        t = settings.timeouts
        self.connect_timeout = t.connect
        self.read_timeout = t.read
        self.max_connections = settings.max_connections
        self.proxy = settings.proxy.get_secret_value() if settings.proxy is not None else None
        self._session: aiohttp.ClientSession | None = None
        self._tls: ssl.SSLContext | None = None

    def timeout(self, total: float, *, streamed: bool = True) -> aiohttp.ClientTimeout:
        """connect: waiting for a pooled connection plus connecting; sock_read: between bytes of a
        stream (an unstreamed reply may rightly be silent until it is whole: only ``total``)."""
        connect = self.connect_timeout
        return aiohttp.ClientTimeout(
            total=total,
            connect=connect,
            sock_connect=connect,
            sock_read=self.read_timeout if streamed else None,
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            if self._tls is None:
                self._tls = _tls_context()
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, keepalive_timeout=30.0, ttl_dns_cache=60, ssl=self._tls
            )
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


class UpstreamStream:
    """An upstream response whose status is 2xx.

    Read it with :meth:`events` (SSE), :meth:`read_json` or :meth:`next_chunk`; all continue
    one underlying (content-decoded) byte stream and map transport failures and the call's
    deadline to ``UpstreamError``s. After a logical end (``[DONE]``), :meth:`drain` reads the
    rest so the connection can go back to the pool.
    """

    __slots__ = ("_content", "response")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self._content = response.content

    @property
    def status_code(self) -> int:
        return self.response.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self.response.headers

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body, or None at its end."""
        content = self._content
        try:
            if _TAKE_FAST and len(content._buffer) > 1 and content._exception is None:
                return _take_buffered(content)
            chunk = await content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise map_transport_error(exc) from None
        return chunk or None

    async def events(self) -> AsyncGenerator[SSEEvent, None]:
        """Server-sent events decoded from the body; an unterminated last event is delivered too."""
        decoder = SSEDecoder()
        try:
            while (chunk := await self.next_chunk()) is not None:
                for ev in decoder.feed(chunk):
                    yield ev
            for ev in decoder.flush():
                yield ev
        except SSEDecodeError:
            raise UpstreamError("The upstream provider sent an oversized stream event.") from None

    async def read_json(self, limit: int = 64 * 1024 * 1024) -> Any:
        """The rest of the body parsed as JSON (for a server that did not stream)."""
        buf = bytearray()
        while (chunk := await self.next_chunk()) is not None:
            buf += chunk
            if len(buf) > limit:
                raise UpstreamError("The upstream provider sent an oversized response.")
        try:
            return orjson.loads(buf)
        except orjson.JSONDecodeError:
            raise UpstreamError("The upstream provider sent a malformed response.") from None

    async def drain(self, *, seconds: float = 1.0, max_bytes: int = 64 * 1024) -> bool:
        """Read and drop what is left of the body (briefly); True if it ended, so keep-alive works."""
        if self._content.at_eof():  # the usual case: the body's end came with its last event
            return True
        seen = 0
        try:
            async with asyncio.timeout(seconds):
                while (chunk := await self.next_chunk()) is not None:
                    seen += len(chunk)
                    if seen > max_bytes:
                        return False
        except (UpstreamError, TimeoutError):
            return False
        return True

    def close(self) -> None:
        """A finished body returns the connection to the pool; an unfinished one closes it, so
        the upstream sees the client go and stops generating."""
        if self._content.is_eof():
            self.response.release()
        else:
            self.response.close()


# aiohttp's ``StreamReader.readany`` takes its buffered pieces (one per HTTP chunk: an SSE
# upstream sends one event per chunk) one at a time, and after each calls the protocol's
# ``resume_reading``, which re-runs the HTTP parser on empty input and resumes the transport:
# ~1.5-2 µs per upstream chunk here, the largest per-delta cost left in the relay (issue 14).
# ``_take_buffered`` does what ``readany`` does with several pieces buffered (the same
# bookkeeping as ``StreamReader._read_nowait_chunk``, aiohttp 3.10-3.14) with one
# ``resume_reading`` at the end. It needs StreamReader's private slots: when a future aiohttp
# lacks any of them, ``readany`` is used as before (tests/adapters/test_transport_take.py
# checks that the fast path is active on the installed aiohttp and returns the same bytes).
_TAKE_SLOTS = (
    "_buffer",
    "_buffer_offset",
    "_size",
    "_cursor",
    "_http_chunk_splits",
    "_low_water",
    "_low_water_chunks",
    "_protocol",
    "_timer",
    "_exception",
)
_TAKE_FAST = all(name in getattr(aiohttp.StreamReader, "__slots__", ()) for name in _TAKE_SLOTS)


def _take_buffered(content: Any) -> bytes:
    """Every piece buffered in ``content`` (an ``aiohttp.StreamReader`` holding two or more and
    no exception), joined; flow control resumed once, as ``readany`` would after its last piece."""
    content._timer.assert_timeout()
    buf = content._buffer
    if content._buffer_offset:  # only read(n) leaves a partly taken piece; the gateway never calls it
        buf[0] = buf[0][content._buffer_offset :]
        content._buffer_offset = 0
    data = b"".join(buf)
    buf.clear()
    size = len(data)
    content._size -= size
    content._cursor += size
    cursor = content._cursor
    splits = content._http_chunk_splits
    while splits and splits[0] < cursor:  # chunk ends already read (aiohttp keeps the current one)
        splits.popleft()
    if content._size < content._low_water and (splits is None or len(splits) < content._low_water_chunks):
        content._protocol.resume_reading()
    return data


@asynccontextmanager
async def open_stream(
    client: UpstreamClient,
    method: str,
    url: str,
    *,
    json_body: Any,
    headers: Mapping[str, str],
    total_timeout: float,
    streamed: bool = True,
    call: UpstreamCall | None = None,
) -> AsyncIterator[UpstreamStream]:
    """Send a request; yield its response, body not yet read, once its status is 2xx.

    A non-2xx status reads up to ``ERROR_BODY_LIMIT`` bytes and raises ``map_status_error``.
    ``total_timeout`` bounds the whole call, reading included; ``streamed`` (the answer comes as
    a stream) adds the per-read timeout. ``call`` notes the status and the provider's id of any
    answer. Leaving the block closes the response: an unfinished body closes the connection, so
    the upstream sees it.
    """
    try:
        response = await client.session.request(
            method,
            url,
            data=orjson.dumps(json_body),
            headers={"content-type": "application/json", **headers},
            allow_redirects=False,
            timeout=client.timeout(total_timeout, streamed=streamed),
            proxy=client.proxy,
        )
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise map_transport_error(exc) from None
    stream = UpstreamStream(response)
    if call is not None:
        call.answered(response.status, response.headers)
    try:
        if not 200 <= response.status < 300:
            body = await _read_bounded(stream)
            raise map_status_error(response.status, body, response.headers)
        yield stream
    finally:
        stream.close()


async def _read_bounded(stream: UpstreamStream) -> bytes:
    buf = bytearray()
    try:
        while (chunk := await stream.next_chunk()) is not None:
            buf += chunk
            if len(buf) >= ERROR_BODY_LIMIT:
                break
    except UpstreamError:
        pass  # the status alone decides; a half-read error body is still useful
    return bytes(buf[:ERROR_BODY_LIMIT])


def map_transport_error(exc: BaseException) -> UpstreamError:
    """The gateway error for an aiohttp transport failure or the call's deadline (``TimeoutError``)."""
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        return UpstreamConnectError("The gateway could not connect to the upstream provider.", retryable=True)
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return UpstreamTimeout("The upstream provider did not respond in time.", retryable=True)
    if isinstance(exc, TimeoutError):  # aiohttp's total timeout, or a caller's deadline
        return UpstreamTimeout("The upstream call exceeded its total time limit.", retryable=True)
    if isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError):
        return UpstreamError("The connection to the upstream provider was lost.", retryable=True)
    if isinstance(exc, aiohttp.ClientResponseError):
        return UpstreamError("The upstream provider sent a malformed HTTP response.", retryable=True)
    return UpstreamError("The upstream request failed.")
