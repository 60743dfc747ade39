"""The socket's life: auth at the upgrade, the age limit, disconnects that cancel the upstream,
a slow reader that must not grow buffers, and the shutdown drain (in-process and by SIGTERM)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.app import create_app
from gateway.kernel.settings import Settings
from gateway.server.server import GatewayServer, uvicorn_ws_options
from tests.harness import ServedApp, free_port, serve_gateway
from tests.ws.helpers import (
    Slow,
    assert_clean_turn,
    assert_envelope,
    create,
    install,
    read_turn,
    run_turn,
    serve,
    ws_connect,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ws_requests(served: ServedApp) -> int:
    return int(served.app.state.metrics.total("gateway_requests_total", transport="websocket"))


async def wait_for(predicate: Callable[[], object], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# -- auth ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def authed() -> Iterator[ServedApp]:
    with serve({"auth": {"api_keys": [{"key": "sk-good", "tenant": "acme"}]}}) as served:
        yield served


@pytest.mark.parametrize("header", [None, "Bearer sk-bad", "Basic sk-good"])
async def test_upgrade_refused_without_a_valid_key(authed: ServedApp, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    with pytest.raises(InvalidStatus) as info:
        async with ws_connect(authed, additional_headers=headers):
            pass
    response = info.value.response
    assert response.status_code == 401
    assert orjson.loads(response.body)["error"]["code"] == "invalid_api_key"
    metrics = authed.app.state.metrics
    assert metrics.total("gateway_websocket_turns_total") == 0  # no turn ran
    # the refusal is a request of its own, with its status and code
    assert (
        metrics.total(
            "gateway_requests_total", transport="websocket", status="401", error_code="invalid_api_key"
        )
        >= 1
    )


async def test_upgrade_accepted_with_a_valid_key(authed: ServedApp) -> None:
    async with ws_connect(authed, additional_headers={"Authorization": "Bearer sk-good"}) as ws:
        assert_clean_turn(await run_turn(ws, model="mock", input="hi"))


# -- the connection age limit -----------------------------------------------------------------------
async def test_limit_lets_the_turn_finish_then_refuses_the_next_create() -> None:
    with serve({"limits": {"ws_connection_seconds": 1.0}}) as served:
        install(served, "slow", Slow(pieces=8, delay=0.2))
        async with ws_connect(served) as ws:
            await ws.send(create(model="slow", input="long"))
            await ws.send(create(model="mock", input="queued behind it"))
            assert_clean_turn(await read_turn(ws))  # ran past the limit, not cut
            [msg] = await read_turn(ws)
            assert_envelope(msg, 400, "websocket_connection_limit_reached")
            assert msg["error"]["type"] == "invalid_request_error"
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
            assert ws.close_code == 1000


async def test_idle_socket_at_the_limit_gets_the_error_and_is_closed() -> None:
    with serve({"limits": {"ws_connection_seconds": 1.0}}) as served:
        async with ws_connect(served) as ws:
            started = time.monotonic()
            assert_clean_turn(await run_turn(ws, model="mock", input="hi"))
            [msg] = await read_turn(ws, wait=5)
            assert_envelope(msg, 400, "websocket_connection_limit_reached")
            assert 0.8 < time.monotonic() - started < 4
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)


# -- disconnects and backpressure -------------------------------------------------------------------
async def test_client_gone_mid_turn_cancels_the_upstream_within_a_second(gw: ServedApp) -> None:
    slow = Slow(pieces=200, delay=0.05)
    install(gw, "endless", slow)
    async with ws_connect(gw) as ws:
        await ws.send(create(model="endless", input="go", store=False))
        while orjson.loads(await ws.recv())["type"] != "response.output_text.delta":
            pass
        assert gw.app.state.metrics.ws_connections >= 1
    gone = time.monotonic()
    await asyncio.to_thread(slow.closed.wait, 5)
    assert slow.closed.is_set() and time.monotonic() - gone < 1.0
    assert not slow.completed.is_set()
    await wait_for(lambda: not gw.app.state.ws_hub.connections)
    assert gw.app.state.metrics.ws_connections == 0


async def test_abrupt_drop_mid_turn_cancels_too(gw: ServedApp) -> None:
    slow = Slow(pieces=200, delay=0.05)
    install(gw, "endless2", slow)
    ws = await ws_connect(gw)
    await ws.send(create(model="endless2", input="go"))
    await ws.recv()
    ws.transport.abort()  # no close frame: the TCP connection just goes
    gone = time.monotonic()
    await asyncio.to_thread(slow.closed.wait, 5)
    assert slow.closed.is_set() and time.monotonic() - gone < 1.0


async def test_a_slow_reader_does_not_grow_server_buffers() -> None:
    text = os.urandom(60_000).hex()  # ~30k deltas, ~6 MB of frames: more than the kernel holds
    with serve() as served:
        async with ws_connect(served, compression=None, max_size=None, max_queue=1, ping_interval=None) as ws:
            await ws.send(create(model="mock", input=text, store=False))
            await asyncio.sleep(1.5)  # not reading: the gateway must be stalled, not buffering
            conns = [c for c in served.server.server_state.connections if hasattr(c, "conn")]
            assert conns and all(c.transport.get_write_buffer_size() < 1 << 20 for c in conns)
            assert ws_requests(served) == 0  # the turn has not been able to finish
            events = await read_turn(ws, wait=60)
        response = assert_clean_turn(events)
        assert response["output"][0]["content"][0]["text"] == "Hello! You said: " + text


async def test_queue_overflow_gets_an_envelope_and_keeps_the_socket() -> None:
    with serve({"limits": {"ws_queue_size": 1}}) as served:
        install(served, "slow", Slow(pieces=5, delay=0.1))
        async with ws_connect(served) as ws:
            for n in range(4):
                await ws.send(create(model="slow", input=f"n{n}"))
            messages: list[dict[str, Any]] = []
            while sum(m["type"] == "response.completed" for m in messages) < 2:
                messages.append(orjson.loads(await asyncio.wait_for(ws.recv(), 10)))
        overflow = [m for m in messages if m["type"] == "error"]
        assert len(overflow) == 2
        for m in overflow:
            assert_envelope(m, 429, "websocket_queue_full")


async def test_keepalive_pings_and_a_silent_peer_is_dropped() -> None:
    settings = Settings()
    options = {**uvicorn_ws_options(settings), "ws_ping_interval": 0.3, "ws_ping_timeout": 2.0}
    with serve_gateway(settings, **options) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(
            b"GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 101")
        first = await asyncio.wait_for(reader.readexactly(2), 3)
        assert first[0] == 0x89  # FIN + ping
        await reader.readexactly(first[1] & 0x7F)
        rest = await asyncio.wait_for(reader.read(), 15)  # never answered: the server gives up
        assert rest[:1] == b"\x88" and int.from_bytes(rest[2:4], "big") == 1011
        writer.close()
        # A real client answers the pings and keeps its socket.
        async with ws_connect(served) as ws:
            await asyncio.sleep(2.5)  # several pings, each answered in time
            assert_clean_turn(await run_turn(ws, model="mock", input="still alive"))


# -- shutdown --------------------------------------------------------------------------------------
def served_with_drain(settings: Settings, drain_seconds: float) -> ServedApp:
    app = create_app(settings)
    served = ServedApp(app, **uvicorn_ws_options(settings))
    served.server = GatewayServer(served.config, app, drain_seconds)
    return served.start()


async def test_shutdown_drains_in_flight_turns_and_closes_with_1001() -> None:
    served = served_with_drain(Settings(), drain_seconds=10)
    try:
        slow = Slow(pieces=10, delay=0.1)
        install(served, "slow", slow)
        idle = await ws_connect(served)
        busy = await ws_connect(served)
        await busy.send(create(model="slow", input="finish me"))
        await busy.recv()
        served.server.should_exit = True  # what uvicorn's SIGTERM handler does
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(idle.recv(), 5)
        assert idle.close_code == 1001
        events = [orjson.loads(await busy.recv())]
        events[0:0] = [{"type": "response.created", "sequence_number": 0}]
        events += await read_turn(busy)
        assert events[-1]["type"] == "response.completed"  # finished, not cut
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(busy.recv(), 5)
        assert busy.close_code == 1001
        with pytest.raises((OSError, InvalidStatus)):  # no new sockets while draining
            async with ws_connect(served, open_timeout=2):
                pass
    finally:
        served.stop()


async def test_drain_timeout_cuts_what_is_left() -> None:
    served = served_with_drain(Settings(), drain_seconds=0.5)
    try:
        slow = Slow(pieces=100, delay=0.1)
        install(served, "slow", slow)
        ws = await ws_connect(served)
        await ws.send(create(model="slow", input="too long"))
        await ws.recv()
        started = time.monotonic()
        served.server.should_exit = True
        seen = []
        with pytest.raises(ConnectionClosed):
            while True:
                seen.append(orjson.loads(await asyncio.wait_for(ws.recv(), 5)))
        assert ws.close_code == 1001
        assert time.monotonic() - started < 5  # 0.5 s drain, plus slack for a loaded machine
        assert slow.closed.is_set() and not slow.completed.is_set()
        # the response still running at the deadline ended failed, its client told why, then 1001
        failed = seen[-1]
        assert failed["type"] == "response.failed", seen[-3:]
        assert failed["response"]["error"]["code"] == "service_unavailable"
        assert "shut down" in failed["response"]["error"]["message"]
        [message] = failed["response"]["output"]
        assert message["status"] == "incomplete" and message["content"][0]["text"].startswith("p0 ")
        assert [e["sequence_number"] for e in seen] == list(range(1, len(seen) + 1))
    finally:
        served.stop()


async def test_drain_timeout_ends_sse_and_json_responses_with_their_error() -> None:
    """At the drain deadline an SSE stream gets ``error`` + ``response.failed`` + ``[DONE]`` and a
    JSON request its 503 error body, instead of a connection cut mid-answer."""
    served = served_with_drain(Settings(), drain_seconds=0.8)
    try:
        slow = Slow(pieces=100, delay=0.1)
        install(served, "slow", slow)
        async with httpx.AsyncClient(base_url=served.base_url, timeout=10) as http:

            async def sse() -> list[bytes]:
                body = {"model": "slow", "input": "too long", "stream": True}
                async with http.stream("POST", "/v1/responses", json=body) as r:
                    assert r.status_code == 200
                    return [chunk async for chunk in r.aiter_bytes()]

            async def whole() -> httpx.Response:
                return await http.post("/v1/responses", json={"model": "slow", "input": "too long"})

            streamed, answered = asyncio.create_task(sse()), asyncio.create_task(whole())
            for _ in range(200):  # both requests have reached the model
                if slow.calls >= 2:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
            served.server.should_exit = True
            raw = b"".join(await asyncio.wait_for(streamed, 10))
            reply = await asyncio.wait_for(answered, 10)
        frames = [f for f in raw.decode().split("\n\n") if f]
        assert frames[-1] == "data: [DONE]"
        kinds = [f.split("\n", 1)[0] for f in frames[:-1]]
        assert kinds[-2:] == ["event: error", "event: response.failed"], kinds[-4:]
        failed = orjson.loads(frames[-2].split("\ndata: ", 1)[1])
        assert failed["response"]["error"]["code"] == "service_unavailable"
        assert "event: response.output_text.delta" in kinds
        assert reply.status_code == 503 and reply.json()["error"]["code"] == "service_unavailable"
        assert not slow.completed.is_set()
    finally:
        served.stop()


async def test_a_second_interrupt_cuts_the_drain_short() -> None:
    served = served_with_drain(Settings(), drain_seconds=60)
    try:
        slow = Slow(pieces=100, delay=0.1)
        install(served, "slow", slow)
        ws = await ws_connect(served)
        await ws.send(create(model="slow", input="too long"))
        await ws.recv()
        served.server.should_exit = True
        await asyncio.sleep(0.3)
        started = time.monotonic()
        served.server.force_exit = True  # what a second Ctrl-C does
        with pytest.raises(ConnectionClosed):
            while True:
                await asyncio.wait_for(ws.recv(), 5)
        assert ws.close_code == 1001 and time.monotonic() - started < 2
    finally:
        served.stop()


async def test_sigterm_drains_the_real_cli() -> None:
    port = free_port()
    code = (
        "import sys, adapters.registry as r\n"
        "r._KINDS['mock'] = 'tests.ws.helpers:SlowMock'\n"
        "from gateway.cli import main\n"
        f"sys.exit(main(['serve', '--port', '{port}']))\n"
    )
    env = {**os.environ, "GATEWAY_LIMITS__WS_DRAIN_SECONDS": "30", "PYTHONPATH": ROOT}
    log = tempfile.TemporaryFile()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log
    )
    try:
        async with httpx.AsyncClient() as http:
            deadline = time.monotonic() + 20
            while True:
                try:
                    if (await http.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and proc.returncode is None, "gateway did not start"
                await asyncio.sleep(0.1)
        served = ServedApp.__new__(ServedApp)
        served.port = port
        async with ws_connect(served) as ws:
            await ws.send(create(model="mock", input="one two three", store=False))
            first = orjson.loads(await ws.recv())
            assert first["type"] == "response.created"
            proc.send_signal(signal.SIGTERM)
            events = [first, *await read_turn(ws, wait=30)]
            assert assert_clean_turn(events)["status"] == "completed"
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
            assert ws.close_code == 1001
        # uvicorn re-raises the captured SIGTERM once shut down, hence -15 rather than 0.
        assert await asyncio.wait_for(proc.wait(), 40) in (0, -signal.SIGTERM)
    except BaseException:
        log.seek(0)
        print(log.read().decode(errors="replace")[-4000:])
        raise
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        log.close()
