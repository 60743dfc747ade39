"""``python -m gateway serve [--config FILE] [--host H] [--port P]``."""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from typing import Any

import uvicorn

from gateway.api.server_protocol import bounded_protocol
from gateway.kernel.settings import ConfigError, Settings, load_settings
from gateway.logs import configure_logging

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
    """uvicorn's HTTP/1.1 protocol with the gateway's read bounds (gateway/api/server_protocol.py):
    the request head capped (431), head and body read timeouts (408)."""
    return {"http": bounded_protocol(settings.limits)}


class GatewayServer(uvicorn.Server):
    """uvicorn's server, except that on shutdown (SIGTERM) it stops accepting, then lets open
    WebSockets finish their in-flight turn within ``ws_drain_seconds`` and closes them with 1001
    (plain uvicorn would cut them at once with 1012)."""

    def __init__(self, config: uvicorn.Config, app: Any, drain_seconds: float) -> None:
        super().__init__(config)
        self.gateway_app = app
        self.drain_seconds = drain_seconds

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        hub = self.gateway_app.state.ws_hub
        drain = asyncio.ensure_future(hub.drain(self.drain_seconds))
        while not drain.done() and not self.force_exit:  # a second Ctrl-C cuts the drain short
            await asyncio.wait((drain,), timeout=0.1)
        if not drain.done():
            await hub.drain(0)
            drain.cancel()
        await super().shutdown(sockets)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="openresponses-gateway", description="Open Responses gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="YAML config file (default: $GATEWAY_CONFIG, else built-in)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--log-level", default=None, choices=["debug", "info", "warning", "error"])
    sub.add_parser("check-config", help="validate the config and exit").add_argument("--config")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if args.command == "check-config":
        print("configuration ok")
        return 0
    configure_logging(args.log_level or settings.log.level, settings.log.json_logs)
    from gateway.app import create_app

    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=int(settings.limits.ws_drain_seconds) or None,
        lifespan="on",
        **uvicorn_http_options(settings),
        **uvicorn_ws_options(settings),
    )
    GatewayServer(config, app, settings.limits.ws_drain_seconds).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
