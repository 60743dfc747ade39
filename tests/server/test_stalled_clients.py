"""Clients that stop reading are dropped after ``limits.client_send_seconds`` and their upstream calls
cancelled, on SSE and WebSocket alike, so they cannot pin the provider's connection pool: with
``max_connections: 2``, two stalled clients used to make every other request fail with 502."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.harness import ServedApp, serve_gateway
from tests.helpers import chat_upstream, fake_fixtures

fake_server, fake = fake_fixtures(FakeOpenAIChat)
HUGE = Reply.text("x" * 24_000_000, pieces=2400, split=None)  # 24 MB of SSE: more than any buffer


@pytest.fixture(scope="module")
def served(fake_server: FakeOpenAIChat) -> Iterator[ServedApp]:
    settings = chat_upstream(
        fake_server,
        {"m": {"provider": "up"}},
        max_connections=2,
        timeouts={"connect": 2, "read": 60, "total": 120},
        retry={"attempts": 0},
    )
    with serve_gateway({**settings, "limits": {"client_send_seconds": 1.0}}) as s:
        yield s


def stalled_sse_client(port: int) -> socket.socket:
    """A client that sends a streaming request, then never reads a byte."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    body = orjson.dumps({"model": "m", "input": "go", "stream": True})
    sock.sendall(
        b"POST /v1/responses HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


async def wait_for(predicate: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return False


async def assert_pool_free(served: ServedApp, fake: FakeOpenAIChat) -> None:
    fake.add(Reply.text("still served"))
    async with httpx.AsyncClient(base_url=served.base_url, timeout=15) as c:
        r = await c.post("/v1/responses", json={"model": "m", "input": "hello"})
    assert r.status_code == 200, r.text
    assert r.json()["output"][0]["content"][0]["text"] == "still served"


async def test_stalled_sse_clients_are_dropped_and_their_upstream_calls_cancelled(
    served: ServedApp, fake: FakeOpenAIChat
) -> None:
    fake.add(HUGE, HUGE)
    port = int(served.base_url.rsplit(":", 1)[1])
    clients = [stalled_sse_client(port) for _ in range(2)]
    try:
        assert await wait_for(lambda: len(fake.requests) == 2, 10)
        t0 = time.monotonic()
        assert await wait_for(lambda: fake.disconnects == 2, 15), "the upstream calls were not cancelled"
        assert time.monotonic() - t0 < 10
        await assert_pool_free(served, fake)
    finally:
        for c in clients:
            c.close()


async def test_stalled_websocket_clients_are_dropped_too(served: ServedApp, fake: FakeOpenAIChat) -> None:
    fake.add(HUGE, HUGE)
    ws_url = served.base_url.replace("http", "ws") + "/v1/responses"
    create = orjson.dumps({"type": "response.create", "model": "m", "input": "go"}).decode()
    sockets = []
    try:
        for _ in range(2):
            # max_queue=1 and no recv(): the client stops reading from the network
            ws = await connect(ws_url, max_queue=1, max_size=None, compression=None)
            ws.transport.set_write_buffer_limits(0)
            sock = ws.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await ws.send(create)
            sockets.append(ws)
        assert await wait_for(lambda: len(fake.requests) == 2, 10)
        assert await wait_for(lambda: fake.disconnects == 2, 15), "the upstream calls were not cancelled"
        await assert_pool_free(served, fake)
    finally:
        for ws in sockets:
            ws.transport.abort()
