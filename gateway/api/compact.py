"""POST /v1/responses/compact: parse, authenticate, compact (compact/service.py), answer JSON."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from compact.service import Compactor
from gateway.api.common import RequestLog, error_response, read_body
from gateway.encode import json_bytes
from gateway.errors import GatewayError
from gateway.service import Gateway
from gateway.spec.request import CompactRequestBody
from gateway.validate import parse_json, parse_model


async def compact_response(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    rlog = RequestLog(request, "compact")
    headers = {"x-request-id": rlog.request_id}
    try:
        principal = gw.auth.authenticate(request.headers.get("authorization"))
        rlog.fields["tenant"] = principal.tenant
        raw = await read_body(request, gw.settings.limits.max_body_bytes)
        limits = gw.settings.limits
        body = parse_model(CompactRequestBody, parse_json(raw), max_elements=limits.max_input_elements)
        rlog.fields["model"] = body.model
        result = await Compactor(gw).compact(body, principal)
    except GatewayError as err:
        rlog.emit(err.status, error_code=err.code)
        _observe(request, rlog, str(err.status), None)
        return error_response(err, headers)
    usage = result["usage"]
    rlog.routed = True
    rlog.emit(200, input_tokens=usage["input_tokens"], output_tokens=usage["output_tokens"])
    _observe(request, rlog, "completed", usage)
    return Response(json_bytes(result), media_type="application/json", headers=headers)


def _observe(request: Request, rlog: RequestLog, status: str, usage: dict[str, int] | None) -> None:
    request.app.state.metrics.observe("compact", rlog.metric_model(), status, rlog.elapsed(), usage)
