"""The upstream HTTP transport: one pooled HTTP/1.1 client per provider (:mod:`adapters.http1`;
TLS from the system trust store, an optional forward proxy), a call whose response body is read
within one total deadline, bounded reads of error bodies, the mapping of the client's failures to
``gateway.kernel.errors``, and the one log line per call (:class:`UpstreamCall`).

Messages are the gateway's own words (and, for an error status a retry cannot fix, the provider's
reason, scrubbed: adapters/upstream_errors.py): no upstream URL, key or raw body ever reaches one.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import orjson
import structlog

from adapters.http1 import (
    ConnectError,
    ConnectionLost,
    HTTPClientError,
    Pool,
    ProtocolError,
    ReadTimeout,
    RequestNotSent,
    Response,
    ResponseTooLarge,
)
from adapters.upstream_errors import map_status_error
from gateway.kernel.errors import UpstreamConnectError, UpstreamError, UpstreamTimeout
from gateway.kernel.ids import safe_id
from gateway.kernel.settings import ProviderSettings

__all__ = [
    "ERROR_BODY_LIMIT",
    "RESPONSE_BODY_LIMIT",
    "UpstreamCall",
    "UpstreamClient",
    "UpstreamStream",
    "map_transport_error",
    "open_stream",
]

log = structlog.get_logger("adapters.upstream")

ERROR_BODY_LIMIT = 64 * 1024  # bytes of an error body read to pick a code; the rest is dropped
# bytes of an unstreamed answer's body (read_json), and of any compressed answer's decoded body
RESPONSE_BODY_LIMIT = 64 * 1024 * 1024
# The provider's own id for a call, in a response header: OpenAI's x-request-id, Anthropic's request-id.
_ID_HEADERS = ("x-request-id", "request-id")
USER_AGENT = "openresponses-gateway"


class UpstreamCall:
    """One upstream call's ``upstream_call`` log line (info): ``request_id`` (the request's, sent as
    X-Request-Id when id-shaped), the provider ``kind``, the HTTP ``status`` (None: no answer), the provider's
    ``upstream_request_id``, ``duration_ms`` to the end of the body and the ``error_code`` and
    ``error`` (the gateway's own fixed words, e.g. why no connection was made) of a failed call,
    with ``upstream_reason``, the provider's own message, scrubbed (``UpstreamError.reason``).
    :func:`open_stream` notes the answer; the caller calls :meth:`log` once, at the end."""

    __slots__ = (
        "error",
        "error_code",
        "kind",
        "reason",
        "request_id",
        "start",
        "status",
        "upstream_request_id",
    )

    def __init__(self, kind: str, request_id: str | None) -> None:
        self.kind = kind
        self.request_id = request_id
        self.start = time.perf_counter()
        self.status: int | None = None
        self.upstream_request_id: str | None = None
        self.error_code: str | None = None
        self.error: str | None = None
        self.reason: str | None = None

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

    def failed(self, exc: UpstreamError) -> None:
        self.error_code = exc.code
        self.error = exc.message
        self.reason = exc.reason

    def log(self) -> None:
        log.info(
            "upstream_call",
            request_id=self.request_id,
            kind=self.kind,
            status=self.status,
            upstream_request_id=self.upstream_request_id,
            duration_ms=round((time.perf_counter() - self.start) * 1000, 3),
            error_code=self.error_code,
            error=self.error,
            upstream_reason=self.reason,
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


class CallTimeouts(NamedTuple):
    """One call's limits: ``total`` for all of it (the body too), ``connect`` for getting a
    connection (waiting for a pooled one plus TCP/TLS), ``read`` between bytes (None: only total)."""

    total: float
    connect: float
    read: float | None


class UpstreamClient:
    """One provider's pooled HTTP/1.1 keep-alive connections (an :class:`adapters.http1.Pool` made
    lazily inside the running loop) and its timeouts.

    Why this client: the gateway first used httpx, whose request/response layer cost ~165 µs of
    CPU per upstream call on top of its connection engine (about a fifth of the gateway's cost
    per proxied request), so it moved to aiohttp directly. Measured again for the WebSocket relay,
    aiohttp itself cost ~170 µs of CPU per small streamed POST and ~1.3 µs per streamed HTTP chunk
    where a bare asyncio protocol costs ~50 µs and ~0.35 µs: about a quarter of the gateway's CPU
    per WebSocket turn. :mod:`adapters.http1` is that bare protocol made complete for the gateway
    (httptools' C parser, a LIFO pool, proxy, TLS, gzip, the three timeouts with one timer per
    call rather than per chunk): measured in the same runs, 0.24-0.47 of aiohttp's CPU for a small
    streamed call, 0.13-0.19 of it for a 4096-chunk stream, and 20-29% less gateway CPU per
    WebSocket turn; docs/benchmarks.md, "The upstream HTTP client", has the figures.
    """

    __slots__ = ("_pool", "_tls", "connect_timeout", "max_connections", "proxy", "read_timeout", "trust_env")

    def __init__(self, settings: ProviderSettings) -> None:
        t = settings.timeouts
        self.connect_timeout = t.connect
        self.read_timeout = t.read
        self.max_connections = settings.max_connections
        self.proxy = settings.proxy.get_secret_value() if settings.proxy is not None else None
        self.trust_env = settings.trust_env  # no proxy configured: the environment's HTTP(S)_PROXY
        self._pool: Pool | None = None
        self._tls: ssl.SSLContext | None = None

    def timeout(self, total: float, *, streamed: bool = True) -> CallTimeouts:
        """connect: waiting for a pooled connection plus connecting; read: between bytes of a
        stream (an unstreamed reply may rightly be silent until it is whole: only ``total``)."""
        return CallTimeouts(total, self.connect_timeout, self.read_timeout if streamed else None)

    @property
    def pool(self) -> Pool:
        if self._pool is None or self._pool.closed:
            if self._tls is None:
                self._tls = _tls_context()
            self._pool = Pool(
                max_connections=self.max_connections,
                connect_timeout=self.connect_timeout,
                tls=self._tls,
                proxy=self.proxy,
                user_agent=USER_AGENT,
                body_limit=RESPONSE_BODY_LIMIT,
                trust_env=self.trust_env,
            )
        return self._pool

    async def aclose(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.aclose()


class UpstreamStream:
    """An upstream response whose status is 2xx.

    Read it with :meth:`read_json` or :meth:`next_chunk` (the SSE decoding is the adapters'
    ``EventReader``); both continue one underlying (content-decoded) byte stream and map
    transport failures and the call's deadline to ``UpstreamError``s. After a logical end
    (``[DONE]``), :meth:`drain` reads the rest so the connection can go back to the pool.
    """

    __slots__ = ("response",)

    def __init__(self, response: Response) -> None:
        self.response = response

    @property
    def status_code(self) -> int:
        return self.response.status

    @property
    def headers(self) -> Mapping[str, str]:
        """The answer's headers, names in lower case."""
        return self.response.headers

    async def next_chunk(self) -> bytes | None:
        """All of the body that arrived since the last call (one piece per socket read, however
        many HTTP chunks it held), or None at its end."""
        try:
            return await self.response.read()
        except (HTTPClientError, TimeoutError) as exc:
            raise map_transport_error(exc) from None

    async def read_json(self, limit: int = RESPONSE_BODY_LIMIT) -> Any:
        """The rest of the body parsed as JSON (for a server that did not stream). The answer is
        under way: a connection lost now is not worth sending the request again."""
        buf = bytearray()
        read = self.response.read
        try:
            while (chunk := await read()) is not None:
                buf += chunk
                if len(buf) > limit:
                    raise UpstreamError("The upstream provider sent an oversized response.")
        except (HTTPClientError, TimeoutError) as exc:
            raise map_transport_error(exc, generating=True) from None
        try:
            return orjson.loads(buf)
        except orjson.JSONDecodeError:
            raise UpstreamError("The upstream provider sent a malformed response.") from None

    async def drain(self, *, seconds: float = 1.0, max_bytes: int = 64 * 1024) -> bool:
        """Read and drop what is left of the body (briefly); True if it ended, so keep-alive works."""
        if self.response.at_eof:  # the usual case: the body's end came with its last event
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
        self.response.release()


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

    A non-2xx status reads up to ``ERROR_BODY_LIMIT`` bytes and raises ``map_status_error`` (the
    URL's host and the values of credential headers are taken out of the provider's reason).
    ``total_timeout`` bounds the whole call, reading included; ``streamed`` (the answer comes as
    a stream) adds the per-read timeout; unstreamed, a connection lost once the request went out
    is not retryable (the upstream may have been generating the whole answer). ``call`` notes the
    status and the provider's id of any answer. Leaving the block closes the response: an
    unfinished body closes the connection, so the upstream sees it.
    """
    limits = client.timeout(total_timeout, streamed=streamed)  # connect: the pool's own
    try:
        response = await client.pool.request(
            method,
            url,
            body=orjson.dumps(json_body),
            headers=headers,  # content-type: application/json unless these name one
            total=limits.total,
            read_timeout=limits.read,
        )
    except (HTTPClientError, TimeoutError) as exc:
        raise map_transport_error(exc, generating=not streamed) from None
    stream = UpstreamStream(response)
    if call is not None:
        call.answered(response.status, response.headers)
    try:
        if not 200 <= response.status < 300:
            body = await _read_bounded(stream)
            raise map_status_error(response.status, body, response.headers, known=_known(url, headers))
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


_CREDENTIAL_NAMES = ("key", "auth", "token", "secret", "signature")


def _known(url: str, headers: Mapping[str, str]) -> list[str]:
    """What an error body may echo that is the gateway's own: the upstream URL and its host, and
    the values of credential headers (a bearer token alone too)."""
    known = [url]
    if host := urlsplit(url).hostname:
        known.append(host)
    for name, value in headers.items():
        if any(word in name.lower() for word in _CREDENTIAL_NAMES):
            known += [value, value.rsplit(" ", 1)[-1]]
    return sorted(known, key=len, reverse=True)  # the longest first: a host inside its URL


def map_transport_error(exc: BaseException, *, generating: bool = False) -> UpstreamError:
    """The gateway error for a failure of the HTTP client (:mod:`adapters.http1`) or the call's
    deadline (``TimeoutError``). ``generating``: the request went out and the upstream may be
    generating its whole answer (an unstreamed call), so a lost connection or a broken answer is
    not retryable: sending it again would run the generation again."""
    if isinstance(exc, ConnectError):  # the reason in fixed words: refused, timed out, certificate ...
        return UpstreamConnectError(
            f"The gateway could not connect to the upstream provider: {exc.reason}.", retryable=True
        )
    if isinstance(exc, ReadTimeout):
        return UpstreamTimeout("The upstream provider did not respond in time.", retryable=True)
    if isinstance(exc, TimeoutError):  # the call's total deadline, or a caller's
        return UpstreamTimeout("The upstream call exceeded its total time limit.", retryable=True)
    if isinstance(exc, ConnectionLost | ConnectionError):
        if generating:
            return UpstreamError(
                "The upstream provider failed: the connection was lost after the request was sent "
                "(it is not sent again: it may have been processed)."
            )
        return UpstreamError("The upstream provider failed: the connection was lost.", retryable=True)
    if isinstance(exc, ResponseTooLarge):  # a head or decoded body past its limit: not retried
        return UpstreamError("The upstream provider sent an oversized response.")
    if isinstance(exc, ProtocolError):
        malformed = "The upstream provider sent a malformed HTTP response."
        return UpstreamError(malformed, retryable=not generating)
    if isinstance(exc, RequestNotSent):
        return UpstreamError(str(exc))  # fixed words (adapters/http1/): never the URL or a value
    return UpstreamError("The upstream request failed.")
