"""The server a ``serve`` process runs: uvicorn's, with the gateway's HTTP protocol (the read
bounds, gateway/server/server_protocol.py), its WebSocket options and its shutdown drain
(``GatewayServer``). ``serve_app`` runs it on an address or on a worker's inherited socket."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
from typing import Any

import structlog

from gateway.kernel.errors import ServiceUnavailable
from gateway.kernel.settings import Settings
from gateway.server.internals import Config, Server, missing
from gateway.server.server_protocol import BoundedReads, bounded_protocol

log = structlog.get_logger("gateway.server")

WS_PING_INTERVAL = 20.0  # keepalive pings; a peer silent for interval + timeout is dropped
WS_PING_TIMEOUT = 20.0


def uvicorn_ws_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's WebSocket options. ``websockets-sansio`` awaits the transport's write buffer
    (backpressure) and reads one message at a time. Frames up to twice ``max_ws_frame_bytes``
    reach the app, which answers an error envelope and keeps the socket; bigger ones close it (1009).
    permessage-deflate is declined: its zlib state doubles an idle socket's memory (~35 → ~70 KiB)
    and costs CPU on every small event frame."""
    return {
        "ws": "websockets-sansio",
        "ws_max_size": 2 * settings.limits.max_ws_frame_bytes,
        "ws_ping_interval": WS_PING_INTERVAL,
        "ws_ping_timeout": WS_PING_TIMEOUT,
        "ws_per_message_deflate": False,
    }


def uvicorn_http_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's HTTP/1.1 protocol with the gateway's read bounds (gateway/server/server_protocol.py):
    the request head capped (431), head and body read timeouts (408)."""
    return {"http": bounded_protocol(settings.limits)}


# what a response still generating at the end of the shutdown's drain ends with (its client can
# send it again: another replica, or this one restarted, answers)
_CUT_MESSAGE = "The gateway shut down before this response was finished; send the request again."


class GatewayServer(Server):
    """uvicorn's server, except for shutdown (SIGTERM), which ``drain_seconds`` bounds as a whole:
    it stops accepting and closes idle HTTP connections; WebSockets finish their in-flight turn and
    close with 1001 (plain uvicorn would cut them at once with 1012); HTTP requests in flight (SSE
    streams too) may finish. At the deadline, or on a second Ctrl-C, what is left is cut: turns are
    cancelled (a peer that reads still gets its 1001), then every connection is aborted, so a client
    that does not read holds neither the exit nor the handler behind it."""

    CUT_SECONDS = 0.5  # after the deadline, for close frames; then again for the handlers to end
    GRACE_SECONDS = 1  # uvicorn's own wait after that (timeout_graceful_shutdown): a stuck handler

    def __init__(self, config: Config, app: Any, drain_seconds: float, supervisor: int | None = None) -> None:
        super().__init__(config)
        self.gateway_app = app
        self.drain_seconds = drain_seconds
        self.supervisor = supervisor  # a worker's parent: when it is gone, the worker stops

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and threading.current_thread() is threading.main_thread():
            # SIGHUP: re-read the config (gateway/api/reload.py); synchronous, like the swap it does
            reload = self.gateway_app.state.reloader.reload
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload, "sighup")

    async def on_tick(self, counter: int) -> bool:
        if self.supervisor is not None and counter % 10 == 0 and os.getppid() != self.supervisor:
            if not self.should_exit:
                log.warning("supervisor_gone", supervisor=self.supervisor)
            self.should_exit = True  # drains as on SIGTERM
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_seconds
        runs = getattr(self.gateway_app.state, "background", None)
        if runs is not None:
            runs.accepting = False  # new background work goes to another replica
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        state = self.server_state
        for conn in list(state.connections):
            if isinstance(conn, BoundedReads):
                conn.shutdown()  # idle: closed now; answering: closed after the response
        hub = self.gateway_app.state.ws_hub
        # the hub's own cut comes after the responses still running at the deadline were ended
        drain = asyncio.ensure_future(hub.drain(self.drain_seconds + self.CUT_SECONDS))
        if not await self._settle(deadline):
            # The responses still generating end failed, their clients told why, then the hub
            # cancels the turns still running at its deadline; a second Ctrl-C cuts at once.
            inflight = self.gateway_app.state.inflight
            log.warning(
                "shutdown_cut",
                handlers=len(state.tasks),
                connections=len(state.connections),
                responses=len(inflight),
            )
            if not self.force_exit and inflight.abort_all(ServiceUnavailable(_CUT_MESSAGE)):
                await self._settle(loop.time() + self.CUT_SECONDS)  # their terminal events go out
            cut = asyncio.ensure_future(hub.drain(0)) if self.force_exit else drain
            await asyncio.wait((cut,), timeout=self.CUT_SECONDS)
            cut.cancel()
            for conn in list(state.connections):
                conn.transport.abort()  # blocked writes return, handlers see the client gone
            await self._settle(loop.time() + self.CUT_SECONDS)
        drain.cancel()
        await super().shutdown(sockets)

    async def _settle(self, until: float) -> bool:
        """Wait for the handlers in flight (HTTP requests, WebSockets) and the background responses
        running here until ``until`` or a second Ctrl-C; whether none is left."""
        loop = asyncio.get_running_loop()
        runs = getattr(self.gateway_app.state, "background", None)
        while tasks := self.server_state.tasks | (runs.tasks if runs is not None else set()):
            left = until - loop.time()
            if left <= 0 or self.force_exit:
                return False
            await asyncio.wait(set(tasks), timeout=min(left, 0.1))  # 0.1: to see a second Ctrl-C
        return True


def serve_app(
    app: Any,
    settings: Settings,
    host: str,
    port: int,
    sock: socket.socket | None = None,
    supervisor: int | None = None,
) -> None:
    """Serve ``app`` on ``host``/``port``, or on ``sock`` (a worker's), until it is shut down."""
    if gone := missing():  # an upgrade changed what gateway/server/internals.py relies on
        log.warning("server_internals_missing", features=[feature.name for feature in gone])
    config = Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=GatewayServer.GRACE_SECONDS,
        lifespan="on",
        **uvicorn_http_options(settings),
        **uvicorn_ws_options(settings),
    )
    server = GatewayServer(config, app, settings.limits.ws_drain_seconds, supervisor)
    server.run(sockets=None if sock is None else [sock])
