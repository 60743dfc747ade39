"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API on the one
engine. Authenticate (``x-api-key`` or ``Authorization: Bearer``), read the capped body, parse it into
the engine's request (gateway/api/messages/parse.py), prepare and run the turn as ``/v1/responses``
does, and encode the builder's events as a ``Message`` or Messages' event stream (encode.py). Every
error answers in Anthropic's shape. ``anthropic-version`` and ``anthropic-beta`` are accepted (the
answer is the same for every version).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from gateway.api.background import SSE_HEADERS
from gateway.api.disconnect import DisconnectWatch
from gateway.api.exchange import RequestLog, rate_limit_headers, read_body
from gateway.api.frames import BodyWriter
from gateway.api.inflight import InFlight
from gateway.api.messages.encode import MessageStream, error_body, error_status, message_of
from gateway.api.messages.parse import engine_request, input_items, parse_count, parse_messages, system_text
from gateway.api.stall import StallWatch
from gateway.engine.auth import Principal
from gateway.engine.orchestrator import Gateway
from gateway.engine.turn import Turn
from gateway.engine.validate import parse_json
from gateway.kernel.client_api import ClientApi
from gateway.kernel.errors import GatewayError, RateLimited
from gateway.kernel.estimate import estimate, estimate_bytes, estimate_text
from gateway.kernel.items import normalize

_JSON = (b"content-type", b"application/json")
_SPAN_ATTRS = {"gen_ai.operation.name": "chat", "http.request.method": "POST", "gateway.transport": "http"}


class _ClientHeaders:
    """The request headers this ingress reads, found in one pass over the ASGI list (the server
    gives their names in lower case); of a header sent twice, the first, as Starlette's ``get``."""

    __slots__ = ("api_key", "authorization", "beta")

    def __init__(self, scope: Scope) -> None:
        self.authorization: str | None = None
        self.api_key: str | None = None
        self.beta: str | None = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                self.authorization = self.authorization or value.decode("latin-1")
            elif name == b"x-api-key":
                self.api_key = self.api_key or value.decode("latin-1")
            elif name == b"anthropic-beta":
                self.beta = self.beta or value.decode("latin-1")


def _authenticate(sent: _ClientHeaders, gw: Gateway, rlog: RequestLog) -> Principal:
    """Anthropic clients send ``x-api-key``; others ``Authorization: Bearer`` (the latter wins)."""
    authorization = sent.authorization
    if not authorization and sent.api_key:
        authorization = f"Bearer {sent.api_key}"
    principal = gw.auth.authenticate(authorization)
    rlog.fields["tenant"] = principal.tenant
    rlog.span.set("gateway.api_key.name", principal.key_name)
    return principal


def _headers(rlog: RequestLog, extra: dict[str, str] | None = None) -> list[tuple[bytes, bytes]]:
    rid = rlog.request_id.encode()
    out = [(b"x-request-id", rid), (b"request-id", rid)]  # the latter is the one Anthropic's SDKs read
    return out + [(k.encode(), v.encode()) for k, v in (extra or {}).items()]


