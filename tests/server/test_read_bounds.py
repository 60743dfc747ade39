"""The read bounds of an HTTP connection, over raw sockets: the request head is capped (431), a head
and a body must arrive in time (408), a silent connection is closed. Served by the real CLI
(httptools) and, in-process, over uvicorn's h11 protocol with the same bounds."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.kernel.settings import Settings
from gateway.server.server_protocol import H11Bounded, bounded_protocol
from tests.api.helpers import serve_cli, wait_until_up
from tests.harness import ServedApp, free_port

MAX_HEAD = 16 * 1024
LIMITS = {"max_header_bytes": MAX_HEAD, "header_read_seconds": 0.5, "body_read_seconds": 0.5}
WAIT = 10.0  # the most any answer here may take (the timeouts are 0.5 s)


@dataclass
class Bounded:
    """The served gateway: its port, and its access-log lines (``"request"``) so far."""

    port: int
    access_lines: Callable[[], Sequence[Mapping[str, Any]]]


@pytest.fixture(scope="module", params=["cli-httptools", "h11"])
def bounded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bounded]:
    if request.param == "h11":
        settings = Settings(limits=LIMITS)
        protocol = bounded_protocol(settings.limits, H11Bounded)
        with capture_logs() as captured:
            served = ServedApp(create_app(settings), http=protocol).start()
            try:
                yield Bounded(served.port, lambda: [e for e in captured if e["event"] == "request"])
            finally:
                served.stop()
        return
    port = free_port()
    env = {**os.environ, **{f"GATEWAY_LIMITS__{k.upper()}": str(v) for k, v in LIMITS.items()}}
    log = tmp_path_factory.mktemp("read-bounds") / "gateway.log"
    with log.open("wb") as stderr:
        proc = serve_cli(port, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            wait_until_up(proc, port)
            yield Bounded(port, lambda: json_log_events(log, "request"))
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def json_log_events(log: Path, name: str) -> list[dict[str, Any]]:
    lines = [orjson.loads(ln) for ln in log.read_bytes().splitlines() if ln.startswith(b"{")]
    return [ln for ln in lines if ln.get("event") == name]


@pytest.fixture
def port(bounded: Bounded) -> int:
    return bounded.port


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


# Bytes read past one response (a pipelined answer that came in the same read), per socket.
_unread: weakref.WeakKeyDictionary[socket.socket, bytes] = weakref.WeakKeyDictionary()


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response (a content-length or a chunked body): (status, headers, body). What a read
    brought beyond it is kept for the next call (pipelined answers can arrive in one read)."""
    raw = _unread.pop(sock, b"")

    def more() -> None:
        nonlocal raw
        chunk = sock.recv(65536)
        assert chunk, f"closed without a (whole) response: {raw!r}"
        raw += chunk

    def until(done: bytes) -> None:
        while done not in raw:
            more()

    until(b"\r\n\r\n")
    head, _, raw = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        until(b"0\r\n\r\n")  # the bodies here are JSON: the terminator cannot occur inside
        body = b""
        while (size := int(raw[: raw.index(b"\r\n")], 16)) > 0:
            start = raw.index(b"\r\n") + 2
            body, raw = body + raw[start : start + size], raw[start + size + 2 :]
        _unread[sock] = raw[raw.index(b"\r\n\r\n") + 4 :]  # past "0" and the empty trailer
        return int(lines[0].split()[1]), headers, body
    length = int(headers["content-length"])
    while len(raw) < length:
        more()
    _unread[sock] = raw[length:]
    return int(lines[0].split()[1]), headers, raw[:length]


def assert_closed(sock: socket.socket) -> None:
    """The server closes: EOF (or a reset) within WAIT seconds, whatever we still send."""
    deadline = time.monotonic() + WAIT
    try:
        while sock.recv(65536):
            assert time.monotonic() < deadline, "the connection stayed open"
    except ConnectionResetError:
        pass


def assert_error(response: tuple[int, dict[str, str], bytes], status: int, code: str) -> None:
    got, headers, body = response
    assert got == status
    assert headers["connection"] == "close" and headers["content-type"] == "application/json"
    error = orjson.loads(body)["error"]
    assert set(error) == {"type", "code", "message", "param"}
    assert error["type"] == "invalid_request_error" and error["code"] == code and error["message"]


def healthz_head(size: int) -> bytes:
    """A ``GET /healthz`` head of exactly ``size`` bytes, blank line included."""
    head = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Pad: "
    return head + b"a" * (size - len(head) - 4) + b"\r\n\r\n"


