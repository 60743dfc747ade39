"""A hostile or broken upstream against the HTTP client (adapters/http1/), on real loopback
sockets, called directly and through the gateway (the app under uvicorn, a provider pointed at
the hostile server): a compression bomb, an endless response head, request headers that must not
go out, a request never sent twice, stale bytes on an idle connection, the environment's proxies
(``trust_env``), and each connect failure named in fixed words."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from adapters.http1.exchange import DECODE_CHUNK
from adapters.transport import RESPONSE_BODY_LIMIT, UpstreamClient, open_stream
from gateway.kernel.errors import UpstreamConnectError, UpstreamError
from gateway.kernel.settings import ProviderSettings, Timeouts
from tests.adapters.wire import content_length, make_cert, pipe
from tests.fakes.server import serve_raw, unused_port
from tests.harness import serve_gateway

OK = b'{"n":1}'


def _ok(body: bytes = OK) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    )


class Answering:
    """Reads each request (head and body), counts it, and writes ``answer(n)`` for the n-th
    request on the connection (None: close without a byte)."""

    def __init__(self, answer: Callable[[int], bytes | None]) -> None:
        self.answer = answer
        self.requests = 0
        self.connections = 0
        self.closed_at: list[float] = []  # when the client went away from a connection

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(content_length(head))
                self.requests += 1
                n += 1
                if (data := self.answer(n)) is None:
                    return
                writer.write(data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_at.append(time.monotonic())
        finally:
            writer.close()


def _client(url: str, **kw: Any) -> UpstreamClient:
    return UpstreamClient(ProviderSettings(kind="openai-chat", base_url=url, **kw))


async def _call(client: UpstreamClient, url: str, headers: dict[str, str] | None = None) -> list[bytes]:
    """The body's reads, one list item per ``next_chunk``."""
    async with open_stream(
        client, "POST", url + "/x", json_body={}, headers=headers or {}, total_timeout=30
    ) as up:
        reads = []
        while (chunk := await up.next_chunk()) is not None:
            reads.append(chunk)
        return reads


@contextlib.contextmanager
def _gateway(base_url: str, **provider: Any) -> Iterator[str]:
    settings = {
        "providers": {"up": {"kind": "openai-chat", "base_url": base_url, **provider}},
        "models": {"m": {"provider": "up", "upstream_model": "x"}},
    }
    with serve_gateway(settings) as served:
        yield served.base_url


async def _ask(base_url: str, *, stream: bool = False) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base_url, timeout=30, trust_env=False) as c:
        return await c.post("/v1/responses", json={"model": "m", "input": "x", "stream": stream})


# -- a compression bomb ---------------------------------------------------------------------------
BOMB_SIZE = 2 * RESPONSE_BODY_LIMIT  # decoded; ~128 KiB of gzip


