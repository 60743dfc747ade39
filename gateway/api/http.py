"""POST /v1/responses over HTTP: parse, authenticate, prepare the turn, then encode as JSON or SSE."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gateway.api.common import RequestLog, error_response, read_body
from gateway.encode import SSE_DONE, json_bytes, sse_frame
from gateway.errors import GatewayError, InvalidRequest
from gateway.service import Gateway, Prepared
from gateway.spec.request import CreateResponseBody
from gateway.turn import TurnResult
from gateway.validate import parse_json, parse_model

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def create_response(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    rlog = RequestLog(request, "http")
    headers = {"x-request-id": rlog.request_id}
    prepared: Prepared | None = None
    try:
        principal = gw.auth.authenticate(request.headers.get("authorization"))
        rlog.fields["tenant"] = principal.tenant
        raw = await read_body(request, gw.settings.limits.max_body_bytes)
        body = parse_model(CreateResponseBody, parse_json(raw))
        rlog.fields["model"] = body.model
        if body.background:
            raise InvalidRequest(
                "Background responses are not supported.", param="background", code="unsupported_parameter"
            )
        prepared = await gw.prepare(body, principal, on_done=lambda r: _done(request, rlog, r))
        rlog.fields["provider"] = prepared.route.provider
        await prepared.turn.open()
    except GatewayError as err:
        if prepared is not None:
            await prepared.turn.close()
        rlog.emit(err.status, error_code=err.code)
        _observe(request, rlog, str(err.status), None)
        return error_response(err, headers)
    if body.stream:
        return StreamingResponse(
            _sse(prepared), media_type="text/event-stream", headers={**SSE_HEADERS, **headers}
        )
    return await _json(request, prepared, headers)


async def _sse(prepared: Prepared) -> AsyncIterator[bytes]:
    async for event in prepared.turn.events():
        yield sse_frame(event)
    yield SSE_DONE


async def _json(request: Request, prepared: Prepared, headers: dict[str, str]) -> Response:
    """Drain the same event stream; a client that goes away cancels the upstream call."""
    drain = asyncio.ensure_future(_drain(prepared))
    gone = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait((drain, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not drain.done():
            drain.cancel()
        gone.cancel()
    if not drain.done() or drain.cancelled():
        await asyncio.gather(drain, return_exceptions=True)
        return Response(status_code=499)
    resource = drain.result()
    err = prepared.turn.result.error
    if err is not None:
        return error_response(err, headers)
    return Response(json_bytes(resource), media_type="application/json", headers=headers)


async def _drain(prepared: Prepared) -> dict[str, Any]:
    async for _ in prepared.turn.events():
        pass
    return prepared.turn.builder.resource


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _done(request: Request, rlog: RequestLog, result: TurnResult) -> None:
    usage = result.usage or {}
    rlog.emit(
        result.status,
        provider=result.provider,
        input_tokens=usage.get("input_tokens"),
        output_tokens=usage.get("output_tokens"),
        error_code=result.error.code if result.error else None,
    )
    _observe(request, rlog, result.status, result.usage)


def _observe(request: Request, rlog: RequestLog, status: str, usage: dict[str, Any] | None) -> None:
    request.app.state.metrics.observe(
        rlog.fields["transport"], str(rlog.fields.get("model") or "-"), status, rlog.elapsed(), usage
    )
