"""POST /v1/chat/completions: authenticate, validate (gateway/engine/validate.py ``chat_request``),
build the engine's request (request.py), prepare and run the one turn, encode its events as
``chat.completion.chunk`` SSE frames or one ``chat.completion`` (encode.py).

A plain ASGI handler like ``POST /v1/responses`` (gateway/api/http.py), with the same disconnect
and stall watches; stateless: never stored, no chain, no background, no WebSocket.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from gateway.api import background
from gateway.api.chat.encode import ChatChunks, completion
from gateway.api.chat.request import engine_request, native_fields
from gateway.api.disconnect import DisconnectWatch
from gateway.api.encode import SSE_DONE, json_bytes
from gateway.api.exchange import RequestLog, error_response, rate_limit_headers, read_body
from gateway.api.frames import BodyWriter
from gateway.api.inflight import InFlight
from gateway.api.stall import StallWatch
from gateway.engine.orchestrator import Gateway
from gateway.engine.turn import Turn
from gateway.engine.validate import chat_request, parse_json
from gateway.kernel.client_api import ClientApi
from gateway.kernel.errors import GatewayError

__all__ = ["PATH", "create_chat_completion"]

PATH = "/v1/chat/completions"
_JSON_HEADERS = [(b"content-type", b"application/json")]
_SPAN_ATTRS = {"gen_ai.operation.name": "chat", "http.request.method": "POST", "gateway.transport": "http"}


async def create_chat_completion(scope: Scope, receive: Receive, send: Send, gw: Gateway) -> None:
    """``gw``: the gateway the request runs on, held for it by the app (gateway/app.py)."""
    request = Request(scope, receive)
    rlog = RequestLog(request, "http", api=ClientApi.CHAT)
    with rlog.traced(gw.tracer, f"POST {PATH}", request.headers, _SPAN_ATTRS):
        await _respond(request, gw, rlog, scope, receive, send)


async def _respond(
    request: Request, gw: Gateway, rlog: RequestLog, scope: Scope, receive: Receive, send: Send
) -> None:
    metrics = request.app.state.metrics
    headers = {"x-request-id": rlog.request_id}
    try:
        principal = gw.auth.authenticate(request.headers.get("authorization"))
        rlog.fields["tenant"] = principal.tenant
        rlog.span.set("gateway.api_key.name", principal.key_name)
        limits = gw.settings.limits
        sent = await read_body(request, limits.max_body_bytes)
        raw = parse_json(sent)
        chat = chat_request(raw, limits, sent=sent)
        rlog.fields["model"] = chat.get("model")
        body = engine_request(chat)
    except GatewayError as err:
        rlog.refused(metrics, err)
        await error_response(err, headers)(scope, receive, send)
        return
    streaming = chat.get("stream") is True
    options = chat.get("stream_options")
    include_usage = bool(options and options.get("include_usage"))
    async with DisconnectWatch(receive, send) as watch:
        try:
            turn = await gw.prepare(
                body, principal, streaming=streaming, error_event=False, request_id=rlog.request_id
            )
        except GatewayError as err:
            rlog.refused(metrics, err)
            await error_response(err, headers)(scope, receive, send)
            return
        turn.request.native = native_fields(raw)
        rlog.routed_to(turn)
        turn.on_end(lambda result: rlog.turn_ended(metrics, result))
        extra = [(b"x-request-id", rlog.request_id.encode())]
        rate_headers = rate_limit_headers(turn.rate_standing)
        if rate_headers:
            headers.update(rate_headers)
            extra += [(k.encode(), v.encode()) for k, v in rate_headers.items()]
        inflight: InFlight = request.app.state.inflight
        inflight.add(turn, principal.tenant)
        try:
            if streaming:
                stalls: StallWatch = request.app.state.stall_watch
                stalls.add(watch)
                try:
                    await _stream_sse(turn, extra, send, watch, ChatChunks(include_usage=include_usage))
                finally:
                    stalls.discard(watch)
            else:
                await _send_json(turn, extra, send)
        except GatewayError as err:  # before the first event: an ordinary error response
            await error_response(err, headers)(scope, receive, send)
        finally:
            inflight.discard(turn)
    if watch.gone:
        rlog.fields.setdefault("client_gone", True)


async def _stream_sse(
    turn: Turn, extra: list[tuple[bytes, bytes]], send: Send, watch: DisconnectWatch, chunks: ChatChunks
) -> None:
    """Chat Completions' stream: unnamed ``data:`` frames, then ``data: [DONE]``."""
    writer: BodyWriter | None = None

    async def opened() -> None:
        nonlocal writer
        await send({"type": "http.response.start", "status": 200, "headers": background.SSE_HEADERS + extra})
        writer = BodyWriter(send, watch)

    async def emit(event: dict[str, Any]) -> None:
        assert writer is not None  # opened() ran first
        data = chunks.frames(event)
        if data:
            await writer.send(data)

    await turn.run(emit, opened=opened)
    assert writer is not None
    await writer.end(SSE_DONE)


async def _send_json(turn: Turn, extra: list[tuple[bytes, bytes]], send: Send) -> None:
    """The same turn drained: its ``chat.completion``, or its error in OpenAI's shape."""
    result = await turn.run()
    err = result.error
    if err is not None:
        status, payload = err.status, json_bytes(err.http_body())
    else:
        status, payload = 200, json_bytes(completion(result.resource))
    await send({"type": "http.response.start", "status": status, "headers": _JSON_HEADERS + extra})
    await send({"type": "http.response.body", "body": payload})
