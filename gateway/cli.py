"""``python -m gateway serve [--config FILE] [--host H] [--port P] [--log-level L]``,
``python -m gateway check-config [--config FILE] [--host H]``, ``--version``."""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from typing import Any

import structlog
import uvicorn

from gateway import __version__
from gateway.kernel.settings import ConfigError, Settings, listener_warnings, load_settings
from gateway.logs import configure_logging, log_config_error

log = structlog.get_logger("gateway.cli")

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


DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def _parser() -> argparse.ArgumentParser:
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument(
        "--config",
        metavar="FILE",
        help="YAML config file (default: $GATEWAY_CONFIG; without either, the built-in defaults)",
    )
    config.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help="the address to listen on; any other than loopback needs auth.api_keys, or "
        f"auth.anonymous: true (default: {DEFAULT_HOST})",
    )
    parser = argparse.ArgumentParser(prog="openresponses-gateway", description="Open Responses gateway")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,check-config}")
    serve = sub.add_parser("serve", parents=[config], help="run the gateway", description="Run the gateway.")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default: {DEFAULT_PORT})")
    serve.add_argument(
        "--log-level",
        default=None,
        choices=["debug", "info", "warning", "error"],
        help="log level (default: the config's log.level, itself info by default)",
    )
    sub.add_parser(
        "check-config",
        parents=[config],
        help="validate the config exactly as serve does, and exit",
        description="Validate the config exactly as serve would (for the same --host), and exit: "
        "0 when it is valid (warnings on stderr), 2 when it is not.",
    )
    return parser


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = load_settings(args.config, host=args.host)
    except ConfigError as exc:
        if args.command == "serve":
            log_config_error(str(exc))  # one JSON line, as every line a server writes
        else:
            print(str(exc), file=sys.stderr)
        return 2
    warnings = listener_warnings(settings, args.host)
    if args.command == "check-config":
        for field, message in warnings:
            print(f"warning: {field}: {message}", file=sys.stderr)
        print("configuration ok")
        return 0
    configure_logging(args.log_level or settings.log.level, settings.log.json_logs)
    for field, message in warnings:
        log.warning("config_warning", field=field, detail=message)
    from gateway.app import create_app

    app = create_app(settings)
    app.state.url = _url(args.host, args.port)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=int(settings.limits.ws_drain_seconds) or None,
        lifespan="on",
        **uvicorn_ws_options(settings),
    )
    GatewayServer(config, app, settings.limits.ws_drain_seconds).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
