"""``UpstreamStream.next_chunk`` takes the whole body read so far (adapters/http1/): many HTTP
chunks written at once come out in a few reads, not one per chunk; more than the flow-control
high water is paused and resumed without loss and with bounded buffering; paced chunks come as
they arrive; and the connection is reusable afterwards."""

from __future__ import annotations

import asyncio

from adapters import http1
from adapters.transport import UpstreamClient, open_stream
from gateway.kernel.settings import ProviderSettings
from tests.fakes.server import serve_raw


def _chunked(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def _read_all(port: int, calls: int = 1, pause: float = 0.0) -> list[list[bytes]]:
    """Each call's ``next_chunk`` results, one client's calls in turn (``pause``: the reader is
    that slow between reads)."""
    client = UpstreamClient(ProviderSettings(kind="openai-chat", base_url=f"http://127.0.0.1:{port}"))
    out = []
    try:
        for _ in range(calls):
            async with open_stream(
                client, "POST", f"http://127.0.0.1:{port}/x", json_body={}, headers={}, total_timeout=30
            ) as up:
                reads = []
                while (chunk := await up.next_chunk()) is not None:
                    reads.append(chunk)
                    if pause:
                        await asyncio.sleep(pause)
                out.append(reads)
    finally:
        await client.aclose()
    return out


class _Handler:
    """Answers ``answers`` requests per connection with ``pieces`` as chunks; counts connections."""

    def __init__(self, pieces: list[bytes], *, pace: float = 0.0, answers: int = 1) -> None:
        self.pieces, self.pace, self.answers = pieces, pace, answers
        self.connections = 0

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await _answer(reader, writer, self.pieces, self.pace, self.answers)


async def _answer(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pieces: list[bytes], pace: float, answers: int
) -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    for _ in range(answers):
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)  # the body "{}" (content-length: 2)
        if pace:
            writer.write(head)
            for p in pieces:
                writer.write(_chunked([p])[: -len(b"0\r\n\r\n")])
                await writer.drain()
                await asyncio.sleep(pace)
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(head + _chunked(pieces))  # everything in one write
        await writer.drain()
    writer.close()


async def test_many_chunks_at_once_come_out_whole_in_few_reads() -> None:
    pieces = [b'data: {"n":%d}\n\n' % i for i in range(500)]
    handler = _Handler(pieces, answers=2)
    async with serve_raw(handler) as server:
        results = await _read_all(server.port, calls=2)
    for reads in results:
        assert b"".join(reads) == b"".join(pieces)
        assert len(reads) < 10  # 500 chunks (~9 KB) written at once: a read or two, not one per chunk
    assert handler.connections == 1  # both answers came over one connection: the first ended cleanly


async def test_more_than_the_flow_control_high_water() -> None:
    # ~3 MB in 20,000 chunks, read by a slow reader: the socket is paused above the high water
    # (256 KiB) and resumed when taken; nothing is lost or stuck, and no read holds much more
    # than the high water plus one socket read
    pieces = [(b"%06d" % i) * 25 for i in range(20_000)]
    handler = _Handler(pieces, answers=2)
    async with serve_raw(handler) as server:
        results = await asyncio.wait_for(_read_all(server.port, calls=2, pause=0.01), 60)
    for reads in results:
        assert b"".join(reads) == b"".join(pieces)
        assert max(map(len, reads)) <= http1.HIGH_WATER + 512 * 1024
    assert max(map(len, results[0])) > http1.HIGH_WATER  # the buffer did reach the high water
    assert handler.connections == 1


async def test_paced_chunks() -> None:
    pieces = [b"data: %d\n\n" % i for i in range(30)]
    async with serve_raw(_Handler(pieces, pace=0.002)) as server:
        [reads] = await _read_all(server.port)
    assert b"".join(reads) == b"".join(pieces)
    assert len(reads) >= 2
