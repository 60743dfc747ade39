"""SIGTERM on the real CLI process while clients do not read their streams (SSE and WebSocket): the
drain bounds the whole shutdown, and the handlers end cleanly (no traceback on stderr)."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import time

import orjson

from tests.api.helpers import serve_cli, wait_until_up
from tests.harness import free_port

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