async def _send_error(
    err: GatewayError, rlog: RequestLog, send: Send, extra: dict[str, str] | None = None
) -> None:
    headers = _headers(rlog, extra)
    if isinstance(err, RateLimited) and err.standing is not None:
        headers += [(k.encode(), v.encode()) for k, v in rate_limit_headers(err.standing).items()]
    retry_after = getattr(err, "retry_after", None)
    if retry_after is not None and err.status in (429, 503):
        headers.append((b"retry-after", str(max(1, int(-(-retry_after // 1)))).encode()))
    payload = orjson.dumps(error_body(err, rlog.request_id))
    status = error_status(err)
    await send({"type": "http.response.start", "status": status, "headers": [_JSON, *headers]})
    await send({"type": "http.response.body", "body": payload})


async def create_message(scope: Scope, receive: Receive, send: Send, gw: Gateway) -> None:
    request = Request(scope, receive)
    rlog = RequestLog(request, "http", api=ClientApi.MESSAGES)
    with rlog.traced(gw.tracer, f"POST {scope['path']}", request.headers, _SPAN_ATTRS):
        await _respond(request, gw, rlog, receive, send)


async def _respond(request: Request, gw: Gateway, rlog: RequestLog, receive: Receive, send: Send) -> None:
    metrics = request.app.state.metrics
    try:
        sent = _ClientHeaders(request.scope)
        principal = _authenticate(sent, gw, rlog)
        body_bytes = await read_body(request, gw.settings.limits.max_body_bytes)
        raw = parse_json(body_bytes)
        parsed = parse_messages(raw, gw.settings.limits, sent=body_bytes)
        rlog.fields["model"] = parsed["model"]
        body, native = engine_request(parsed, raw, sent.beta)
    except GatewayError as err:
        rlog.refused(metrics, err)
        await _send_error(err, rlog, send)
        return
    async with DisconnectWatch(receive, send) as watch:
        try:
            turn = await gw.prepare(body, principal, streaming=bool(body.stream), request_id=rlog.request_id)
        except GatewayError as err:
            rlog.refused(metrics, err)
            await _send_error(err, rlog, send)
            return
        turn.request.native = native
        rlog.routed_to(turn)
        turn.on_end(lambda result: rlog.turn_ended(metrics, result))
        rate = rate_limit_headers(turn.rate_standing)
        inflight: InFlight = request.app.state.inflight
        inflight.add(turn, principal.tenant)
        try:
            if body.stream:
                stalls: StallWatch = request.app.state.stall_watch
                stalls.add(watch)
                try:
                    await _stream(turn, _headers(rlog, rate), send, watch)
                finally:
                    stalls.discard(watch)
            else:
                await _json(turn, rlog, rate, send)
        except GatewayError as err:  # before the first event: an ordinary error response
            await _send_error(err, rlog, send, rate)
        finally:
            inflight.discard(turn)
    if watch.gone:
        rlog.fields.setdefault("client_gone", True)


async def _stream(turn: Turn, headers: list[tuple[bytes, bytes]], send: Send, watch: DisconnectWatch) -> None:
    writer: BodyWriter | None = None
    encoder = MessageStream(turn.builder)

    async def opened() -> None:
        nonlocal writer
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + headers})
        writer = BodyWriter(send, watch)

    async def emit(event: dict[str, Any]) -> None:
        assert writer is not None  # opened() ran first
        data = encoder.frames(event)
        if data:
            await writer.send(data)

    await turn.run(emit, opened=opened)
    assert writer is not None
    await writer.end(b"")


async def _json(turn: Turn, rlog: RequestLog, rate: dict[str, str], send: Send) -> None:
    result = await turn.run()
    if result.error is not None:
        await _send_error(result.error, rlog, send, rate)
        return
    payload = orjson.dumps(message_of(result.resource, turn.builder))
    await send({"type": "http.response.start", "status": 200, "headers": [_JSON, *_headers(rlog, rate)]})
    await send({"type": "http.response.body", "body": payload})


async def count_tokens(scope: Scope, receive: Receive, send: Send, gw: Gateway) -> None:
    """The gateway's estimate (gateway/kernel/estimate.py) of the request's input tokens: the
    estimator every limit and budget uses, not the model's own tokenizer."""
    request = Request(scope, receive)
    rlog = RequestLog(request, "http", api=ClientApi.MESSAGES)
    metrics = request.app.state.metrics
    try:
        principal = _authenticate(_ClientHeaders(request.scope), gw, rlog)
        raw = parse_json(await read_body(request, gw.settings.limits.max_body_bytes))
        body = parse_count(raw, gw.settings.limits)
        rlog.fields["model"] = body["model"]
        gw.route(body["model"], principal)  # an unknown or disallowed model is refused as on /v1/messages
        tokens = estimate([normalize(item) for item in input_items(body["messages"])])
        tokens += estimate_text(system_text(body.get("system")))
        tools = body.get("tools")
        if tools:
            sent_tools = [{k: v for k, v in t.items() if v is not None} for t in tools]
            tokens += estimate_bytes(orjson.dumps(sent_tools))
    except GatewayError as err:
        rlog.refused(metrics, err)
        await _send_error(err, rlog, send)
        return
    payload = orjson.dumps({"input_tokens": tokens})
    await send({"type": "http.response.start", "status": 200, "headers": [_JSON, *_headers(rlog)]})
    await send({"type": "http.response.body", "body": payload})
    rlog.done(metrics, 200)
