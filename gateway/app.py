"""create_app: the ASGI application. The lifespan owns the upstream client pools and the store."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import structlog
from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from compact.opener import Opener
from compact.seal import Sealer
from compact.truncation import fit_context
from gateway.api import compact, http, ops, stored, usage
from gateway.api.common import error_response
from gateway.api.stall import StallWatch
from gateway.api.ws import WebSocketHub, responses_socket
from gateway.engine.orchestrator import Gateway
from gateway.engine.routing import Router
from gateway.kernel.errors import GatewayError, InvalidRequest, NotFound, ServerError
from gateway.kernel.settings import Settings, load_settings
from gateway.metrics import Metrics
from state.factory import create_ledger, create_limiter, create_store

log = structlog.get_logger("gateway.app")


def build_gateway(settings: Settings) -> Gateway:
    store = create_store(settings.state)
    return Gateway(
        settings,
        router=Router(settings),
        store=store,
        ledger=create_ledger(settings.state, store),
        open_compaction=Opener(Sealer.from_settings(settings.compaction)),
        fit_context=fit_context,
        limiter=create_limiter(settings.state),
    )


HOT_PATHS = frozenset({"/v1/responses", "/v1/codex/responses"})


class GatewayApp(FastAPI):
    """FastAPI for every route, except ``POST /v1/responses``: the hot path goes straight to its
    ASGI handler, skipping the middleware stack's per-``send`` wrappers (each SSE event is a send)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and scope["path"] in HOT_PATHS:
            # The Responses WebSocket too: its handler answers every error itself, and its events
            # are written straight to uvicorn's protocol (gateway/api/frames.py) when it is reachable.
            scope["app"] = self
            await responses_socket(WebSocket(scope, receive, send))
            return
        if scope["type"] == "http" and scope["path"] in HOT_PATHS:
            if scope["method"] != "POST":  # (a WebSocket upgrade is a "websocket" scope)
                await method_not_allowed(scope["method"], ("POST",))(scope, receive, send)
                return
            scope["app"] = self
            try:
                await http.create_response(scope, receive, send)
            except Exception:
                log.exception("unhandled_error", path=scope["path"])
                with contextlib.suppress(Exception):  # the response may have started already
                    await error_response(ServerError("The gateway hit an unexpected error."))(
                        scope, receive, send
                    )
            return
        await super().__call__(scope, receive, send)


def method_not_allowed(method: str, allowed: Iterable[str]) -> Response:
    """405 with the ``Allow`` header RFC 9110 requires."""
    err = InvalidRequest(f"Method {method} is not allowed here.", code="method_not_allowed")
    err.status = 405
    return error_response(err, {"allow": ", ".join(allowed)})


def allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """The methods of every route on the request's path (Starlette's 405 names only the first's)."""
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, Route) and route.methods and route.matches(scope)[0] is not Match.NONE:
            methods |= route.methods
    return sorted(methods)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or load_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gateway = build_gateway(settings)
        app.state.gateway = gateway
        app.state.metrics.limiter_errors = lambda: gateway.limits.errors
        log.info(
            "gateway_started",
            url=getattr(app.state, "url", None),  # set by the CLI, which knows where it listens
            auth=gateway.auth.enabled,
            models=gateway.router.model_names(),
            store="redis" if settings.state.redis_url else "memory",
        )
        try:
            yield
        finally:
            await app.state.ws_hub.drain(0)  # normally done already (GatewayServer); cut what is left
            await app.state.stall_watch.aclose()
            await gateway.aclose()

    app = GatewayApp(
        title="Open Responses gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.settings = settings
    app.state.metrics = Metrics()
    app.state.ws_hub = WebSocketHub()
    app.state.stall_watch = StallWatch(settings.limits.client_send_seconds)
    for path in ("/v1/responses", "/v1/codex/responses"):
        app.router.add_websocket_route(path, responses_socket)
    app.add_route("/v1/responses/compact", compact.compact_response, methods=["POST"])
    app.add_route("/v1/responses/{response_id}", stored.get_response, methods=["GET"])
    app.add_route("/v1/responses/{response_id}", stored.delete_response, methods=["DELETE"])
    app.add_route("/v1/responses/{response_id}/input_items", stored.list_input_items, methods=["GET"])
    app.add_route("/v1/models", ops.list_models, methods=["GET"])
    app.add_route("/v1/usage", usage.get_usage, methods=["GET"])
    app.add_route("/healthz", ops.healthz, methods=["GET"])
    app.add_route("/readyz", ops.readyz, methods=["GET"])
    app.add_route("/metrics", ops.metrics, methods=["GET"])

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
