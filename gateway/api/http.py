"""POST /v1/responses over HTTP: parse, authenticate, prepare the turn, run it, encode as JSON or SSE.

Served as a plain ASGI handler (``gateway/app.py`` dispatches to it before FastAPI's middleware
stack): it is the hot path, and each SSE event is one ``send``. One DisconnectWatch covers the
whole request after the body is read, so a client that goes away cancels the upstream call at any
point — while waiting for the first token, mid-stream, or while a JSON answer is drained.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from gateway.api import background
from gateway.api.disconnect import DisconnectWatch
from gateway.api.encode import SSE_DONE, json_bytes, sse_frame
from gateway.api.exchange import RequestLog, error_response, rate_limit_headers, read_request
from gateway.api.frames import BodyWriter
from gateway.api.inflight import InFlight
from gateway.api.stall import StallWatch
from gateway.engine.orchestrator import Gateway
from gateway.engine.turn import Turn
from gateway.engine.usage import Meter
from gateway.engine.validate import create_request
from gateway.kernel import pricing
from gateway.kernel.errors import GatewayError

_SSE_HEADERS = background.SSE_HEADERS
_JSON_HEADERS = [(b"content-type", b"application/json")]
_SPAN_ATTRS = {"gen_ai.operation.name": "chat", "http.request.method": "POST", "gateway.transport": "http"}


async def create_response(scope: Scope, receive: Receive, send: Send, gw: Gateway) -> None:
    """``gw``: the gateway the request runs on, held for it by the app (gateway/app.py)."""
    request = Request(scope, receive)
    rlog = RequestLog(request, "http")
    with rlog.traced(gw.tracer, f"POST {scope['path']}", request.headers, _SPAN_ATTRS):
        await _respond(request, gw, rlog, scope, receive, send)


async def _respond(
    request: Request, gw: Gateway, rlog: RequestLog, scope: Scope, receive: Receive, send: Send
) -> None:
    metrics = request.app.state.metrics
    headers = {"x-request-id": rlog.request_id}
    try:
        principal, body = await read_request(request, gw, create_request, rlog)
        behind = background.admissible(request, gw, principal.tenant) if body.background else False
    except GatewayError as err:
        rlog.refused(metrics, err)
        await error_response(err, headers)(scope, receive, send)
        return
    async with DisconnectWatch(receive, send) as watch:
        try:
            streaming = bool(body.stream or body.background)  # a background turn logs its events live
            turn = await gw.prepare(
                body, principal, streaming=streaming, request_id=rlog.request_id, behind=behind
            )
        except GatewayError as err:
            rlog.refused(metrics, err)
            await error_response(err, headers)(scope, receive, send)
            return
        rlog.routed_to(turn)
        turn.on_end(lambda result: rlog.turn_ended(metrics, result))
        extra = [(b"x-request-id", rlog.request_id.encode())]
        rate_headers = rate_limit_headers(turn.rate_standing)
        if rate_headers:
            headers.update(rate_headers)
            extra += [(k.encode(), v.encode()) for k, v in rate_headers.items()]
        if body.background:  # detached: neither the client leaving nor this task ends it
            await background.start(request, gw, turn, principal, extra, send, watch, stream=bool(body.stream))
            return
        inflight: InFlight = request.app.state.inflight
        inflight.add(turn, principal.tenant)
        try:
            if body.stream:
                stalls: StallWatch = request.app.state.stall_watch
                stalls.add(watch)
                try:
                    await _stream_sse(turn, extra, send, watch)
                finally:
                    stalls.discard(watch)
            else:
                # sent once the upstream call is over: a client that does not read it pins nothing
                cost = gw.meter if gw.shows_cost(principal.tenant) else None
                await _send_json(turn, extra, send, cost)
        except GatewayError as err:  # before the first event: an ordinary error response
            await error_response(err, headers)(scope, receive, send)
        finally:
            inflight.discard(turn)
    if watch.gone:
        rlog.fields.setdefault("client_gone", True)


async def _stream_sse(
    turn: Turn, extra: list[tuple[bytes, bytes]], send: Send, watch: DisconnectWatch
) -> None:
    """Each send that waits is stamped for the StallWatch (``watch.since``). The frames of events
    that are ready together leave in one write (gateway/api/frames.py ``BodyWriter``)."""
    writer: BodyWriter | None = None

    async def opened() -> None:
        nonlocal writer
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS + extra})
        writer = BodyWriter(send, watch)

    async def emit(event: dict[str, Any]) -> None:
        assert writer is not None  # opened() ran first
        await writer.send(sse_frame(event))

    await turn.run(emit, opened=opened)
    assert writer is not None
    await writer.end(SSE_DONE)


async def _send_json(
    turn: Turn, extra: list[tuple[bytes, bytes]], send: Send, cost: Meter | None = None
) -> None:
    """Run the same turn without relaying events; answer the final resource (or its error).
    ``cost``: the tenant shows its turns' cost (``tenants.<name>.cost_header``): the answer
    carries ``x-gateway-cost``, the ledger's figure for this turn in the configured currency."""
    result = await turn.run()
    err = result.error
    if err is not None:
        status, payload = err.status, json_bytes(err.http_body())
    else:
        status, payload = 200, json_bytes(result.resource)
    if cost is not None:
        extra = [*extra, (b"x-gateway-cost", pricing.text(cost.cost(result.route.model, result)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": _JSON_HEADERS + extra})
    await send({"type": "http.response.body", "body": payload})
