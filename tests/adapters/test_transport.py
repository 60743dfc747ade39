"""adapters/transport.py: the HTTP client's failures mapped to the gateway's errors, the pooled client's
settings, and open_stream on real sockets (statuses, bounded error bodies, timeouts, proxy)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from adapters.http1 import (
    ConnectError,
    ConnectFailure,
    ConnectionLost,
    ProtocolError,
    ReadTimeout,
    RequestNotSent,
)
from adapters.transport import ERROR_BODY_LIMIT, UpstreamClient, map_transport_error, open_stream
from gateway.kernel.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamRejected,
    UpstreamTimeout,
)
from gateway.kernel.settings import ProviderSettings, Timeouts
from tests.adapters.helpers import SECRET, assert_clean, openai_error
from tests.fakes.server import serve_asgi, serve_raw, unused_port


# -- map_transport_error --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("exc", "cls", "retryable"),
    [
        (ConnectError(ConnectFailure.REFUSED), UpstreamConnectError, True),
        (ConnectError(ConnectFailure.TIMED_OUT), UpstreamConnectError, True),
        (ReadTimeout("read"), UpstreamTimeout, True),
        (TimeoutError(), UpstreamTimeout, True),
        (ConnectionLost("closed"), UpstreamError, True),
        (ConnectionResetError(104, "reset"), UpstreamError, True),
        (ProtocolError(f"bad {SECRET}"), UpstreamError, True),
        (RequestNotSent("The upstream URL is not an HTTP or HTTPS URL."), UpstreamError, False),
        (ValueError(f"ftp://x?key={SECRET}"), UpstreamError, False),
    ],
)
def test_transport_errors(exc: BaseException, cls: type[UpstreamError], retryable: bool) -> None:
    err = map_transport_error(exc)
    assert type(err) is cls and err.retryable is retryable
    assert_clean(err)


def test_client_settings() -> None:
    s = ProviderSettings(
        kind="openai-chat", timeouts=Timeouts(connect=3, read=40, total=100), max_connections=7
    )
    client = UpstreamClient(s)
    t = client.timeout(100)
    assert (t.total, t.connect, t.read) == (100, 3, 40)
    assert client.timeout(100, streamed=False).read is None
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


async def _call(url: str, settings: ProviderSettings, total: float = 5.0) -> Any:
    client = UpstreamClient(settings)
    try:
        async with open_stream(
            client,
            "POST",
            url,
            json_body={"a": 1},
            headers={"authorization": f"Bearer {SECRET}"},
            total_timeout=total,
        ) as up:
            return await up.read_json()
    finally:
        await client.aclose()


async def test_open_stream_ok() -> None:
    async with serve_asgi(_app(200, b'{"ok":true}')) as server:
        assert await _call(server.url + "/x", _settings(server.url)) == {"ok": True}


@pytest.mark.parametrize(
    ("status", "cls"), [(429, UpstreamRateLimited), (500, UpstreamError), (400, UpstreamRejected)]
)
async def test_open_stream_maps_status(status: int, cls: type[UpstreamError]) -> None:
    body = openai_error("context_length_exceeded" if status == 400 else None, message=f"no: {SECRET}")
    async with serve_asgi(_app(status, body, headers={"retry-after": "3"})) as server:
        with pytest.raises(UpstreamError) as info:
            await _call(server.url + "/x", _settings(server.url))
    err = info.value
    assert type(err) is cls and err.upstream_status == status
    if status == 429:
        assert err.retry_after == 3.0
    if status == 400:
        assert err.code == "context_length_exceeded"
    assert_clean(err)
    assert err.__cause__ is None


async def test_open_stream_huge_error_body_is_bounded() -> None:
    body = openai_error("context_length_exceeded") + b" " * (ERROR_BODY_LIMIT * 4)
    async with serve_asgi(_app(400, body)) as server:
        with pytest.raises(UpstreamRejected) as info:
            await _call(server.url + "/x", _settings(server.url))
    assert info.value.code is not None  # mapped from the truncated body without reading it all


async def test_open_stream_connect_refused() -> None:
    url = f"http://127.0.0.1:{unused_port()}"
    with pytest.raises(UpstreamConnectError) as info:
        await _call(url + "/x", _settings(url))
    assert info.value.retryable
    assert_clean(info.value)


async def test_open_stream_read_timeout() -> None:
    async with serve_asgi(_app(200, b"{}", delay=1.0)) as server:
        with pytest.raises(UpstreamTimeout) as info:
            await _call(server.url + "/x", _settings(server.url, read=0.2))
    assert info.value.retryable
    assert_clean(info.value)


async def test_open_stream_total_timeout() -> None:
    # The server would answer after 5 s; the 0.2 s total deadline must cut the call well before.
    # (The bound is loose because a loaded machine can starve the loop for a second or two.)
    async with serve_asgi(_app(200, b"{}", delay=5.0)) as server:
        client = UpstreamClient(_settings(server.url))
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
        assert await _call("http://upstream.invalid/v1/chat/completions", settings) == {}
    [head] = seen
    assert head.startswith(b"POST http://upstream.invalid/v1/chat/completions HTTP/1.1\r\n")
    assert b"proxy-authorization: basic " in head.lower()
