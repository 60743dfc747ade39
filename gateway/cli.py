"""``python -m gateway serve [--config FILE] [--host H] [--port P] [--workers N] [--log-level L]``,
``python -m gateway check-config [--config FILE] [--host H]``, ``--version``.

With more than one worker, ``serve`` is the supervisor (gateway/server/supervisor.py), which runs each
worker as ``serve ... --worker-fd FD``: this same server on the supervisor's socket. The server
itself (uvicorn's, with the gateway's protocol, options and shutdown) is gateway/server/server.py."""

from __future__ import annotations

import argparse
import base64
import os
import socket
import sys

import structlog

from gateway import __version__
from gateway.kernel.settings import ConfigError, Settings, listener_warnings, load_settings
from gateway.logs import configure_logging, log_config_error
from gateway.server.server import GatewayServer, serve_app
from gateway.server.supervisor import Supervisor, bind

log = structlog.get_logger("gateway.cli")

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
    serve.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"TCP port (default: {DEFAULT_PORT})")
    serve.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="worker processes sharing the port (default: the config's server.workers, itself 1)",
    )
    serve.add_argument("--worker-fd", type=int, default=None, help=argparse.SUPPRESS)  # the supervisor's
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


def _port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535: argparse refuses anything else (uvicorn would hang)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, not {port}")
    return port


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def workers_warnings(settings: Settings, workers: int) -> list[tuple[str, str]]:
    """What more than one worker process does not share unless the config makes it shared."""
    if workers < 2:
        return []
    found = []
    if settings.state.redis_url is None:
        found.append(
            (
                "state.redis_url",
                f"{workers} workers with the in-process store: each has its own, so a response stored "
                "by one is not found by another (previous_response_id) and tenancy limits count per "
                "worker; set state.redis_url to share them",
            )
        )
    if not settings.compaction.keys:
        found.append(
            (
                "compaction.keys",
                f"{workers} workers without compaction keys: they share one random key made at "
                "start, so compacted items do not open after a restart or on another replica; set "
                "compaction.keys",
            )
        )
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    try:
        settings = load_settings(args.config, host=args.host)
    except ConfigError as exc:
        if args.command == "serve":
            log_config_error(str(exc))  # one JSON line, as every line a server writes
        else:
            print(str(exc), file=sys.stderr)
        return 2
    flag = getattr(args, "workers", None)  # check-config has no --workers
    workers = settings.server.workers if flag is None else flag
    warnings = listener_warnings(settings, args.host) + workers_warnings(settings, workers)
    if args.command == "check-config":
        for field, message in warnings:
            print(f"warning: {field}: {message}", file=sys.stderr)
        print("configuration ok")
        return 0
    if workers < 1:
        log_config_error("invalid configuration:\n  --workers: must be at least 1")
        return 2
    configure_logging(args.log_level or settings.log.level, settings.log.json_logs)
    if args.worker_fd is not None:  # a worker: the supervisor has logged the warnings
        structlog.contextvars.bind_contextvars(pid=os.getpid())  # on every line of this worker
        return serve(args, settings, socket.socket(fileno=args.worker_fd), supervisor=os.getppid())
    for field, message in warnings:
        log.warning("config_warning", field=field, detail=message)
    if workers == 1:
        return serve(args, settings)
    return supervise(argv, args, settings, workers)


def serve(
    args: argparse.Namespace,
    settings: Settings,
    sock: socket.socket | None = None,
    supervisor: int | None = None,
) -> int:
    """One server process: on ``args.host``/``args.port``, or on ``sock`` (a worker's)."""
    from gateway.app import create_app

    app = create_app(settings, reload_from=lambda: load_settings(args.config, host=args.host))
    app.state.url = _url(args.host, args.port)
    app.state.reloader.supervisor = supervisor
    serve_app(app, settings, args.host, args.port, sock, supervisor)
    return 0


def supervise(argv: list[str], args: argparse.Namespace, settings: Settings, workers: int) -> int:
    """The parent of ``workers`` worker processes on one socket (gateway/server/supervisor.py)."""
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        log.error("listen_failed", host=args.host, port=args.port, error=exc.strerror or str(exc))
        return 1
    port = sock.getsockname()[1]
    log.info("supervisor_started", url=_url(args.host, port), workers=workers, pid=os.getpid())
    # as many ports as given: the workers print their own url, so name the real one if it was 0
    command = [sys.executable, "-m", "gateway", *argv, "--port", str(port)]
    # a worker's drain is bounded by ws_drain_seconds, then its cut and uvicorn's grace: beyond
    # this, it is stuck, and killed
    stop_seconds = settings.limits.ws_drain_seconds + 4 * GatewayServer.CUT_SECONDS + 10
    cfg = settings.metrics  # a separate metrics listener is the supervisor's: one port for all workers
    listener = (cfg.host or args.host, cfg.port) if cfg.port is not None else None
    env = {}
    if not settings.compaction.keys:  # one random key for this start's workers (see workers_key)
        env["GATEWAY_COMPACTION__WORKERS_KEY"] = base64.b64encode(os.urandom(32)).decode()
    return Supervisor(
        lambda fd: [*command, "--worker-fd", str(fd)],
        sock,
        workers,
        stop_seconds,
        metrics_listener=listener,
        env=env,
    ).run()


if __name__ == "__main__":
    sys.exit(main())
