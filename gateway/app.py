"""create_app: the ASGI application. The lifespan owns the upstream client pools and the store."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import structlog
from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from adapters.mcp import McpHost
from compact.inline import compact_inline
from compact.opener import Opener
from compact.seal import Sealer
from compact.truncation import fit_context
from gateway.api import admin, background, compact, console, http, keys, ops, stored, usage
from gateway.api.chat import http as chat_http
from gateway.api.encode import sse_frame
from gateway.api.exchange import error_response
from gateway.api.inflight import InFlight
from gateway.api.live import LiveGateway, holding
from gateway.api.messages import http as messages
from gateway.api.reload import Reloader
from gateway.api.stall import StallWatch
from gateway.api.ws import WebSocketHub, responses_socket
from gateway.engine.background import BackgroundRuns
from gateway.engine.context import CompactionOpener
from gateway.engine.orchestrator import Gateway
from gateway.engine.routing import Router
from gateway.engine.telemetry import NOOP_OBSERVER, NOOP_TRACER, Observer, Tracer
from gateway.engine.vkeys import VirtualKeys
from gateway.kernel.errors import ErrorCode, GatewayError, InvalidRequest, NotFound, ServerError
from gateway.kernel.settings import Settings, load_settings
from gateway.observability import tracing
from gateway.observability.observer import Metrics
from state.factory import (
    create_background_log,
    create_key_store,
    create_ledger,
    create_limiter,
    create_store,
)

log = structlog.get_logger("gateway.app")


def build_gateway(
    settings: Settings,
    running: Gateway | None = None,
    observer: Observer = NOOP_OBSERVER,
    tracer: Tracer = NOOP_TRACER,
) -> Gateway:
    """The gateway of ``settings``. On a reload (``running``: the gateway in service) the store, the
    usage ledger, the limiter, the metrics and the tracer are the running ones (``state``,
    ``metrics`` and ``tracing`` change only at a restart: a new in-process store would start empty),
    and so is the compaction key ring while ``compaction.keys`` is unchanged (an empty list means a
    random per-process key)."""
    if running is None:
        store = create_store(settings.state)
        ledger, limiter = create_ledger(settings.state, store), create_limiter(settings.state)
        background_log = create_background_log(settings.state, store)
        virtual_keys: VirtualKeys | None = VirtualKeys(create_key_store(settings.state, store))
    else:
        store, ledger, limiter = running.raw_store, running.meter.ledger, running.limits.limiter
        background_log = running.background_log
        virtual_keys = running.virtual_keys
        observer, tracer = running.observer, running.tracer
    opener: CompactionOpener | None = None
    if running is not None and settings.compaction.keys == running.settings.compaction.keys:
        opener = running.open_compaction
    if opener is None:
        opener = Opener(Sealer.from_settings(settings.compaction))
    return Gateway(
        settings,
        router=Router(settings),
        store=store,
        ledger=ledger,
        open_compaction=opener,
        fit_context=fit_context,
        compact_context=compact_inline,
        limiter=limiter,
        background_log=background_log,
        observer=observer,
        tracer=tracer,
        mcp=McpHost(settings.mcp, settings.tenants),
        virtual_keys=virtual_keys,
    )


async def retire_gateway(gw: Gateway) -> None:
    """A gateway a reload replaced, once nothing holds it: its upstream clients (the store, ledger
    and limiter live on in its successor)."""
    await gw.router.aclose()


Ingress = Callable[[Scope, Receive, Send, Gateway], Awaitable[None]]
HOT_PATHS = frozenset({"/v1/responses", "/v1/codex/responses"})
# the other client APIs' ingresses (POST only), plain ASGI handlers dispatched as the hot path is
INGRESSES: dict[str, Ingress] = {
    chat_http.PATH: chat_http.create_chat_completion,
    "/v1/messages": messages.create_message,
    "/v1/messages/count_tokens": messages.count_tokens,
}
UNTRACED = frozenset({"/healthz", "/readyz", "/metrics"})  # probes and scrapes: no span each


class GatewayApp(FastAPI):
    """FastAPI for every route, except ``POST /v1/responses``: the hot path goes straight to its
    ASGI handler, skipping the middleware stack's per-``send`` wrappers (each SSE event is a send)."""

    fixed_paths: dict[str, list[str]]  # set by create_app once the routes are in (``fixed_paths``)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # a WebSocket holds the live gateway per turn (gateway/api/ws.py)
            if scope["type"] == "websocket" and scope["path"] in HOT_PATHS:
                # The Responses WebSocket too: its handler answers every error itself, and its events
                # are written straight to uvicorn's protocol (gateway/api/frames.py) when reachable.
                scope["app"] = self
                await responses_socket(WebSocket(scope, receive, send))
                return
            await super().__call__(scope, receive, send)
            return
        if scope["path"] in HOT_PATHS:
            await self._responses(scope, receive, send)
            return
        ingress = INGRESSES.get(scope["path"])
        if ingress is not None:
            await self._held(ingress, scope, receive, send)
            return
        allowed = self.fixed_paths.get(scope["path"])
        if allowed is not None and scope["method"] not in allowed:
            await method_not_allowed(scope["method"], allowed)(scope, receive, send)
            return
        tracer: Tracer = getattr(self.state, "tracer", NOOP_TRACER)
        if tracer.enabled and scope["type"] == "http" and scope["path"] not in UNTRACED:
            await traced_route(self, tracer, scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def _responses(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/responses``. A request runs to its end on the gateway current when it arrived
        (a reload may swap it): held here, and handed to the handler (every other route's handler
        gets its own the same way, ``holding``)."""
        await self._held(http.create_response, scope, receive, send)

    async def _held(self, handler: Ingress, scope: Scope, receive: Receive, send: Send) -> None:
        """``handler`` (a POST route that streams) run on the gateway current when it arrived."""
        if scope["method"] != "POST":  # (a WebSocket upgrade is a "websocket" scope)
            await method_not_allowed(scope["method"], ("POST",))(scope, receive, send)
            return
        scope["app"] = self
        live: LiveGateway = self.state.live
        with live.hold() as gw:
            try:
                await handler(scope, receive, send, gw)
            except Exception:
                log.exception("unhandled_error", path=scope["path"])
                with contextlib.suppress(Exception):  # the response may have started already
                    await error_response(ServerError("The gateway hit an unexpected error."))(
                        scope, receive, send
                    )


async def traced_route(app: FastAPI, tracer: Tracer, scope: Scope, receive: Receive, send: Send) -> None:
    """A route other than the hot path (compaction has its own span) with tracing on: one server
    span named by its route template (``GET /v1/responses/{response_id}``), never the raw path."""
    name = next(
        (r.path for r in app.router.routes if isinstance(r, Route) and r.matches(scope)[0] is Match.FULL),
        None,
    )
    if name == "/v1/responses/compact":
        await FastAPI.__call__(app, scope, receive, send)
        return
    method = scope["method"]
    attrs = {"http.request.method": method, "http.route": name}
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())}
    with tracer.server(f"{method} {name or 'unmatched'}", headers, attrs) as span:

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = int(message["status"])
                span.set("http.response.status_code", status)
                if status >= 500:
                    span.fail(str(status))
            await send(message)

        await FastAPI.__call__(app, scope, receive, sending)


def method_not_allowed(method: str, allowed: Iterable[str]) -> Response:
    """405 with the ``Allow`` header RFC 9110 requires."""
    err = InvalidRequest(f"Method {method} is not allowed here.", code=ErrorCode.METHOD_NOT_ALLOWED)
    return error_response(err, {"allow": ", ".join(allowed)})


def fixed_paths(app: FastAPI) -> dict[str, list[str]]:
    """The methods of each route path without parameters (``/v1/responses/compact``). Such a path
    is its routes' whatever the method: another method is refused 405, never handed to a route with
    a parameter that matches it too (``GET /v1/responses/{response_id}`` with the id "compact")."""
    methods: dict[str, set[str]] = {}
    for route in app.router.routes:
        if isinstance(route, Route) and route.methods and not route.param_convertors:
            methods.setdefault(route.path, set()).update(route.methods)
    return {path: sorted(allowed) for path, allowed in methods.items()}


def allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """The methods of every route on the request's path (Starlette's 405 names only the first's)."""
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, Route) and route.methods and route.matches(scope)[0] is not Match.NONE:
            methods |= route.methods
    return sorted(methods)


def _listener_host(app: FastAPI) -> str | None:
    """The public listener's host, from the URL the CLI records (None: not started by the CLI)."""
    url = getattr(app.state, "url", None)
    return urlsplit(url).hostname if url else None


def create_app(
    settings: Settings | None = None, reload_from: Callable[[], Settings] | None = None
) -> FastAPI:
    """``reload_from``: reads and validates the config again (SIGHUP, ``POST /admin/reload``); None:
    this app cannot reload (it was given its settings)."""
    settings = settings or load_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        metrics: Metrics = app.state.metrics
        gateway = build_gateway(settings, observer=metrics, tracer=app.state.tracer)
        app.state.gateway = gateway
        if gateway.virtual_keys is not None:
            await gateway.virtual_keys.start()
        runs = app.state.background = BackgroundRuns(gateway.background_log, gateway.store, sse_frame)
        runs.start_watch(lambda: app.state.live.current.tenants())
        app.state.live = LiveGateway(gateway, retire_gateway)
        await metrics.start(_listener_host(app))
        log.info(
            "gateway_started",
            url=getattr(app.state, "url", None),  # set by the CLI, which knows where it listens
            auth=gateway.auth.enabled,
            models=gateway.router.model_names(),
            store=f"redis ({settings.state.redis_mode})" if settings.state.redis_url else "memory",
            tracing=gateway.tracer.enabled,
        )
        try:
            yield
        finally:
            await app.state.ws_hub.drain(0)  # normally done already (GatewayServer); cut what is left
            await runs.aclose()
            await app.state.stall_watch.aclose()
            await app.state.live.aclose()  # the gateways a reload replaced
            await app.state.live.current.aclose()
            await metrics.stop()
            await tracing.aclose(gateway.tracer)

    app = GatewayApp(
        title="Open Responses gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.settings = settings
    app.state.reloader = Reloader(app.state, reload_from, build_gateway)
    app.state.metrics = Metrics(settings)
    app.state.tracer = tracing.from_settings(settings)  # a test may put its own before the start
    app.state.ws_hub = WebSocketHub()
    app.state.inflight = InFlight()  # the turns a shutdown's deadline ends (gateway/api/inflight.py)
    app.state.stall_watch = StallWatch(settings.limits.client_send_seconds)
    for path in ("/v1/responses", "/v1/codex/responses"):
        app.router.add_websocket_route(path, responses_socket)
    # a handler given a gateway gets the one current when its request arrived, held until it answers
    app.add_route("/v1/responses/compact", holding(compact.compact_response), methods=["POST"])
    app.add_route("/v1/responses/{response_id}", holding(stored.get_response), methods=["GET"])
    app.add_route("/v1/responses/{response_id}", holding(stored.delete_response), methods=["DELETE"])
    app.add_route(
        "/v1/responses/{response_id}/input_items", holding(stored.list_input_items), methods=["GET"]
    )
    app.add_route("/v1/responses/{response_id}/cancel", holding(background.cancel_response), methods=["POST"])
    app.add_route("/v1/models", holding(ops.list_models), methods=["GET"])
    app.add_route("/v1/usage", holding(usage.get_usage), methods=["GET"])
    app.add_route("/healthz", ops.healthz, methods=["GET"])
    app.add_route("/readyz", holding(ops.readyz), methods=["GET"])
    app.add_route("/metrics", holding(ops.metrics), methods=["GET"])
    app.add_route("/admin/reload", holding(admin.reload_config), methods=["POST"])
    app.add_route("/admin/keys", holding(keys.create_key), methods=["POST"])
    app.add_route("/admin/keys", holding(keys.list_keys), methods=["GET"])
    app.add_route("/admin/keys/{key_id}", holding(keys.get_key), methods=["GET"])
    app.add_route("/admin/keys/{key_id}", holding(keys.update_key), methods=["PATCH"])
    app.add_route("/admin/keys/{key_id}", holding(keys.delete_key), methods=["DELETE"])
    app.add_route("/admin/keys/{key_id}/rotate", holding(keys.rotate_key), methods=["POST"])
    app.add_route("/console", holding(console.console_page), methods=["GET"])
    app.add_route("/console/login", holding(console.login), methods=["POST"])
    app.add_route("/console/logout", holding(console.logout), methods=["POST"])
    app.add_route("/console/api/usage", holding(console.console_usage), methods=["GET"])
    app.add_route("/console/api/overview", holding(console.console_overview), methods=["GET"])
    app.add_route("/console/static/{name}", console.asset, methods=["GET"])
    app.fixed_paths = fixed_paths(app)

    async def http_exception(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return error_response(NotFound(f"No route for {request.method} {request.url.path}."))
        if exc.status_code == 405:
            return method_not_allowed(request.method, allowed_methods(app, request.scope))
        err = GatewayError(str(exc.detail))
        err.status = exc.status_code
        return error_response(err)

    async def unhandled(request: Request, exc: Exception) -> Response:
        log.exception("unhandled_error", path=request.url.path)
        return error_response(ServerError("The gateway hit an unexpected error."))

    app.add_exception_handler(HTTPException, http_exception)
    app.add_exception_handler(Exception, unhandled)
    return app
