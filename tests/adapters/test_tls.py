"""Upstream TLS: certificates are verified against the system trust store (which honours
``SSL_CERT_FILE``); an untrusted certificate is a connect error, never a silent downgrade; through
a forward proxy an https:// upstream is a CONNECT tunnel with TLS end to end."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from adapters.transport import UpstreamClient, open_stream
from gateway.kernel.errors import UpstreamConnectError
from gateway.kernel.settings import ProviderSettings
from tests.adapters.wire import make_cert, pipe
from tests.fakes.server import serve_raw

BODY = b'{"ok":true}'


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    cert, key = make_cert(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(v)
                    for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
                    if k.lower() == b"content-length"
                ),
                0,
            )
            await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(BODY)}\r\n\r\n".encode()
                + BODY
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"https://127.0.0.1:{port}", cert
    finally:
        server.close()


async def _call(url: str) -> Any:
    client = UpstreamClient(ProviderSettings(kind="openai-chat", base_url=url))
    try:
        async with open_stream(client, "POST", url + "/x", json_body={}, headers={}, total_timeout=10) as up:
            return await up.read_json()
    finally:
        await client.aclose()


async def test_an_untrusted_certificate_is_refused(tls_server: tuple[str, Path]) -> None:
    url, _ = tls_server
    with pytest.raises(UpstreamConnectError):
        await _call(url)


async def test_a_certificate_trusted_through_ssl_cert_file_works(
    tls_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, cert = tls_server
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    assert await _call(url) == {"ok": True}


class _TunnelProxy:
    """A forward proxy that answers ``CONNECT`` with ``status`` and, on 200, relays bytes both ways."""

    def __init__(self, status: bytes = b"200 Connection established") -> None:
        self.status = status
        self.heads: list[bytes] = []

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        writer.write(b"HTTP/1.1 " + self.status + b"\r\n\r\n")
        if not self.status.startswith(b"200"):
            writer.close()
            return
        host, _, port = head.split(b" ")[1].decode().rpartition(":")
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def test_an_https_upstream_through_the_proxy_is_a_tls_tunnel(
    tls_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, cert = tls_server
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    proxy = _TunnelProxy()
    async with serve_raw(proxy) as server:
        settings = ProviderSettings(
            kind="openai-chat", base_url=url, proxy=f"http://u:p%40ss@127.0.0.1:{server.port}"
        )
        client = UpstreamClient(settings)
        try:
            for _ in range(2):  # the second call reuses the tunnelled connection
                async with open_stream(
                    client, "POST", url + "/x", json_body={}, headers={}, total_timeout=10
                ) as up:
                    assert await up.read_json() == {"ok": True}
        finally:
            await client.aclose()
    port = url.rsplit(":", 1)[1]
    assert len(proxy.heads) == 2  # (the fixture's server closes after each answer)
    head = proxy.heads[0]
    assert head.startswith(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n".encode())
    assert f"proxy-authorization: Basic {base64.b64encode(b'u:p@ss').decode()}\r\n".encode() in head


async def test_a_proxy_refusing_the_tunnel_is_a_connect_error(tls_server: tuple[str, Path]) -> None:
    url, _ = tls_server
    async with serve_raw(_TunnelProxy(b"407 Proxy Authentication Required")) as server:
        settings = ProviderSettings(kind="openai-chat", base_url=url, proxy=f"http://127.0.0.1:{server.port}")
        client = UpstreamClient(settings)
        try:
            with pytest.raises(UpstreamConnectError):
                async with open_stream(
                    client, "POST", url + "/x", json_body={}, headers={}, total_timeout=10
                ):
                    pass
        finally:
            await client.aclose()


def test_an_https_proxy_url_is_refused_in_the_settings() -> None:
    with pytest.raises(ValidationError, match="an https:// proxy is not supported"):
        ProviderSettings(kind="openai-chat", proxy="https://proxy.internal:3128")