@pytest.fixture(scope="module")
def bomb() -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    zeros = bytes(1024 * 1024)
    return b"".join([*(z.compress(zeros) for _ in range(BOMB_SIZE // len(zeros))), z.flush()])


def _gzip_answer(body: bytes, content_type: bytes = b"application/json") -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n"
    return head % (content_type, len(body)) + body


async def test_a_compression_bomb_is_decoded_in_bounded_reads_and_fails_at_the_body_limit(
    bomb: bytes,
) -> None:
    reads: list[int] = []
    async with serve_raw(Answering(lambda n: _gzip_answer(bomb))) as server:
        url = f"http://127.0.0.1:{server.port}"
        client = _client(url)
        try:
            with pytest.raises(UpstreamError, match="oversized") as info:
                async with open_stream(
                    client, "POST", url + "/x", json_body={}, headers={}, total_timeout=30
                ) as up:
                    while (chunk := await up.next_chunk()) is not None:
                        reads.append(len(chunk))
                        assert len(chunk) <= DECODE_CHUNK  # one read never holds the bomb
        finally:
            await client.aclose()
    assert not info.value.retryable
    assert RESPONSE_BODY_LIMIT - DECODE_CHUNK <= sum(reads) <= RESPONSE_BODY_LIMIT


@pytest.mark.parametrize("stream", [False, True])
async def test_a_compression_bomb_through_the_gateway_is_an_upstream_error_in_bounded_memory(
    bomb: bytes, stream: bool
) -> None:
    content_type = b"text/event-stream" if stream else b"application/json"
    upstream = Answering(lambda n: _gzip_answer(bomb, content_type))
    async with serve_raw(upstream) as server:
        with _gateway(f"http://127.0.0.1:{server.port}/v1") as gateway:
            tracemalloc.start()
            try:
                start = time.monotonic()
                r = await _ask(gateway, stream=stream)
                took = time.monotonic() - start
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
    body = r.text
    assert "upstream_error" in body and took < 20, (r.status_code, body[:300], took)
    assert peak < RESPONSE_BODY_LIMIT * 1.6, peak  # (before: the whole bomb in one read, and a copy)


# -- an endless response head ---------------------------------------------------------------------
HUGE_LINE = b"HTTP/1.1 200 OK\r\nx-junk: " + b"a" * (1024 * 1024) + b"\r\ncontent-length: 2\r\n\r\n{}"
MANY_HEADERS = b"HTTP/1.1 200 OK\r\n" + b"x-a: b\r\n" * 100_000 + b"content-length: 2\r\n\r\n{}"


@pytest.mark.parametrize("answer", [HUGE_LINE, MANY_HEADERS], ids=["1 MiB line", "100k headers"])
async def test_an_oversized_response_head_fails_at_once_and_closes_the_connection(answer: bytes) -> None:
    upstream = Answering(lambda n: answer)
    async with serve_raw(upstream) as server:
        url = f"http://127.0.0.1:{server.port}"
        client = _client(url)  # the default read timeout: 120 s
        try:
            start = time.monotonic()
            async with asyncio.timeout(5):
                with pytest.raises(UpstreamError, match="oversized"):
                    await _call(client, url)
            assert client.pool.open == 0  # closed, not pooled or held
        finally:
            await client.aclose()
    assert time.monotonic() - start < 5


async def test_an_oversized_response_head_through_the_gateway_is_an_upstream_error_at_once() -> None:
    upstream = Answering(lambda n: HUGE_LINE)
    async with serve_raw(upstream) as server:
        with _gateway(f"http://127.0.0.1:{server.port}/v1") as gateway:
            start = time.monotonic()
            async with asyncio.timeout(10):
                r = await _ask(gateway)
            took = time.monotonic() - start
            for _ in range(100):  # the gateway closed the connection it was read on
                if len(upstream.closed_at) == upstream.connections:
                    break
                await asyncio.sleep(0.02)
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error", r.text
    assert took < 5 and upstream.requests == 1  # not retried: a hostile answer comes again
    assert len(upstream.closed_at) == upstream.connections == 1


# -- request headers that must not go out ----------------------------------------------------------
@pytest.mark.parametrize(
    "headers",
    [
        {"x-a": "nul\x00byte"},
        {"x-a": "bell\x07"},
        {"x-a": "esc\x1b[0m"},
        {"x-a": "del\x7f"},
        {"x-a": "caf\u00e9"},
        {"x-a": "line\r\nx-evil: 1"},
        {"bad name": "v1"},
        {"x(a)": "v2"},
        {"x-a:b": "v3"},
        {"": "v4"},
        {"Host": "evil.example"},
        {"content-length": "0"},
        {"Transfer-Encoding": "chunked"},
    ],
    ids=lambda h: repr(next(iter(h.items()))),
)
async def test_a_request_header_h11_would_refuse_is_never_sent(headers: dict[str, str]) -> None:
    upstream = Answering(lambda n: _ok())
    async with serve_raw(upstream) as server:
        url = f"http://127.0.0.1:{server.port}"
        client = _client(url)
        try:
            with pytest.raises(UpstreamError, match="not sent") as info:
                await _call(client, url, headers)
        finally:
            await client.aclose()
    assert upstream.connections == 0 and not info.value.retryable
    assert next(iter(headers.values())) not in info.value.message  # fixed words only


@pytest.mark.parametrize(
    "value", ["nul\x00", "bell\x07", "del\x7f", "caf\u00e9", "a\r\nx-evil: 1", "tab\t\x01"]
)
async def test_a_bad_value_under_a_header_name_sent_before_is_refused_too(value: str) -> None:
    upstream = Answering(lambda n: _ok())
    async with serve_raw(upstream) as server:
        url = f"http://127.0.0.1:{server.port}"
        client = _client(url)
        try:
            assert await _call(client, url, {"x-a": "fine"}) == [OK]  # (the client remembers the name)
            with pytest.raises(UpstreamError, match="not sent"):
                await _call(client, url, {"x-a": value})
        finally:
            await client.aclose()
    assert upstream.requests == 1


async def test_valid_header_values_still_go_out() -> None:
    heads: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        await reader.readexactly(content_length(heads[-1]))
        writer.write(_ok())
        await writer.drain()
        writer.close()

    async with serve_raw(record) as server:
        url = f"http://127.0.0.1:{server.port}"
        client = _client(url)
        try:
            headers = {"authorization": "Bearer sk-1", "x-b": "a, b\tc ", "x-empty": "", "X-Tok_~!": "~"}
            await _call(client, url, headers)
        finally:
            await client.aclose()
    assert b"x-b: a, b\tc \r\nx-empty: \r\nX-Tok_~!: ~\r\n" in heads[0]


# -- a request is written once ----------------------------------------------------------------------
def _second_dropped(n: int) -> bytes | None:
    return _ok() if n == 1 else None  # the second POST on a connection is read, then dropped


async def test_a_request_the_server_read_is_never_sent_again_by_the_client() -> None:
    upstream = Answering(_second_dropped)
    async with serve_raw(upstream) as server:
        url = f"http://127.0.0.1:{server.port}"
        client = _client(url)
        try:
            assert await _call(client, url) == [OK]
            with pytest.raises(UpstreamError, match="lost") as info:
                await _call(client, url)  # on the pooled connection
        finally:
            await client.aclose()
    assert info.value.retryable  # the route's retry policy decides
    assert upstream.requests == 2  # (before: 3, the second sent again on a new connection)


async def test_through_the_gateway_only_the_routes_retry_policy_sends_again() -> None:
    upstream = Answering(_second_dropped)
    async with serve_raw(upstream) as server:
        with _gateway(f"http://127.0.0.1:{server.port}/v1", retry={"attempts": 0}) as gateway:
            first = await _ask(gateway)
            second = await _ask(gateway)
    assert first.status_code != 502, first.text  # answered
    assert second.status_code == 502 and second.json()["error"]["code"] == "upstream_error"
    assert upstream.requests == 2  # two calls, no retries configured: two POSTs (before: 3)


# -- stale bytes on an idle connection ----------------------------------------------------------------
class ThreadedServer:
    """A blocking server in its own thread, so that it acts while the client's loop is busy;
    ``handle(conn, n)`` serves the n-th connection."""

    def __init__(self, handle: Callable[[socket.socket, int], None]) -> None:
        self.handle = handle
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.connections += 1
                threading.Thread(target=self._one, args=(conn, self.connections), daemon=True).start()

    def _one(self, conn: socket.socket, n: int) -> None:
        with conn, contextlib.suppress(OSError):
            self.handle(conn, n)

    def close(self) -> None:
        self.sock.close()


def _read_request(conn: socket.socket) -> None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        if not (data := conn.recv(65536)):
            raise ConnectionError
        buf += data
    head, _, body = buf.partition(b"\r\n\r\n")
    while len(body) < content_length(head):
        body += conn.recv(65536)


async def test_stale_bytes_on_an_idle_connection_never_become_the_next_answer() -> None:
    def handle(conn: socket.socket, n: int) -> None:
        _read_request(conn)
        conn.sendall(_ok(b'{"n":%d}' % n))
        time.sleep(0.1)  # the client holds the connection idle; then bytes nobody asked for
        conn.sendall(_ok(b'{"stale":1}'))
        with contextlib.suppress(ConnectionError):
            _read_request(conn)
            conn.sendall(_ok(b'{"reused":1}'))

    server = ThreadedServer(handle)
    url = f"http://127.0.0.1:{server.port}"
    client = _client(url)
    try:
        assert await _call(client, url) == [b'{"n":1}']
        time.sleep(0.4)  # noqa: ASYNC251 - the loop busy: the stale answer waits in the socket, unread
        assert await _call(client, url) == [b'{"n":2}']  # on a new connection (before: {"stale":1})
    finally:
        await client.aclose()
        server.close()
    assert server.connections == 2


# -- the environment's proxies (trust_env) ----------------------------------------------------------
class ForwardProxy:
    """A plain forward proxy: records each request line; an absolute-form request goes to its
    origin in origin form, a CONNECT (answered ``connect_status``) becomes a byte pipe."""

    def __init__(self, connect_status: bytes = b"200 Connection established") -> None:
        self.connect_status = connect_status
        self.lines: list[bytes] = []

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line, _, rest = head.partition(b"\r\n")
            self.lines.append(line)
            method, target, version = line.split(b" ")
            if method == b"CONNECT":
                writer.write(b"HTTP/1.1 " + self.connect_status + b"\r\n\r\n")
                if not self.connect_status.startswith(b"200"):
                    return
                host, _, port = target.decode().rpartition(":")
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
                await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
                return
            origin = httpx.URL(target.decode())
            up_reader, up_writer = await asyncio.open_connection(origin.host, origin.port)
            path = origin.raw_path
            up_writer.write(b"%s %s %s\r\n%s" % (method, path, version, rest))
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("env", "proxied"),
    [
        ({"HTTP_PROXY": "http://127.0.0.1:{proxy}"}, True),
        ({"http_proxy": "127.0.0.1:{proxy}"}, True),  # no scheme: http, as curl reads it
        ({"ALL_PROXY": "http://127.0.0.1:{proxy}"}, True),
        ({"all_proxy": "http://127.0.0.1:{proxy}", "NO_PROXY": "127.0.0.1"}, False),
        ({"HTTP_PROXY": "http://127.0.0.1:{proxy}", "no_proxy": "localhost,127.0.0.1:{upstream}"}, False),
        ({"HTTPS_PROXY": "http://127.0.0.1:{proxy}"}, False),  # for https:// upstreams only
    ],
)
async def test_trust_env_takes_the_environments_proxy_for_http(
    clean_env: pytest.MonkeyPatch, env: dict[str, str], proxied: bool
) -> None:
    proxy, upstream = ForwardProxy(), Answering(lambda n: _ok())
    async with serve_raw(proxy) as p, serve_raw(upstream) as u:
        for name, value in env.items():
            clean_env.setenv(name, value.format(proxy=p.port, upstream=u.port))
        url = f"http://127.0.0.1:{u.port}"
        for trust_env in (True, False):
            client = _client(url, trust_env=trust_env)
            try:
                assert await _call(client, url) == [OK]
            finally:
                await client.aclose()
    expected = [f"POST http://127.0.0.1:{u.port}/x HTTP/1.1".encode()] if proxied else []
    assert proxy.lines == expected  # and never without trust_env (the default)


async def test_trust_env_tunnels_an_https_upstream_through_https_proxy(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with _tls_upstream(tmp_path, "127.0.0.1") as (url, cert), serve_raw(proxy := ForwardProxy()) as p:
        clean_env.setenv("SSL_CERT_FILE", str(cert))
        clean_env.setenv("https_proxy", f"http://127.0.0.1:{p.port}")
        clean_env.setenv("http_proxy", "http://127.0.0.1:1")  # for http:// only: not used
        client = _client(url, trust_env=True)
        try:
            assert await _call(client, url) == [OK]
        finally:
            await client.aclose()
    assert proxy.lines == [f"CONNECT 127.0.0.1:{url.rsplit(':', 1)[1]} HTTP/1.1".encode()]


async def test_trust_env_through_the_gateway(clean_env: pytest.MonkeyPatch) -> None:
    proxy, upstream = ForwardProxy(), Answering(lambda n: _ok(b"not a chat completion"))
    async with serve_raw(proxy) as p, serve_raw(upstream) as u:
        clean_env.setenv("HTTP_PROXY", f"http://127.0.0.1:{p.port}")
        with _gateway(f"http://127.0.0.1:{u.port}/v1", trust_env=True, retry={"attempts": 0}) as gateway:
            await _ask(gateway)
    assert proxy.lines == [f"POST http://127.0.0.1:{u.port}/v1/chat/completions HTTP/1.1".encode()]
    assert upstream.requests == 1


# -- each connect failure named --------------------------------------------------------------------
@contextlib.asynccontextmanager
async def _tls_upstream(tmp: Path, host: str, *, expired: bool = False) -> AsyncIterator[tuple[str, Path]]:
    cert, key = make_cert(tmp, host, expired=expired)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    upstream = Answering(lambda n: _ok())

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ssl.SSLError, OSError):
            await upstream(reader, writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    try:
        yield f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}", cert
    finally:
        server.close()


@contextlib.contextmanager
def _blackhole() -> Iterator[int]:
    """A port whose SYNs get no answer: a listener with a full accept queue."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(0)
    port = silent.getsockname()[1]
    queued = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        queued.append(s)
    try:
        yield port
    finally:
        for s in [silent, *queued]:
            s.close()


async def _connect_failure(url: str, **kw: Any) -> UpstreamConnectError:
    client = _client(url, **kw)
    try:
        with pytest.raises(UpstreamConnectError) as info:
            await _call(client, url)
    finally:
        await client.aclose()
    return info.value


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("self-signed", "the TLS certificate is not trusted"),
        ("wrong host", "the TLS certificate does not match the host name"),
        ("expired", "the TLS certificate has expired"),
    ],
)
async def test_a_certificate_failure_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, case: str, words: str
) -> None:
    host = "other.example" if case == "wrong host" else "127.0.0.1"
    async with _tls_upstream(tmp_path, host, expired=case == "expired") as (url, cert):
        if case != "self-signed":
            monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trusted, but for another host / expired
        err = await _connect_failure(url)
    assert err.message == f"The gateway could not connect to the upstream provider: {words}."


async def test_a_proxy_asking_for_credentials_is_named(tmp_path: Path) -> None:
    async with (
        _tls_upstream(tmp_path, "127.0.0.1") as (url, _),
        serve_raw(ForwardProxy(b"407 Proxy Authentication Required")) as p,
    ):
        err = await _connect_failure(url, proxy=f"http://127.0.0.1:{p.port}")
    assert "407, proxy authentication required" in err.message


async def test_refused_timed_out_and_dns_failures_are_named() -> None:
    err = await _connect_failure(f"http://127.0.0.1:{unused_port()}")
    assert err.message.endswith(": the connection was refused.")
    with _blackhole() as port:
        start = time.monotonic()
        err = await _connect_failure(f"http://127.0.0.1:{port}", timeouts=Timeouts(connect=0.5))
        assert time.monotonic() - start < 3
    assert err.message.endswith(": the connection timed out.")
    err = await _connect_failure("http://no-such-host.invalid")
    assert err.message.endswith(": the DNS lookup failed.")


async def test_a_connect_failure_through_the_gateway_names_its_cause(tmp_path: Path) -> None:
    async with _tls_upstream(tmp_path, "127.0.0.1") as (url, _):
        with _gateway(url + "/v1", retry={"attempts": 0}) as gateway:
            untrusted = await _ask(gateway)
        with (
            _gateway(f"http://127.0.0.1:{unused_port()}/v1", retry={"attempts": 0}) as gateway,
            capture_logs() as logs,
        ):
            refused = await _ask(gateway)
    assert untrusted.status_code == refused.status_code == 502
    assert untrusted.json()["error"]["message"].endswith(": the TLS certificate is not trusted.")
    assert refused.json()["error"]["message"].endswith(": the connection was refused.")
    assert "127.0.0.1" not in untrusted.text + refused.text
    (call,) = [line for line in logs if line["event"] == "upstream_call"]
    assert call["error"].endswith(": the connection was refused.")  # the log line names it too
