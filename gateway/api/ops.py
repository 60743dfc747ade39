"""Operations routes: liveness, readiness, metrics, and the model list a key may use."""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import Response

from gateway.api.exchange import error_response, json_response
from gateway.engine.auth import Admin
from gateway.engine.orchestrator import Gateway
from gateway.kernel.errors import GatewayError, NotFound, PermissionDenied
from gateway.observability.observer import CONTENT_TYPE, Metrics


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request, gw: Gateway) -> Response:
    """503 only while this process cannot take new work (it is draining for shutdown). A state store
    that does not answer leaves it ready but "degraded": store: false and WebSocket turns still
    serve, and every replica shares that store, so failing readiness would take them all out."""
    if request.app.state.ws_hub.draining:
        return json_response({"status": "draining", "checks": {}}, 503)
    store_ok = await gw.store.ping()
    body = {"status": "ok" if store_ok else "degraded", "checks": {"state_store": store_ok}}
    return json_response(body, 200)


async def metrics(request: Request, gw: Gateway) -> Response:
    """Prometheus text. Not here when ``metrics.port`` gives it a listener of its own (404); with
    client keys configured, only for an admin key (``admin.api_keys``)."""
    m: Metrics = request.app.state.metrics
    try:
        if gw.settings.metrics.port is not None:
            raise NotFound(f"No route for {request.method} {request.url.path}.")
        if gw.auth.enabled and not isinstance(gw.auth.identify(request.headers.get("authorization")), Admin):
            raise PermissionDenied("Only an admin key (admin.api_keys) may read /metrics.")
    except GatewayError as err:
        return error_response(err)
    # the multiprocess view reads every worker's files: off the event loop
    body = await asyncio.to_thread(m.render) if m.multiprocess else m.render()
    return Response(body, media_type=CONTENT_TYPE)


async def list_models(request: Request, gw: Gateway) -> Response:
    try:
        principal = gw.auth.authenticate(request.headers.get("authorization"))
    except GatewayError as err:
        return error_response(err)
    created = int(time.time())
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": gw.router.routes[name].owner}
        for name in gw.router.model_names(principal.models)
    ]
    return json_response({"object": "list", "data": data})
