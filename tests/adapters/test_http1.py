"""adapters/http1/ through adapters/transport.py, on real loopback sockets: keep-alive reuse and
its limits (a server closing an idle connection, Connection: close, cancellation), body framings
and encodings, the connection limit and its wait, timeouts, and header injection refused."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import time
import zlib
from collections.abc import Callable
from typing import Any

import pytest

from adapters import http1
from adapters.transport import UpstreamClient, UpstreamStream, open_stream
from gateway.kernel.errors import UpstreamConnectError, UpstreamError, UpstreamTimeout
from gateway.kernel.settings import ProviderSettings, Timeouts
from tests.adapters.helpers import SECRET, assert_clean
from tests.adapters.wire import content_length
from tests.fakes.server import serve_raw

Answer = Callable[[bytes], bytes]  # a request head -> the bytes written back


class Upstream:
    """A raw HTTP/1.1 server: counts connections, records request heads, answers each request
    with ``answer(head)``; ``close_after`` closes the connection after that many answers."""

    def __init__(self, answer: Answer, *, close_after: int = 0, hold: float = 0.0) -> None:
        self.answer = answer
        self.close_after = close_after
        self.hold = hold
        self.connections = 0
        self.heads: list[bytes] = []
        self.closed_by_client = 0  # connections whose client went away (EOF) mid-exchange or idle

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.closed_by_client += 1
                    return
                await reader.readexactly(content_length(head))
                self.heads.append(head)
                writer.write(self.answer(head))
                await writer.drain()
                answered += 1
                if self.hold:  # keep the connection open (the answer is unfinished) until the client goes
                    if not await reader.read(1):
                        self.closed_by_client += 1
                    return
                if self.close_after and answered >= self.close_after:
                    return
        except ConnectionError:
            self.closed_by_client += 1
        finally:
            writer.close()


def _ok(body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(body)
    return head + b"".join(h + b"\r\n" for h in extra) + b"\r\n" + body


def _client(port: int, **kw: Any) -> UpstreamClient:
    timeouts = kw.pop("timeouts", Timeouts())
    return UpstreamClient(
        ProviderSettings(kind="openai-chat", base_url=f"http://127.0.0.1:{port}", timeouts=timeouts, **kw)
    )


async def _body(
    client: UpstreamClient, port: int, *, headers: dict[str, str] | None = None, **kw: Any
) -> bytes:
    async with open_stream(
        client,
        "POST",
        f"http://127.0.0.1:{port}/v1/x",
        json_body={"a": 1},
        headers=headers or {},
        total_timeout=kw.pop("total", 10.0),
        **kw,
    ) as up:
        out = bytearray()
        while (chunk := await up.next_chunk()) is not None:
            out += chunk
        return bytes(out)


async def test_sequential_calls_reuse_one_connection() -> None:
    upstream = Upstream(lambda head: _ok(b'{"n":1}'))
    async with serve_raw(upstream) as server:
        client = _client(server.port)
        try:
            for _ in range(5):
                assert await _body(client, server.port) == b'{"n":1}'
        finally:
            await client.aclose()
    assert upstream.connections == 1 and len(upstream.heads) == 5
    head = upstream.heads[0]
    assert head.startswith(b"POST /v1/x HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n" % server.port)
    assert b"content-type: application/json\r\n" in head and b"content-length: 7\r\n" in head


async def test_an_idle_connection_the_server_closed_is_replaced() -> None:
    upstream = Upstream(lambda head: _ok(b"{}"), close_after=1)  # the server closes after each answer
    async with serve_raw(upstream) as server:
        client = _client(server.port)
        try:
            for _ in range(3):
                assert await _body(client, server.port) == b"{}"
                await asyncio.sleep(0.05)  # the server's close arrives while the connection is idle
        finally:
            await client.aclose()
    assert upstream.connections == 3


async def test_a_connection_lost_after_the_request_was_written_is_an_error_not_a_resend() -> None:
    # the server takes the request, then closes without a byte (it may have processed it): the
    # client never sends it again on its own (tests/adapters/test_hostile_upstream.py has more)
    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    async with serve_raw(mute) as server:
        client = _client(server.port)
        try:
            with pytest.raises(UpstreamError) as info:
                await _body(client, server.port)
        finally:
            await client.aclose()
    assert info.value.retryable and "lost" in info.value.message


async def test_connection_close_and_http10_answers_are_not_reused() -> None:
    answers = iter(
        [
            _ok(b"{}", b"connection: close"),
            b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n{}",
            _ok(b"{}"),
            _ok(b"{}"),
        ]
    )
    upstream = Upstream(lambda head: next(answers))
    async with serve_raw(upstream) as server:
        client = _client(server.port)
        try:
            for _ in range(4):
                assert await _body(client, server.port) == b"{}"
        finally:
            await client.aclose()
    assert upstream.connections == 3  # a new one after each of the first two; the last two share one


async def test_cancelling_mid_stream_closes_the_connection() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    upstream = Upstream(lambda _: head + b"7\r\ndata: 1\r\n", hold=1)
    async with serve_raw(upstream) as server:
        client = _client(server.port)
        got = asyncio.Event()

        async def turn() -> None:
            async with open_stream(
                client,
                "POST",
                f"http://127.0.0.1:{server.port}/x",
                json_body={},
                headers={},
                total_timeout=30,
            ) as up:
                assert await up.next_chunk() == b"data: 1"
                got.set()
                await up.next_chunk()  # waits for more: cancelled here

        task = asyncio.create_task(turn())
        await asyncio.wait_for(got.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):
            if upstream.closed_by_client:
                break
            await asyncio.sleep(0.01)
        assert upstream.closed_by_client == 1  # the upstream saw the client go
        assert client.pool.open == 0 and not any(client.pool.idle.values())
        await client.aclose()


def _chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


BODY = b'{"text":"' + b"hello " * 2000 + b'"}'
_deflater = zlib.compressobj(wbits=-zlib.MAX_WBITS)
RAW_DEFLATE = _deflater.compress(BODY) + _deflater.flush()


@pytest.mark.parametrize(
    ("answer", "reusable"),
    [
        (_ok(BODY), True),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + _chunked(BODY[:100], BODY[100:]), True),
        (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n" + BODY, False),  # until close
        (_ok(gzip.compress(BODY), b"content-encoding: gzip"), True),
        (_ok(zlib.compress(BODY), b"content-encoding: deflate"), True),
        (_ok(RAW_DEFLATE, b"content-encoding: deflate"), True),
        (
            b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n"
            + _chunked(*(gzip.compress(BODY)[i : i + 50] for i in range(0, len(gzip.compress(BODY)), 50))),
            True,
        ),
    ],
    ids=["content-length", "chunked", "until-close", "gzip", "deflate", "raw-deflate", "gzip-chunked"],
)
async def test_body_framings_and_encodings(answer: bytes, reusable: bool) -> None:
    upstream = Upstream(lambda head: answer, close_after=0 if reusable else 1)
    async with serve_raw(upstream) as server:
        client = _client(server.port)
        try:
            assert await _body(client, server.port) == BODY
            assert await _body(client, server.port) == BODY
        finally:
            await client.aclose()
    assert upstream.connections == (1 if reusable else 2)
    assert b"accept-encoding: gzip, deflate\r\n" in upstream.heads[0]


async def test_a_corrupt_compressed_body_is_an_error() -> None:
    upstream = Upstream(lambda head: _ok(b"not gzip at all", b"content-encoding: gzip"))
    async with serve_raw(upstream) as server:
        client = _client(server.port)
        try:
            with pytest.raises(UpstreamError) as info:
                await _body(client, server.port)
        finally:
            await client.aclose()
    assert "malformed" in info.value.message


async def test_no_body_statuses_do_not_hang() -> None:
    upstream = Upstream(lambda head: b"HTTP/1.1 204 No Content\r\n\r\n")
    async with serve_raw(upstream) as server:
        client = _client(server.port)
        try:
            assert await asyncio.wait_for(_body(client, server.port), 5) == b""
            assert await asyncio.wait_for(_body(client, server.port), 5) == b""
        finally:
            await client.aclose()
    assert upstream.connections == 1


async def test_a_disconnect_mid_body_is_a_lost_connection() -> None:
    upstream = Upstream(lambda head: _ok(BODY)[:-100], close_after=1)
    async with serve_raw(upstream) as server:
        client = _client(server.port)
        try:
            with pytest.raises(UpstreamError) as info:
                await _body(client, server.port)
        finally:
            await client.aclose()
    assert info.value.retryable and "lost" in info.value.message
    assert_clean(info.value)


async def test_a_malformed_answer_is_an_error() -> None:
    upstream = Upstream(lambda head: b"HTTP/1.1 two hundred\r\n\r\n")
    async with serve_raw(upstream) as server:
        client = _client(server.port)
        try:
            with pytest.raises(UpstreamError) as info:
                await _body(client, server.port)
        finally:
            await client.aclose()
    assert "malformed HTTP" in info.value.message


async def test_max_connections_makes_callers_wait_within_the_connect_timeout() -> None:
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    upstream = Upstream(lambda _: head + b"2\r\n{}\r\n")

    async with serve_raw(upstream) as server:
        client = _client(server.port, max_connections=1, timeouts=Timeouts(connect=0.3))
        url = f"http://127.0.0.1:{server.port}/x"
        try:
            async with open_stream(client, "POST", url, json_body={}, headers={}, total_timeout=10) as up:
                assert await up.next_chunk() == b"{}"
                started = time.monotonic()
                with pytest.raises(UpstreamConnectError) as info:  # the only connection is busy
                    await _body(client, server.port)
                assert 0.25 < time.monotonic() - started < 3
                assert info.value.retryable

                # a waiter gets the connection once it is free again (here: closed, unfinished)
                waiting = asyncio.create_task(_body(client, server.port, total=10))
                await asyncio.sleep(0.05)
                assert not waiting.done()
                upstream.answer = lambda _: _ok(b"{}")
            assert await asyncio.wait_for(waiting, 5) == b"{}"
            assert client.pool.open == 1
        finally:
            await client.aclose()
    assert upstream.connections == 2


async def test_a_silent_stream_times_out_between_bytes_and_an_unstreamed_call_only_in_total() -> None:
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    upstream = Upstream(lambda _: head + b"2\r\n{}\r\n", hold=1)
    async with serve_raw(upstream) as server:
        client = _client(server.port, timeouts=Timeouts(read=0.2))
        try:
            started = time.monotonic()
            with pytest.raises(UpstreamTimeout) as info:
                await _body(client, server.port)
            assert "did not respond" in info.value.message
            assert time.monotonic() - started < 3
            with pytest.raises(UpstreamTimeout) as info:
                await _body(client, server.port, streamed=False, total=0.6)
            assert "total time" in info.value.message
            assert time.monotonic() - started > 0.6
        finally:
            await client.aclose()


async def test_a_slow_reader_is_not_a_read_timeout() -> None:
    # the server is silent for longer than the read timeout while the reader is busy elsewhere:
    # no reader waited that long, so it is no timeout
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(content_length(head))
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
        await asyncio.sleep(0.3)
        writer.write(_chunked(b"b"))
        await writer.drain()
        await reader.read(1)
        writer.close()

    async with serve_raw(handle) as server:
        client = _client(server.port, timeouts=Timeouts(read=0.2))
        try:
            async with open_stream(
                client, "POST", f"http://127.0.0.1:{server.port}/x", json_body={}, headers={}, total_timeout=5
            ) as up:
                assert await up.next_chunk() == b"a"
                await asyncio.sleep(0.4)
                assert await up.next_chunk() == b"b"
                assert await up.next_chunk() is None
        finally:
            await client.aclose()


@pytest.mark.parametrize("value", [f"x\r\nx-injected: {SECRET}", "x\ny", "x\rx", f"{SECRET}\r\n\r\nGET /"])
async def test_a_header_with_a_line_break_is_never_sent(value: str) -> None:
    upstream = Upstream(lambda head: _ok(b"{}"))
    async with serve_raw(upstream) as server:
        client = _client(server.port)
        try:
            for headers in ({"x-test": value}, {value: "v"}):
                with pytest.raises(UpstreamError) as info:
                    await _body(client, server.port, headers=headers)
                assert "line break" in info.value.message and not info.value.retryable
                assert_clean(info.value)
            assert await _body(client, server.port, headers={"x-test": "fine"}) == b"{}"
        finally:
            await client.aclose()
    assert len(upstream.heads) == 1 and b"x-test: fine\r\n" in upstream.heads[0]


async def test_an_adapter_content_type_replaces_the_default() -> None:
    upstream = Upstream(lambda head: _ok(b"{}"))
    async with serve_raw(upstream) as server:
        client = _client(server.port)
        try:
            await _body(client, server.port, headers={"Content-Type": "application/x-test"})
        finally:
            await client.aclose()
    [head] = upstream.heads
    assert b"Content-Type: application/x-test\r\n" in head and b"application/json" not in head


async def test_idle_connections_are_closed_after_the_idle_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1.pool, "IDLE_SECONDS", 0.1)
    upstream = Upstream(lambda head: _ok(b"{}"))
    async with serve_raw(upstream) as server:
        client = _client(server.port)
        try:
            await _body(client, server.port)
            assert client.pool.open == 1
            for _ in range(100):
                if upstream.closed_by_client:
                    break
                await asyncio.sleep(0.02)
            assert upstream.closed_by_client == 1 and client.pool.open == 0
            await _body(client, server.port)
        finally:
            await client.aclose()
    assert upstream.connections == 2


async def test_an_unfinished_body_is_not_reused_and_drain_finishes_one() -> None:
    answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + _chunked(
        b"data: 1\n\n", b"data: 2\n\n"
    )
    upstream = Upstream(lambda head: answer)
    async with serve_raw(upstream) as server:
        client = _client(server.port)
        url = f"http://127.0.0.1:{server.port}/x"
        try:
            up: UpstreamStream
            async with open_stream(client, "POST", url, json_body={}, headers={}, total_timeout=5) as up:
                assert await up.drain()
            async with open_stream(client, "POST", url, json_body={}, headers={}, total_timeout=5) as up:
                pass  # left unread: closed, not pooled
            assert await _body(client, server.port) == b"data: 1\n\ndata: 2\n\n"
        finally:
            await client.aclose()
    assert upstream.connections == 2


async def test_at_the_connection_limit_an_idle_connection_to_another_host_gives_way() -> None:
    first, second = Upstream(lambda head: _ok(b"1")), Upstream(lambda head: _ok(b"2"))
    async with serve_raw(first) as one, serve_raw(second) as two:
        client = _client(one.port, max_connections=1, timeouts=Timeouts(connect=0.5))
        try:
            assert await _body(client, one.port) == b"1"
            assert await _body(client, two.port) == b"2"  # not a wait for the idle one to time out
            assert await _body(client, one.port) == b"1"
        finally:
            await client.aclose()
    assert (first.connections, second.connections) == (2, 1)


async def test_an_address_that_never_answers_costs_the_happy_eyeballs_delay_not_the_timeout() -> None:
    """The host's first address accepts no connection (a listener whose backlog is full drops the
    SYN, like a route that loses packets); its second is the real server. Racing them (Happy
    Eyeballs), the call succeeds a quarter second in, well within a 3 s connect timeout."""
    upstream = Upstream(lambda head: _ok(b'{"n":1}'))
    async with serve_raw(upstream) as server:
        silent = socket.socket()
        silent.bind(("127.0.0.2", server.port))
        silent.listen(0)
        queued = []
        for _ in range(4):  # fill the accept queue: later SYNs to it get no answer
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.2", server.port))
            queued.append(s)
        client = _client(server.port, timeouts=Timeouts(connect=3.0))
        addresses = [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", server.port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", server.port)),
        ]
        try:
            pool = client.pool

            async def resolve(host: str, port: int) -> list[Any]:
                assert (host, port) == ("127.0.0.1", server.port)
                return addresses

            pool.resolve = resolve  # type: ignore[method-assign]  # the resolver's answer, two addresses
            start = time.monotonic()
            assert await _body(client, server.port) == b'{"n":1}'
            took = time.monotonic() - start
        finally:
            await client.aclose()
            for s in [silent, *queued]:
                s.close()
    assert http1.HAPPY_EYEBALLS_DELAY <= took < 1.5, took
    assert upstream.connections == 1
