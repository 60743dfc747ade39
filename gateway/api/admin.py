"""``POST /admin/reload`` (an admin key, ``admin.api_keys``): re-read and apply the config, as SIGHUP
does; 200 with what changed, or 400 with the problems (the old config stays in force)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway.api.encode import json_bytes
from gateway.api.exchange import RequestLog, error_response, json_response
from gateway.api.reload import Reloader
from gateway.engine.auth import Admin, Authenticator
from gateway.engine.orchestrator import Gateway
from gateway.kernel.errors import (
    AuthenticationFailed,
    ErrorCode,
    GatewayError,
    InvalidRequest,
    PermissionDenied,
    ServiceUnavailable,
)


def require_admin(auth: Authenticator, authorization: str | None) -> Admin:
    """The admin key of ``authorization``: 401 without a known key, 403 for a client key."""
    if not authorization:
        raise AuthenticationFailed("Missing admin key: send 'Authorization: Bearer <admin key>'.")
    found = auth.identify(authorization)
    if isinstance(found, Admin):
        return found
    if found is auth.anonymous:  # without client keys, an unknown key identifies as the default tenant
        raise AuthenticationFailed("Invalid API key.")
    raise PermissionDenied("Reloading the configuration needs an admin key (admin.api_keys).")


async def reload_config(request: Request, gw: Gateway) -> Response:
    rlog = RequestLog(request, "admin")
    try:
        admin = require_admin(gw.auth, request.headers.get("authorization"))
    except GatewayError as err:
        rlog.emit(err.status, error_code=err.code, path="/admin/reload")
        return error_response(err)
    reloader: Reloader = request.app.state.reloader
    outcome = await reloader.request()
    rlog.emit(outcome.status, path="/admin/reload", admin=admin.name, accepted=outcome.accepted)
    if outcome.accepted:
        return json_response(outcome.body())
    problems = outcome.problems or "The configuration was not applied."
    refusal: GatewayError
    if outcome.status == 400:
        refusal = InvalidRequest(problems, code=ErrorCode.INVALID_CONFIG)
    elif outcome.status == 503:
        refusal = ServiceUnavailable(problems)
    else:
        refusal = GatewayError(problems)
    body = {**refusal.http_body(), **outcome.body()}
    # one entry per problem, each naming its field (the lines check-config prints)
    body["problems"] = [ln.strip() for ln in problems.splitlines()[1:] if ln.strip()] or [problems]
    return Response(json_bytes(body), status_code=outcome.status, media_type="application/json")
