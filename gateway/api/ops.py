"""Operations routes: liveness, readiness, metrics, and the model list a key may use."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from gateway.api.common import error_response, json_response
from gateway.engine.orchestrator import Gateway
from gateway.kernel.errors import GatewayError


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request) -> Response:
    """503 only while this process cannot take new work (it is draining for shutdown). A state store
    that does not answer leaves it ready but "degraded": store: false and WebSocket turns still
    serve, and every replica shares that store, so failing readiness would take them all out."""
    gw: Gateway = request.app.state.gateway
    if request.app.state.ws_hub.draining:
        return json_response({"status": "draining", "checks": {}}, 503)
    store_ok = await gw.store.ping()
    body = {"status": "ok" if store_ok else "degraded", "checks": {"state_store": store_ok}}
    return json_response(body, 200)


async def metrics(request: Request) -> Response:
    return PlainTextResponse(request.app.state.metrics.render(), media_type="text/plain; version=0.0.4")


async def list_models(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
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
