"""POST /v1/responses over HTTP: parse, authenticate, prepare the turn, then encode as JSON or SSE.

Served as a plain ASGI handler (``gateway/app.py`` dispatches to it before FastAPI's middleware
stack): it is the hot path, and each SSE event is one ``send``. One DisconnectWatch covers the
whole request after the body is read, so a client that goes away cancels the upstream call at any
point — while waiting for the first token, mid-stream, or while a JSON answer is drained.
"""

from __future__ import annotations

from contextlib import aclosing

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from gateway.api.common import RequestLog, error_response, read_request
from gateway.api.disconnect import DisconnectWatch
from gateway.api.encode import SSE_DONE, json_bytes, sse_frame
from gateway.engine.orchestrator import Gateway, Prepared
from gateway.engine.turn import TurnResult
from gateway.kernel.errors import GatewayError, InvalidRequest
from gateway.kernel.spec.request import CreateResponseBody

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_JSON_HEADERS = [(b"content-type", b"application/json")]


async def create_response(scope: Scope, receive: Receive, send: Send) -> None:
    request = Request(scope, receive)
    gw: Gateway = request.app.state.gateway
    rlog = RequestLog(request, "http")
    headers = {"x-request-id": rlog.request_id}
    try:
        principal, body = await read_request(request, gw, CreateResponseBody, rlog)
        if body.background:
            raise InvalidRequest(
                "Background responses are not supported.", param="background", code="unsupported_parameter"
            )
    except GatewayError as err:
        await _fail(request, rlog, err, headers, scope, receive, send)
        return
    async with DisconnectWatch(receive) as watch:
        prepared: Prepared | None = None
        try:
            prepared = await gw.prepare(
                body, principal, on_done=lambda r: _done(request, rlog, r), streaming=bool(body.stream)
            )
            rlog.fields["provider"] = prepared.route.provider
            rlog.routed = True
            await prepared.turn.open()
        except GatewayError as err:
            if prepared is not None:
                await prepared.turn.close()
            await _fail(request, rlog, err, headers, scope, receive, send)
            return
        except BaseException:
            if prepared is not None:
                await prepared.turn.close()
            raise
        extra = [(b"x-request-id", rlog.request_id.encode())]
        if body.stream:
            await _stream_sse(prepared, extra, send)
        else:
            await _send_json(prepared, extra, send)
    if watch.gone:
        rlog.fields.setdefault("client_gone", True)


async def _stream_sse(prepared: Prepared, extra: list[tuple[bytes, bytes]], send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS + extra})
    async with aclosing(prepared.turn.events()) as events:
        async for event in events:
            await send({"type": "http.response.body", "body": sse_frame(event), "more_body": True})
    await send({"type": "http.response.body", "body": SSE_DONE, "more_body": False})


async def _send_json(prepared: Prepared, extra: list[tuple[bytes, bytes]], send: Send) -> None:
    """Drain the same event stream and answer the final resource (or the error it failed with)."""
    async with aclosing(prepared.turn.events()) as events:
        async for _ in events:
            pass
    err = prepared.turn.result.error
    if err is not None:
        status, payload = err.status, json_bytes(err.http_body())
    else:
        status, payload = 200, json_bytes(prepared.turn.builder.resource)
    await send({"type": "http.response.start", "status": status, "headers": _JSON_HEADERS + extra})
    await send({"type": "http.response.body", "body": payload})


async def _fail(
    request: Request,
    rlog: RequestLog,
    err: GatewayError,
    headers: dict[str, str],
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    rlog.done(request.app.state.metrics, err.status, error_code=err.code)
    await error_response(err, headers)(scope, receive, send)


def _done(request: Request, rlog: RequestLog, result: TurnResult) -> None:
    error_code = result.error.code if result.error else None
    rlog.done(
        request.app.state.metrics,
        result.status,
        result.usage,
        provider=result.provider,
        error_code=error_code,
    )
