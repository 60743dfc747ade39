"""What gateway/server/internals.py relies on of uvicorn and websockets is there, with the versions
installed: each feature detected at import, and, under uvicorn with the gateway's own protocol and
options, the real connection objects behind an SSE ``send`` and a WebSocket. An upgrade that
renames or removes one of them fails here by name (the gateway itself would fall back to plain
ASGI sends, slower, or lose its read bounds or shutdown drain)."""

from __future__ import annotations

import asyncio
from importlib.metadata import version
from typing import Any

import httpx
import pytest
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect

from gateway.kernel.settings import Settings
from gateway.server import internals
from gateway.server.internals import FEATURES, Feature, chunk_sink, ws_sink
from gateway.server.server import uvicorn_http_options, uvicorn_ws_options
from gateway.server.server_protocol import BoundedReads
from tests.harness import ServedApp

VERSIONS = f"uvicorn {version('uvicorn')}, websockets {version('websockets')}"


@pytest.mark.parametrize("feature", list(Feature), ids=lambda f: f.name)
def test_each_feature_is_found_with_the_installed_versions(feature: Feature) -> None:
    assert FEATURES[feature], (
        f"{VERSIONS} changed what the gateway relies on: {feature.name}: {feature.value}"
    )


def test_nothing_is_missing() -> None:
    assert internals.missing() == [], f"{VERSIONS}: missing {[f.name for f in internals.missing()]}"


class Probe:
    """An ASGI app reporting what the internals find behind uvicorn's ``send`` of each scope."""

    def __init__(self) -> None:
        self.found: dict[str, Any] = {}
        self.server: Any = None  # the uvicorn.Server serving it

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
        elif scope["type"] == "http":
            start = {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
            await send(start)
            self.found["http_protocol"] = next(iter(self.server.server_state.connections), None)
            self.found["chunk_sink"] = chunk_sink(send)
            self.found["http_transport"] = getattr(getattr(send, "__self__", None), "transport", None)
            await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": False})
        elif scope["type"] == "websocket":
            ws = WebSocket(scope, receive, send)
            await ws.accept()
            self.found["ws_sink"] = ws_sink(ws)
            self.found["ws_transport"] = getattr(getattr(ws._send, "__self__", None), "transport", None)
            await ws.close()


async def test_the_real_connections_behind_the_asgi_send_are_reached() -> None:
    """Under the gateway's protocol and options, the sinks and the transports ``abort_transport``
    closes are found on the objects uvicorn really hands the app."""
    settings = Settings()
    probe = Probe()
    served = ServedApp(probe, **uvicorn_http_options(settings), **uvicorn_ws_options(settings))
    probe.server = served.server
    served.start()
    try:
        async with httpx.AsyncClient(base_url=served.base_url, timeout=10) as client:
            r = await client.get("/")
        assert r.status_code == 200
        async with connect(served.ws_url, proxy=None, open_timeout=10) as ws:
            await asyncio.wait_for(ws.wait_closed(), 10)
    finally:
        served.stop()
    found = probe.found
    assert isinstance(found["http_protocol"], BoundedReads), f"{VERSIONS}: the read bounds' protocol not used"
    assert found["chunk_sink"] is not None, f"{VERSIONS}: SSE_DIRECT: {Feature.SSE_DIRECT.value}"
    assert found["ws_sink"] is not None, f"{VERSIONS}: WS_DIRECT: {Feature.WS_DIRECT.value}"
    assert found["ws_sink"]._plain, f"{VERSIONS}: WS_PLAIN_FRAMES: {Feature.WS_PLAIN_FRAMES.value}"
    for key in ("http_transport", "ws_transport"):
        assert callable(getattr(found[key], "abort", None)), (
            f"{VERSIONS}: CLIENT_ABORT: {Feature.CLIENT_ABORT.value}"
        )


def test_the_detection_notices_an_attribute_a_constructor_no_longer_sets() -> None:
    class Renamed:  # as if an upgrade renamed ``writable``
        def __init__(self) -> None:
            self.conn = None
            self.can_write = True

    assert internals._has(Renamed, ("conn",))
    assert not internals._has(Renamed, ("conn", "writable"))
