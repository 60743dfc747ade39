"""``python -m gateway serve [--config FILE] [--host H] [--port P]``."""

from __future__ import annotations

import argparse
import sys

import uvicorn

from gateway.logs import configure_logging
from gateway.settings import ConfigError, load_settings


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
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        ws_max_size=settings.limits.max_ws_frame_bytes,
        timeout_graceful_shutdown=int(settings.limits.ws_drain_seconds) or None,
        lifespan="on",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
