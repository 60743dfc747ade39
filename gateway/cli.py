"""``python -m gateway serve [--config FILE] [--host H] [--port P] [--workers N] [--log-level L]``,
``python -m gateway check-config [--config FILE] [--host H]``, ``--version``.

With more than one worker, ``serve`` is the supervisor (gateway/supervisor.py), which runs each
worker as ``serve ... --worker-fd FD``: this same server on the supervisor's socket."""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import signal
import socket
import sys
import threading
from typing import Any

import structlog
import uvicorn

from gateway import __version__
from gateway.api.server_protocol import BoundedReads, bounded_protocol
from gateway.kernel.errors import ServiceUnavailable
from gateway.kernel.settings import ConfigError, Settings, listener_warnings, load_settings
from gateway.logs import configure_logging, log_config_error
from gateway.supervisor import Supervisor, bind

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


def uvicorn_http_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's HTTP/1.1 protocol with the gateway's read bounds (gateway/api/server_protocol.py):
    the request head capped (431), head and body read timeouts (408)."""
    return {"http": bounded_protocol(settings.limits)}


# what a response still generating at the end of the shutdown's drain ends with (its client can
# send it again: another replica, or this one restarted, answers)
_CUT_MESSAGE = "The gateway shut down before this response was finished; send the request again."


class GatewayServer(uvicorn.Server):
    """uvicorn's server, except for shutdown (SIGTERM), which ``drain_seconds`` bounds as a whole:
    it stops accepting and closes idle HTTP connections; WebSockets finish their in-flight turn and
    close with 1001 (plain uvicorn would cut them at once with 1012); HTTP requests in flight (SSE
    streams too) may finish. At the deadline, or on a second Ctrl-C, what is left is cut: turns are
    cancelled (a peer that reads still gets its 1001), then every connection is aborted, so a client
    that does not read holds neither the exit nor the handler behind it."""

    CUT_SECONDS = 0.5  # after the deadline, for close frames; then again for the handlers to end
    GRACE_SECONDS = 1  # uvicorn's own wait after that (timeout_graceful_shutdown): a stuck handler

    def __init__(
        self, config: uvicorn.Config, app: Any, drain_seconds: float, supervisor: int | None = None
    ) -> None:
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
        """Wait for the handlers in flight (HTTP requests, WebSockets) until ``until`` or a second
        Ctrl-C; whether none is left."""
        loop = asyncio.get_running_loop()
        while tasks := self.server_state.tasks:
            left = until - loop.time()
            if left <= 0 or self.force_exit:
                return False
            await asyncio.wait(set(tasks), timeout=min(left, 0.1))  # 0.1: to see a second Ctrl-C
        return True


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
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=GatewayServer.GRACE_SECONDS,
        lifespan="on",
        **uvicorn_http_options(settings),
        **uvicorn_ws_options(settings),
    )
    server = GatewayServer(config, app, settings.limits.ws_drain_seconds, supervisor)
    server.run(sockets=None if sock is None else [sock])
    return 0


def supervise(argv: list[str], args: argparse.Namespace, settings: Settings, workers: int) -> int:
    """The parent of ``workers`` worker processes on one socket (gateway/supervisor.py)."""
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
