"""A real loopback server for tests: an ASGI app under uvicorn (or a raw asyncio handler) on
127.0.0.1 and a free port, inside the test's running event loop.

    async with serve_asgi(app) as server:      # server.url == "http://127.0.0.1:<port>"
        ...

Raise :class:`Hangup` in an ASGI app to drop the connection abruptly (mid-body if the response
has started); uvicorn's error log for it is silenced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import uvicorn

__all__ = ["Hangup", "LoopbackServer", "serve_asgi", "serve_raw", "unused_port"]

ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[[dict[str, Any]], Awaitable[None]]],
    Awaitable[None],
]
RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Hangup(Exception):
    """Raised by a fake app to make uvicorn close the connection without finishing the response."""


class _DropHangups(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, Hangup)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # leave pytest's signal handlers alone


class LoopbackServer:
    """A started server: ``host``, ``port``, ``url``. Stop it with ``await stop()``."""

    def __init__(self, host: str, port: int, stop: Callable[[], Awaitable[None]]) -> None:
        self.host = host
        self.port = port
        self.url = f"http://{host}:{port}"
        self._stop = stop

    async def stop(self) -> None:
        await self._stop()


def unused_port() -> int:
    """A port nothing listens on (for "connection refused" tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def serve_asgi(app: ASGIApp, *, graceful_seconds: int = 1) -> AsyncIterator[LoopbackServer]:
    """Serve ``app`` with uvicorn (h11, no lifespan) until the block exits."""
    logging.getLogger("uvicorn.error").addFilter(_DropHangups())
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        http="h11",
        ws="none",
        lifespan="off",
        log_config=None,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=graceful_seconds,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # raises the start-up failure
            raise RuntimeError("uvicorn exited before starting")
        await asyncio.sleep(0.005)

    async def stop() -> None:
        if task.done():
            return
        server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(task), graceful_seconds + 2.0)
        except TimeoutError:
            server.force_exit = True
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    lb = LoopbackServer("127.0.0.1", port, stop)
    try:
        yield lb
    finally:
        await stop()
        sock.close()


@contextlib.asynccontextmanager
async def serve_raw(handler: RawHandler) -> AsyncIterator[LoopbackServer]:
    """Serve a raw ``(reader, writer)`` handler with ``asyncio.start_server`` (full byte control)."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def stop() -> None:
        server.close()
        if hasattr(server, "close_clients"):
            server.close_clients()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 2.0)

    lb = LoopbackServer("127.0.0.1", port, stop)
    try:
        yield lb
    finally:
        await stop()
