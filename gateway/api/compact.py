"""POST /v1/responses/compact: parse, authenticate, compact (compact/service.py), answer JSON."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from compact.service import Compactor
from gateway.api.encode import json_bytes
from gateway.api.exchange import RequestLog, error_response, rate_limit_headers, read_request
from gateway.engine.orchestrator import Gateway
from gateway.engine.validate import compact_request
from gateway.kernel.errors import GatewayError
from gateway.observability.observer import Metrics

_SPAN_ATTRS = {
    "gen_ai.operation.name": "compact",
    "http.request.method": "POST",
    "gateway.transport": "compact",
}


async def compact_response(request: Request, gw: Gateway) -> Response:
    rlog = RequestLog(request, "compact")
    # the compaction's span; its summarizing call's upstream attempts are its children
    with rlog.traced(gw.tracer, "POST /v1/responses/compact", request.headers, _SPAN_ATTRS):
        return await _compact(request, gw, rlog)


async def _compact(request: Request, gw: Gateway, rlog: RequestLog) -> Response:
    headers = {"x-request-id": rlog.request_id}
    metrics: Metrics = request.app.state.metrics
    try:
        principal, body = await read_request(request, gw, compact_request, rlog)
        # counted against the limits first, even when there turns out to be nothing to summarize
        held = await gw.admit(principal, gw.route(body.model, principal))
        if held is not None:
            headers.update(rate_limit_headers(held.standing))
        try:
            result = await Compactor(gw).compact(body, principal, request_id=rlog.request_id)
        finally:
            if held is not None:
                await gw.limits.settle_soon(held, 0)
    except GatewayError as err:
        rlog.refused(metrics, err)
        return error_response(err, headers)
    rlog.routed = True
    metrics.compaction("compact")
    rlog.span.update({"gen_ai.response.id": result.get("id"), "gen_ai.response.model": body.model})
    rlog.done(metrics, "completed", result["usage"])
    return Response(json_bytes(result), media_type="application/json", headers=headers)
