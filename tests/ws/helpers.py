"""Helpers for the WebSocket tests: serving the gateway with the CLI's WebSocket options, a client
turn reader, and adapters the tests plug into a served gateway (a recorder of what the upstream
received, a slow streamer that notices cancellation)."""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from adapters.base import Adapter, UpstreamRequest
from adapters.deltas import Delta, Finish, TextDelta, Usage
from adapters.mock.adapter import MockAdapter
from gateway.kernel.errors import UpstreamError
from gateway.kernel.settings import ModelRoute, ProviderSettings, RetrySettings, Settings
from gateway.server.server import uvicorn_ws_options
from tests.harness import ServedApp, serve_gateway

TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})


def serve(settings: dict[str, Any] | None = None) -> AbstractContextManager[ServedApp]:
    """``serve_gateway`` with the uvicorn WebSocket options the CLI uses."""
    s = Settings(**(settings or {}))
    return serve_gateway(s, **uvicorn_ws_options(s))


def create(**body: Any) -> str:
    return orjson.dumps({"type": "response.create", **body}).decode()


def ws_connect(served: ServedApp, path: str = "/v1/responses", **kw: Any) -> Any:
    kw.setdefault("proxy", None)
    kw.setdefault("open_timeout", 10)
    kw.setdefault("close_timeout", 5)
    return connect(served.ws_url + path, **kw)


async def read_turn(ws: ClientConnection, wait: float = 10.0) -> list[dict[str, Any]]:
    """Every message of one turn, through its terminal message (a terminal event or an envelope)."""
    events: list[dict[str, Any]] = []
    while True:
        raw = await asyncio.wait_for(ws.recv(), wait)
        assert isinstance(raw, str), "the gateway sends text frames only"
        event = orjson.loads(raw)
        events.append(event)
        if event["type"] in TERMINAL:
            return events


async def run_turn(ws: ClientConnection, **body: Any) -> list[dict[str, Any]]:
    await ws.send(create(**body))
    return await read_turn(ws)


def assert_envelope(msg: dict[str, Any], status: int, code: str, param: str | None = None) -> None:
    assert msg["type"] == "error", msg
    assert "sequence_number" not in msg
    assert msg["status"] == status, msg
    assert msg["error"]["code"] == code, msg
    if param is not None:
        assert msg["error"]["param"] == param, msg


def assert_clean_turn(events: list[dict[str, Any]], terminal: str = "response.completed") -> dict[str, Any]:
    """Numbered from 0 without gaps, created first, exactly one terminal event, last. → response."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created"
    assert [e["type"] for e in events if e["type"] in TERMINAL] == [terminal]
    assert events[-1]["type"] == terminal
    return events[-1]["response"]


def output_text(response: dict[str, Any]) -> str:
    return "".join(
        p.get("text", "") for item in response["output"] if item["type"] == "message" for p in item["content"]
    )


# -- adapters plugged into a served gateway ------------------------------------------------------
def install(served: ServedApp, model: str, adapter: Adapter) -> None:
    """Route ``model`` to ``adapter`` in a running gateway (no retries)."""
    router = served.app.state.gateway.router
    router.providers[model] = ProviderSettings(kind="mock", retry=RetrySettings(attempts=0))
    router.adapters[model] = adapter
    router.routes[model] = ModelRoute(provider=model, upstream_model=model)


class Recorder:
    """Wraps an adapter and keeps a copy of every upstream request's transcript."""

    def __init__(self, inner: Adapter | None = None) -> None:
        self.inner = inner or MockAdapter()
        self.requests: list[UpstreamRequest] = []
        self._lock = threading.Lock()

    def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
        with self._lock:
            self.requests.append(copy.deepcopy(request))
        return self.inner.stream(request)

    def transcripts(self) -> list[list[dict[str, Any]]]:
        with self._lock:
            return [r.items for r in self.requests]

    async def aclose(self) -> None:
        return None


class Slow:
    """Streams ``pieces`` text deltas ``delay`` seconds apart; records start and close (the
    generator's ``finally`` is where a real adapter drops its upstream connection)."""

    def __init__(self, pieces: int = 10, delay: float = 0.1, fail_after: int | None = None) -> None:
        self.pieces = pieces
        self.delay = delay
        self.fail_after = fail_after
        self.started = threading.Event()
        self.closed = threading.Event()
        self.completed = threading.Event()
        self.calls = 0

    async def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
        self.calls += 1
        self.started.set()
        try:
            for i in range(self.pieces):
                if self.fail_after is not None and i == self.fail_after:
                    raise UpstreamError("The upstream broke mid-stream.", code="upstream_error")
                yield TextDelta(f"p{i} ")
                await asyncio.sleep(self.delay)
            yield Usage(input_tokens=1, output_tokens=self.pieces)
            yield Finish("stop")
            self.completed.set()
        finally:
            self.closed.set()

    async def aclose(self) -> None:
        return None


class FailFirst:
    """Refuses every request before any output (the provider said 400)."""

    def __init__(self, error: UpstreamError) -> None:
        self.error = error

    async def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
        raise self.error
        yield  # pragma: no cover

    async def aclose(self) -> None:
        return None


class SlowMock(MockAdapter):
    """The mock model, with a pause before each delta (for the SIGTERM test's subprocess)."""

    async def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
        async for delta in super().stream(request):
            await asyncio.sleep(0.15)
            yield delta


class FrameTap:
    """An ASGI wrapper that keeps every client text frame of every WebSocket (what clients send)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.frames: list[dict[str, Any]] = []

    @property
    def state(self) -> Any:
        return self.app.state

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return

        async def tapped() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "websocket.receive" and message.get("text") is not None:
                self.frames.append(orjson.loads(message["text"]))
            return message

        await self.app(scope, tapped, send)
