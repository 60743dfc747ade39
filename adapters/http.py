"""Shared upstream HTTP plumbing: the pooled client, a streaming call with a total deadline,
and the one mapping from HTTP statuses, in-stream errors and transport failures to ``gateway.kernel.errors``.

Messages are the gateway's own words: no upstream URL, key or raw body ever reaches one.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import re
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson

from adapters.sse import SSEDecodeError, SSEDecoder, SSEEvent
from gateway.kernel.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamRejected,
    UpstreamTimeout,
)
from gateway.kernel.settings import ProviderSettings

__all__ = [
    "ERROR_BODY_LIMIT",
    "UpstreamClient",
    "UpstreamStream",
    "create_client",
    "error_code_from_body",
    "map_status_error",
    "map_stream_error",
    "map_transport_error",
    "open_stream",
    "parse_retry_after",
]

# aiohttp's client logs nothing per request at INFO; keep it that way even under a DEBUG root.
logging.getLogger("aiohttp.client").setLevel(logging.WARNING)

ERROR_BODY_LIMIT = 64 * 1024  # bytes of an error body read to pick a code; the rest is dropped
_RETRYABLE_STATUSES = frozenset({408, 409, 425, 500, 502, 503, 504, 520, 522, 524, 529})
_REJECTED_STATUSES = frozenset({400, 404, 405, 413, 415, 422})
_CODE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]{0,63}$")
# Upstream codes that say nothing beyond the HTTP status; the gateway's own code is better.
_GENERIC_CODES = frozenset(
    {
        "error",
        "api_error",
        "invalid_request_error",
        "invalid_request",
        "invalid_argument",
        "bad_request",
        "badrequesterror",
        "server_error",
        "internal",
        "internal_error",
        "internal_server_error",
        "not_found",
        "not_found_error",
        "unknown",
        "failed_precondition",
    }
)
_CONTEXT_HINTS = (
    "context length",
    "context_length",
    "context window",
    "maximum context",
    "prompt is too long",
    "too many tokens",
    "input token count",
    "exceeds the maximum number of tokens",
    "reduce the length",
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


def create_client(settings: ProviderSettings) -> UpstreamClient:
    """One pooled client per provider; connect/read timeouts from ``settings``."""
    return UpstreamClient(settings)


class UpstreamStream:
    """An upstream response whose status is 2xx.

    Read it with :meth:`events` (SSE), :meth:`aiter_bytes` or :meth:`read_json`; all continue
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
        try:
            chunk = await self._content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise map_transport_error(exc) from None
        return chunk or None

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive."""
        while (chunk := await self.next_chunk()) is not None:
            yield chunk

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
) -> AsyncIterator[UpstreamStream]:
    """Send a request with a streamed response; yield it once its status is 2xx.

    A non-2xx status reads up to ``ERROR_BODY_LIMIT`` bytes and raises ``map_status_error``.
    ``total_timeout`` bounds the whole call, reading included; ``streamed`` (the answer comes as
    a stream) adds the per-read timeout. Leaving the block closes the
    response: an unfinished body closes the connection, so the upstream sees it.
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


# -- error mapping ----------------------------------------------------------------------------
def parse_retry_after(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds to wait, from ``retry-after-ms``, or ``retry-after`` as seconds or an HTTP date."""
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            value = float(ms) / 1000.0
            if math.isfinite(value):
                return max(value, 0.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    raw = raw.strip()
    try:
        value = float(raw)
        return max(value, 0.0) if math.isfinite(value) else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    current = time.time() if now is None else now
    return max(when.timestamp() - current, 0.0)


def error_code_from_body(body: bytes | Mapping[str, Any] | None) -> str | None:
    """A useful, safe error code from an OpenAI, Anthropic or Gemini error body, or None.

    Looks at ``error.code`` (when a string), ``error.type``, ``error.status``; generic codes
    are ignored, and a message that says the context window was exceeded gives
    ``context_length_exceeded``. Nothing else of the body is kept.
    """
    data: Any = body
    if isinstance(body, bytes | bytearray):
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(data, Mapping):
        return None
    err = data.get("error")
    if isinstance(err, list) and err and isinstance(err[0], Mapping):
        err = err[0]  # some Gemini proxies wrap the error object in a list
    if not isinstance(err, Mapping):
        return None
    for key in ("code", "type", "status"):
        value = err.get(key)
        if isinstance(value, str) and _CODE_RE.match(value):
            code = value.lower()
            if code not in _GENERIC_CODES:
                return code
    message = err.get("message")
    if isinstance(message, str):
        lowered = message[:2000].lower()
        if any(hint in lowered for hint in _CONTEXT_HINTS):
            return "context_length_exceeded"
    return None


def map_status_error(status: int, body: bytes, headers: Mapping[str, str] | None = None) -> UpstreamError:
    """The gateway error for an upstream non-2xx response (the body only picks the ``code``)."""
    code = error_code_from_body(body)
    retry_after = parse_retry_after(headers)
    if status == 429:
        if code == "insufficient_quota":  # OpenAI's "out of credit": retrying will not help
            return UpstreamRateLimited(
                "The upstream provider's quota is exhausted.",
                code="upstream_quota_exceeded",
                upstream_status=status,
            )
        return UpstreamRateLimited(
            "The upstream provider is rate limiting requests; retry later.",
            retryable=True,
            retry_after=retry_after,
            upstream_status=status,
        )
    if status in (401, 403):
        return UpstreamError(
            "The gateway could not authenticate with the upstream provider.",
            code="upstream_auth_error",
            upstream_status=status,
        )
    if status in _REJECTED_STATUSES:
        return UpstreamRejected(
            f"The upstream provider rejected the request (HTTP {status}).",
            code=code,
            upstream_status=status,
        )
    if status in _RETRYABLE_STATUSES:
        return UpstreamError(
            f"The upstream provider failed (HTTP {status}).",
            retryable=True,
            retry_after=retry_after,
            upstream_status=status,
        )
    return UpstreamError(
        f"The upstream provider returned an unexpected status (HTTP {status}).",
        retryable=status >= 500,
        upstream_status=status,
    )


def map_stream_error(
    kind: str | None,
    code: str | None,
    *,
    rate_limited: str,
    rejected: frozenset[str],
    retryable: frozenset[str],
    auth: frozenset[str] = frozenset(),
) -> UpstreamError:
    """The gateway error for an error the provider reported inside a 200 stream.

    ``kind`` is the provider's own classification (Anthropic's ``type``, Gemini's ``status``, an
    OpenAI ``code``); the sets say which kinds mean what. An unknown kind is not retryable, a
    missing one is (the provider failed without saying why).
    """
    if kind == rate_limited:
        return UpstreamRateLimited(
            "The upstream provider is rate limiting requests; retry later.", retryable=True
        )
    if kind in rejected:
        return UpstreamRejected("The upstream provider rejected the request.", code=code)
    if kind in auth:
        return UpstreamError(
            "The gateway could not authenticate with the upstream provider.", code="upstream_auth_error"
        )
    return UpstreamError(
        "The upstream provider failed while generating.",
        retryable=kind is None or kind in retryable,
        code=code,
    )


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
