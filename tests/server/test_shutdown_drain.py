"""SIGTERM on the real CLI process while clients do not read their streams (SSE and WebSocket): the
drain bounds the whole shutdown, and the handlers end cleanly (no traceback on stderr); and the
responses whose upstream has sent nothing yet at the deadline end as failed, as generating ones do."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from websockets.exceptions import ConnectionClosed

from tests.api.helpers import parse_sse, serve_cli, wait_until_up
from tests.api.procs import Gateway, bearer, body, create, read_turn, ws
from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.harness import free_port
from tests.helpers import fake_fixtures
from tests.schema import assert_event

DRAIN = 4.0
MARGIN = 2.5  # measured: about 0.7 s past the drain
LONG_INPUT = "word " * 100_000  # the mock echoes it: ~125 000 events, far more than socket buffers hold


def stalled_client(port: int) -> socket.socket:
    """A socket with a small receive buffer that the test never reads from."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    return sock


def start_sse(port: int) -> socket.socket:
    sock = stalled_client(port)
    body = orjson.dumps({"model": "mock", "input": LONG_INPUT, "stream": True, "store": False})
    head = b"POST /v1/responses HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return sock


def start_websocket(port: int) -> socket.socket:
    sock = stalled_client(port)
    key = base64.b64encode(os.urandom(16))
    sock.sendall(
        b"GET /v1/responses HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(1)
    assert answer.startswith(b"HTTP/1.1 101")
    message = orjson.dumps({"type": "response.create", "model": "mock", "input": LONG_INPUT, "store": False})
    # one masked text frame (an all-zero mask leaves the payload as it is)
    sock.sendall(b"\x81\xff" + len(message).to_bytes(8, "big") + b"\0\0\0\0" + message)
    return sock


def test_sigterm_with_clients_that_do_not_read_exits_within_the_drain() -> None:
    port = free_port()
    env = {**os.environ, "GATEWAY_LIMITS__WS_DRAIN_SECONDS": str(DRAIN)}
    proc = serve_cli(port, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    clients: list[socket.socket] = []
    try:
        wait_until_up(proc, port)
        clients = [start_sse(port), start_websocket(port)]
        time.sleep(1.0)  # both streams are under way and stalled on the unread sockets
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=4 * DRAIN)
        took = time.monotonic() - start
    finally:
        for sock in clients:
            sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert took < DRAIN + MARGIN, f"shutdown took {took:.1f} s with a {DRAIN} s drain"
    assert "Traceback" not in err and "Exception in ASGI application" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert all(ln.startswith("{") for ln in lines), [ln for ln in lines if not ln.startswith("{")][:5]
    requests = [r for r in map(json.loads, lines) if r.get("event") == "request"]
    assert sorted(r["transport"] for r in requests) == ["http", "websocket"]
    assert all(r["status"] == "cancelled" for r in requests)  # cut, and logged as such


fake_server, fake = fake_fixtures(FakeOpenAIChat)
HELD_DRAIN = 2.0


async def test_responses_still_waiting_for_their_first_byte_at_the_deadline_end_cleanly(
    tmp_path: Path, fake: FakeOpenAIChat
) -> None:
    """At the drain deadline a response whose upstream has sent nothing yet ends as one already
    generating does: SSE ``error`` + ``response.failed`` + ``[DONE]``, the 503 JSON body, and on a
    WebSocket ``response.failed`` before the 1001 close; not a connection cut raw."""
    fake.default = Reply.text("never sent", delay=60)  # the upstream holds its first byte
    config = {
        "auth": {"api_keys": [{"key": "sk-a", "tenant": "a"}]},
        "providers": {"up": {"kind": "openai-chat", "base_url": fake.base_url, "api_key": "sk-up"}},
        "models": {"held": {"provider": "up", "upstream_model": "x"}},
        "limits": {"ws_drain_seconds": HELD_DRAIN},
    }
    gw = Gateway(tmp_path, config)
    try:
        await gw.started()
        async with httpx.AsyncClient(base_url=gw.url, timeout=30, headers=bearer("sk-a")) as client:

            async def sse() -> tuple[int, bytes]:
                async with client.stream("POST", "/v1/responses", json=body("held", stream=True)) as r:
                    return r.status_code, b"".join([chunk async for chunk in r.aiter_bytes()])

            async def socket_turn() -> tuple[list[dict[str, Any]], int | None]:
                async with ws(gw, "sk-a") as sock:
                    await sock.send(create("held"))
                    events = await read_turn(sock)
                    with pytest.raises(ConnectionClosed) as closed:
                        await asyncio.wait_for(sock.recv(), 30)
                    return events, closed.value.rcvd.code if closed.value.rcvd else None

            streamed = asyncio.create_task(sse())
            answered = asyncio.create_task(client.post("/v1/responses", json=body("held")))
            socket = asyncio.create_task(socket_turn())
            deadline = time.monotonic() + 30
            while len(fake.requests) < 3:  # all three wait on the upstream's first byte
                assert time.monotonic() < deadline, f"{len(fake.requests)} of 3 requests reached it"
                await asyncio.sleep(0.05)
            start = time.monotonic()
            code = await gw.stop(signal.SIGTERM, seconds=HELD_DRAIN + 30)
            took = time.monotonic() - start
            (status, raw), reply, (events, close_code) = await asyncio.gather(streamed, answered, socket)
    finally:
        gw.close()
    assert code in (0, -signal.SIGTERM), gw.tail()  # uvicorn re-raises the signal it drained on
    assert took < HELD_DRAIN + MARGIN, f"shutdown took {took:.1f} s with a {HELD_DRAIN} s drain"
    assert status == 200
    frames = parse_sse(raw)
    assert frames[-1] == ("", "[DONE]"), frames[-3:]
    assert [name for name, _ in frames[-3:-1]] == ["error", "response.failed"], frames
    failed = orjson.loads(frames[-2][1])["response"]
    assert (
        failed["error"]["code"] == "service_unavailable"
        and "send the request again" in (failed["error"]["message"])
    )
    assert reply.status_code == 503 and reply.json()["error"]["code"] == "service_unavailable"
    assert "send the request again" in reply.json()["error"]["message"]
    assert [e["type"] for e in events][-1] == "response.failed", events
    assert events[-1]["response"]["error"]["code"] == "service_unavailable"
    assert close_code == 1001
    for event in [orjson.loads(data) for name, data in frames if name] + events:
        assert_event(event)
    assert "Traceback" not in gw.log_path.read_text()
