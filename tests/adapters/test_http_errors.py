"""adapters/http.py: status and transport error mapping, Retry-After, and open_stream on real sockets."""

from __future__ import annotations

import asyncio
import email.utils
import time
from typing import Any

import aiohttp
import httpx
import orjson
import pytest

from adapters.http import (
    ERROR_BODY_LIMIT,
    create_client,
    error_code_from_body,
    map_status_error,
    map_transport_error,
    open_stream,
    parse_retry_after,
)
from gateway.kernel.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamRejected,
    UpstreamTimeout,
)
from gateway.kernel.settings import ProviderSettings, Timeouts
from tests.fakes.server import serve_asgi, serve_raw, unused_port

SECRET = "sk-live-SECRET-0123456789"
MARKER = "RAW-UPSTREAM-BODY-MARKER"


def _openai(code: str | None, message: str = MARKER, type_: str = "invalid_request_error") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})


def _assert_clean(err: UpstreamError) -> None:
    text = repr((str(err), err.message, err.error_object(), err.http_body(), err.stream_event(0)))
    for bad in (MARKER, SECRET, "127.0.0.1", "http://"):
        assert bad not in text


# -- map_status_error -----------------------------------------------------------------------------
@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 529])
def test_retryable_statuses(status: int) -> None:
    err = map_status_error(status, _openai(None, type_="server_error"), {})
    assert type(err) is UpstreamError
    assert err.retryable and err.upstream_status == status
    assert err.status == 502 and err.code == "upstream_error"
    _assert_clean(err)


@pytest.mark.parametrize("status", [400, 404, 422])
def test_rejected_statuses(status: int) -> None:
    err = map_status_error(status, _openai(None), {})
    assert isinstance(err, UpstreamRejected)
    assert not err.retryable and err.status == 400
    assert err.code == "upstream_invalid_request"
    _assert_clean(err)


def test_context_length_code_from_openai_body() -> None:
    err = map_status_error(400, _openai("context_length_exceeded"), {})
    assert isinstance(err, UpstreamRejected) and err.code == "context_length_exceeded"
    _assert_clean(err)


def test_context_length_from_message_hints() -> None:
    anthropic = orjson.dumps(
        {"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 1 > 0"}}
    )
    gemini = orjson.dumps(
        {
            "error": {
                "code": 400,
                "status": "INVALID_ARGUMENT",
                "message": "The input token count (9) exceeds the maximum number of tokens allowed (8).",
            }
        }
    )
    vllm = orjson.dumps(
        {
            "error": {
                "message": "This model's maximum context length is 8 tokens.",
                "type": "BadRequestError",
                "code": 400,
            }
        }
    )
    for body in (anthropic, gemini, vllm):
        assert map_status_error(400, body, {}).code == "context_length_exceeded"


def test_error_code_from_body_shapes() -> None:
    assert error_code_from_body(_openai("model_not_found")) == "model_not_found"
    assert error_code_from_body(orjson.dumps({"type": "error", "error": {"type": "overloaded_error"}})) == (
        "overloaded_error"
    )
    assert error_code_from_body(orjson.dumps({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}})) == (
        "resource_exhausted"
    )
    assert error_code_from_body(_openai(None)) is None  # generic type only
    assert error_code_from_body(_openai("has spaces <script>")) is None
    assert error_code_from_body(_openai("x" * 100)) is None
    assert error_code_from_body(b"<html>502 Bad Gateway</html>") is None
    assert error_code_from_body(b"") is None
    assert error_code_from_body(orjson.dumps([1, 2])) is None


def test_429_rate_limited_with_retry_after() -> None:
    err = map_status_error(429, _openai("rate_limit_exceeded"), {"retry-after": "7"})
    assert isinstance(err, UpstreamRateLimited)
    assert err.retryable and err.retry_after == 7.0 and err.status == 429
    assert err.code == "rate_limit_exceeded"
    _assert_clean(err)


def test_429_insufficient_quota_is_not_retryable() -> None:
    err = map_status_error(429, _openai("insufficient_quota"), {"retry-after": "1"})
    assert isinstance(err, UpstreamRateLimited) and not err.retryable
    _assert_clean(err)


@pytest.mark.parametrize("status", [401, 403])
def test_auth_errors(status: int) -> None:
    err = map_status_error(status, _openai("invalid_api_key", message=f"Incorrect API key {SECRET}"), {})
    assert type(err) is UpstreamError and err.code == "upstream_auth_error" and not err.retryable
    _assert_clean(err)


def test_other_statuses() -> None:
    err = map_status_error(418, b"teapot " + MARKER.encode(), {})
    assert type(err) is UpstreamError and not err.retryable and err.upstream_status == 418
    _assert_clean(err)
    assert map_status_error(501, b"", {}).retryable


def test_503_carries_retry_after() -> None:
    assert map_status_error(503, b"", {"retry-after": "2"}).retry_after == 2.0


# -- Retry-After ----------------------------------------------------------------------------------
def test_parse_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after": " 1.5 "}) == 1.5
    assert parse_retry_after({"retry-after": "-4"}) == 0.0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert 28.0 <= parse_retry_after({"retry-after": date}, now=now) <= 31.0  # type: ignore[operator]
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after({"retry-after": past}, now=now) == 0.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after": "nan"}) is None
    assert parse_retry_after({}) is None
    assert parse_retry_after(None) is None
    assert parse_retry_after(httpx.Headers({"Retry-After": "5"})) == 5.0


# -- map_transport_error --------------------------------------------------------------------------
_CONN_KEY = aiohttp.client_reqrep.ConnectionKey("127.0.0.1", 1, False, True, None, None, None)