def test_the_request_head_is_capped(port: int) -> None:
    # Exactly at the cap, in two reads split inside the blank line: served.
    with connect(port) as sock:
        head = healthz_head(MAX_HEAD)
        sock.sendall(head[:-2])
        time.sleep(0.05)
        sock.sendall(head[-2:])
        assert read_response(sock)[0] == 200
    # One byte more: 431 with the error body, then the connection closes.
    with connect(port) as sock:
        sock.sendall(healthz_head(MAX_HEAD + 1))
        response = read_response(sock)
        assert_error(response, 431, "request_headers_too_large")
        assert str(MAX_HEAD) in orjson.loads(response[2])["error"]["message"]
        assert_closed(sock)
    # A head that never ends, sent in small pieces: refused once the count passes the cap.
    with connect(port) as sock:
        sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: t\r\n")
        for _ in range(4 * MAX_HEAD // 1024):
            try:
                sock.sendall(b"X-Pad: " + b"a" * 1015 + b"\r\n")
            except OSError:
                break
            if select.select([sock], [], [], 0)[0]:
                break
        assert_error(read_response(sock), 431, "request_headers_too_large")
        assert_closed(sock)
    # Bodies do not count: a head, a body of twice the cap and the start of a pipelined head in one
    # write, then the rest of that head: both requests are served.
    with connect(port) as sock:
        body = orjson.dumps({"model": "mock", "input": "x" * 2 * MAX_HEAD, "store": False})
        first = b"POST /v1/responses HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        second = healthz_head(MAX_HEAD - 1024)
        sock.sendall(first + second[:100])
        time.sleep(0.05)
        sock.sendall(second[100:])
        assert read_response(sock)[0] == 200
        assert read_response(sock)[0] == 200
    # A head over the cap followed by a body in the same read: refused, not parsed.
    with connect(port) as sock:
        body = b'{"model": "mock", "input": "hi"}'
        big = b"POST /v1/responses HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"a" * 2 * MAX_HEAD
        sock.sendall(big + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        assert_error(read_response(sock), 431, "request_headers_too_large")


def test_a_head_must_arrive_in_time(port: int) -> None:
    with connect(port) as sock:
        # Requests that arrive whole are served however long the connection idles between them
        # (within the keep-alive timeout): the head timer runs only while a head is incomplete.
        for pause in (0.8, 0.0):
            sock.sendall(healthz_head(200))
            assert read_response(sock)[0] == 200
            time.sleep(pause)
        sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: t\r\nContent-Ty")
        assert_error(read_response(sock), 408, "request_timeout")
        assert_closed(sock)
    # Trickling does not reset the clock: the whole head is due in header_read_seconds.
    with connect(port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        for _ in range(int(WAIT / 0.1)):
            sock.sendall(b"X-A: b\r\n")
            if select.select([sock], [], [], 0.1)[0]:
                break
        assert_error(read_response(sock), 408, "request_timeout")
        assert_closed(sock)


@pytest.mark.parametrize("trickle", [False, True], ids=["stalled", "trickled"])
def test_a_body_must_arrive_in_time(bounded: Bounded, trickle: bool) -> None:
    body = orjson.dumps({"model": "mock", "input": "hi " * 100, "store": False})
    head = b"POST /v1/responses HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    request_id = f"req-late-body-{trickle}"
    late = head + b"X-Request-Id: %s\r\nContent-Length: %d\r\n\r\n" % (request_id.encode(), len(body))
    with connect(bounded.port) as sock:
        sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert read_response(sock)[0] == 200  # a whole body: served
        sock.sendall(late + body[:10])
        for i in range(10, len(body) if trickle else 10):
            sock.sendall(body[i : i + 1])
            if select.select([sock], [], [], 0.05)[0]:
                break
        assert_error(read_response(sock), 408, "request_timeout")
        assert_closed(sock)
    # The request's access-log line says what the client got: 408, not the 400 of a client gone.
    deadline = time.monotonic() + WAIT
    while not (logged := [e for e in bounded.access_lines() if e.get("request_id") == request_id]):
        assert time.monotonic() < deadline, "the late request was never logged"
        time.sleep(0.05)
    assert [(e["status"], e["error_code"]) for e in logged] == [(408, "request_timeout")]


def test_a_silent_connection_is_closed(port: int) -> None:
    with connect(port) as sock:
        assert_closed(sock)
