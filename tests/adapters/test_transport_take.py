"""adapters/transport.py's buffered-read fast path (``_take_buffered``): on the installed aiohttp it
is active, returns exactly the body's bytes however its HTTP chunks arrive (many at once, more than
aiohttp's flow-control thresholds, slowly), and keeps the connection reusable afterwards."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from adapters import transport
from adapters.transport import UpstreamClient, open_stream
from gateway.kernel.settings import ProviderSettings
from tests.fakes.server import serve_raw


def test_fast_path_is_active_on_the_installed_aiohttp() -> None:
    # if an aiohttp upgrade renames StreamReader's slots, the fallback (readany) still works,
    # but the relay's per-chunk cost comes back: this test says so
    assert transport._TAKE_FAST, [n for n in transport._TAKE_SLOTS if n not in aiohttp.StreamReader.__slots__]


def _chunked(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def _read_all(port: int, calls: int = 1) -> list[tuple[bytes, int]]:
    """Each call's body and how many ``next_chunk`` reads it took, over one pooled connection."""
    client = UpstreamClient(ProviderSettings(kind="openai-chat", base_url=f"http://127.0.0.1:{port}"))
    out = []
    try:
        for _ in range(calls):
            async with open_stream(
                client, "POST", f"http://127.0.0.1:{port}/x", json_body={}, headers={}, total_timeout=20
            ) as up:
                body, reads = bytearray(), 0
                while (chunk := await up.next_chunk()) is not None:
                    body += chunk
                    reads += 1
                out.append((bytes(body), reads))
    finally:
        await client.aclose()
    return out


def _handler(pieces: list[bytes], *, pace: float = 0.0, answers: int = 1) -> Any:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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

    return handle


async def test_many_chunks_at_once_come_out_whole_in_few_reads(monkeypatch: Any) -> None:
    taken = []
    real = transport._take_buffered

    def counted(content: Any) -> bytes:
        taken.append(len(content._buffer))
        return real(content)

    monkeypatch.setattr(transport, "_take_buffered", counted)
    pieces = [b'data: {"n":%d}\n\n' % i for i in range(500)]
    async with serve_raw(_handler(pieces, answers=2)) as server:
        results = await _read_all(server.port, calls=2)
    assert taken and max(taken) > 1  # the fast path took several buffered pieces at once
    for body, reads in results:
        assert body == b"".join(pieces)
        assert reads < 50  # 500 chunks written at once: a few reads, not one per chunk
    # both answers came over one connection: the fast path left the stream at a clean end


async def test_more_than_the_flow_control_thresholds() -> None:
    # 20,000 chunks (> aiohttp's high-water chunk count, 4096) and ~3 MB (> its 128 KiB byte
    # high water): reading pauses and resumes the transport many times; nothing is lost or stuck
    pieces = [(b"%06d" % i) * 25 for i in range(20_000)]
    async with serve_raw(_handler(pieces)) as server:
        [(body, _)] = await asyncio.wait_for(_read_all(server.port), 60)
    assert body == b"".join(pieces)


async def test_paced_chunks() -> None:
    pieces = [b"data: %d\n\n" % i for i in range(30)]
    async with serve_raw(_handler(pieces, pace=0.002)) as server:
        [(body, reads)] = await _read_all(server.port)
    assert body == b"".join(pieces)
    assert reads >= 2