@pytest.mark.parametrize(
    ("exc", "cls", "retryable"),
    [
        (
            aiohttp.ClientConnectorError(_CONN_KEY, OSError(111, f"refused {SECRET}")),
            UpstreamConnectError,
            True,
        ),
        (aiohttp.ConnectionTimeoutError(f"timed out http://x?key={SECRET}"), UpstreamConnectError, True),
        (aiohttp.SocketTimeoutError("read"), UpstreamTimeout, True),
        (TimeoutError(), UpstreamTimeout, True),
        (aiohttp.ServerDisconnectedError(), UpstreamError, True),
        (aiohttp.ClientPayloadError("truncated"), UpstreamError, True),
        (aiohttp.ClientOSError(104, "reset"), UpstreamError, True),
        (aiohttp.InvalidURL(f"ftp://x?key={SECRET}"), UpstreamError, False),
    ],
)
def test_transport_errors(exc: BaseException, cls: type[UpstreamError], retryable: bool) -> None:
    err = map_transport_error(exc)
    assert type(err) is cls and err.retryable is retryable
    _assert_clean(err)


def test_create_client_settings() -> None:
    s = ProviderSettings(
        kind="openai-chat", timeouts=Timeouts(connect=3, read=40, total=100), max_connections=7
    )
    client = create_client(s)
    t = client.timeout(100)
    assert (t.total, t.sock_connect, t.sock_read) == (100, 3, 40)
    assert client.max_connections == 7


# -- open_stream over real sockets ----------------------------------------------------------------
def _app(status: int, body: bytes, *, headers: dict[str, str] | None = None, delay: float = 0.0) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        if delay:
            await asyncio.sleep(delay)
        hdrs = [(b"content-type", b"application/json")] + [
            (k.encode(), v.encode()) for k, v in (headers or {}).items()
        ]
        await send({"type": "http.response.start", "status": status, "headers": hdrs})
        await send({"type": "http.response.body", "body": body})

    return app


def _settings(url: str, **timeouts: float) -> ProviderSettings:
    return ProviderSettings(kind="openai-chat", base_url=url, api_key=SECRET, timeouts=Timeouts(**timeouts))


async def _call(url: str, settings: ProviderSettings, total: float = 5.0) -> bytes:
    client = create_client(settings)
    try:
        async with open_stream(
            client,
            "POST",
            url,
            json_body={"a": 1},
            headers={"authorization": f"Bearer {SECRET}"},
            total_timeout=total,
        ) as up:
            return b"".join([c async for c in up.aiter_bytes()])
    finally:
        await client.aclose()


async def test_open_stream_ok() -> None:
    async with serve_asgi(_app(200, b'{"ok":true}')) as server:
        assert await _call(server.url + "/x", _settings(server.url)) == b'{"ok":true}'


@pytest.mark.parametrize(
    ("status", "cls"), [(429, UpstreamRateLimited), (500, UpstreamError), (400, UpstreamRejected)]
)
async def test_open_stream_maps_status(status: int, cls: type[UpstreamError]) -> None:
    body = _openai("context_length_exceeded" if status == 400 else None, message=f"{MARKER} {SECRET}")
    async with serve_asgi(_app(status, body, headers={"retry-after": "3"})) as server:
        with pytest.raises(UpstreamError) as info:
            await _call(server.url + "/x", _settings(server.url))
    err = info.value
    assert type(err) is cls and err.upstream_status == status
    if status == 429:
        assert err.retry_after == 3.0
    if status == 400:
        assert err.code == "context_length_exceeded"
    _assert_clean(err)
    assert err.__cause__ is None


async def test_open_stream_huge_error_body_is_bounded() -> None:
    body = _openai("context_length_exceeded") + b" " * (ERROR_BODY_LIMIT * 4)
    async with serve_asgi(_app(400, body)) as server:
        with pytest.raises(UpstreamRejected) as info:
            await _call(server.url + "/x", _settings(server.url))
    assert info.value.code is not None  # mapped from the truncated body without reading it all


async def test_open_stream_connect_refused() -> None:
    url = f"http://127.0.0.1:{unused_port()}"
    with pytest.raises(UpstreamConnectError) as info:
        await _call(url + "/x", _settings(url))
    assert info.value.retryable
    _assert_clean(info.value)


async def test_open_stream_read_timeout() -> None:
    async with serve_asgi(_app(200, b"{}", delay=1.0)) as server:
        with pytest.raises(UpstreamTimeout) as info:
            await _call(server.url + "/x", _settings(server.url, read=0.2))
    assert info.value.retryable
    _assert_clean(info.value)


async def test_open_stream_total_timeout() -> None:
    # The server would answer after 5 s; the 0.2 s total deadline must cut the call well before.
    # (The bound is loose because a loaded machine can starve the loop for a second or two.)
    async with serve_asgi(_app(200, b"{}", delay=5.0)) as server:
        client = create_client(_settings(server.url))
        started = time.monotonic()
        with pytest.raises(UpstreamTimeout) as info:
            async with open_stream(client, "POST", server.url, json_body={}, headers={}, total_timeout=0.2):
                pass
        assert time.monotonic() - started < 4.0
        await client.aclose()
    assert "total time" in info.value.message


async def test_calls_go_through_the_configured_proxy() -> None:
    # A forward proxy gets the absolute-form request line (and answers it here itself).
    seen: list[bytes] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head)
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    async with serve_raw(proxy) as server:
        settings = ProviderSettings(
            kind="openai-chat",
            base_url="http://upstream.invalid/v1",
            proxy=f"http://u:p@127.0.0.1:{server.port}",
        )
        assert await _call("http://upstream.invalid/v1/chat/completions", settings) == b"{}"
    [head] = seen
    assert head.startswith(b"POST http://upstream.invalid/v1/chat/completions HTTP/1.1\r\n")
    assert b"proxy-authorization: basic " in head.lower()
