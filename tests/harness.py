"""Run the real gateway app under uvicorn on a loopback port, in a thread, for tests."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from gateway.app import create_app
from gateway.kernel.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServedApp:
    """uvicorn serving ``app`` on 127.0.0.1 in a daemon thread with its own event loop."""

    def __init__(self, app: Any, port: int | None = None, **uvicorn_kw: Any) -> None:
        self.port = port or free_port()
        self.config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            access_log=False,
            lifespan="on",
            **uvicorn_kw,
        )
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.app = app

    def _run(self) -> None:
        asyncio.run(self.server.serve())

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self) -> ServedApp:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


@contextmanager
def serve_gateway(
    settings: Settings | dict[str, Any] | None = None, **uvicorn_kw: Any
) -> Iterator[ServedApp]:
    if isinstance(settings, dict) or settings is None:
        settings = Settings(**(settings or {}))
    served = ServedApp(create_app(settings), **uvicorn_kw).start()
    try:
        yield served
    finally:
        served.stop()
