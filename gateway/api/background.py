"""Background responses over HTTP (docs/background.md): starting one (``POST /v1/responses`` with
``background: true``, JSON or SSE), resuming its stream (``GET /v1/responses/{id}?stream=true
&starting_after=N``) and cancelling it (``POST /v1/responses/{id}/cancel``). The work itself is
``gateway/engine/background.py``'s; this is its transport.

A background SSE stream and a resumed one are the same thing: the response's event log followed
from a sequence number (-1 for the creating request) until its terminal event, so a client that
leaves loses nothing and cancels nothing. The detached turn holds the gateway it started on (a
reload changes nothing under it) and counts among the process's responses in flight, so that a
shutdown waits for it until its drain deadline and then ends it failed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.api.disconnect import DisconnectWatch
from gateway.api.encode import SSE_DONE, json_bytes, sse_frame
from gateway.api.exchange import error_response, json_response
from gateway.api.frames import BodyWriter
from gateway.api.inflight import InFlight
from gateway.api.live import LiveGateway
from gateway.api.stall import StallWatch
from gateway.engine.auth import Principal
from gateway.engine.background import RUNNING, BackgroundRuns
from gateway.engine.orchestrator import Gateway
from gateway.engine.turn import Turn
from gateway.kernel.errors import (
    ErrorCode,
    GatewayError,
    InvalidRequest,
    NotFound,
    RateLimited,
    ServiceUnavailable,
)

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_JSON_HEADERS = [(b"content-type", b"application/json")]
CANCEL_WAIT_SECONDS = 15.0  # a cancel answers once the response has ended, or after this long

if TYPE_CHECKING:
    from state.base import StoredResponse


def runs_of(request: Request) -> BackgroundRuns:
    runs: BackgroundRuns = request.app.state.background
    return runs


def admissible(request: Request, gw: Gateway, tenant: str) -> bool:
    """Whether a new background response of ``tenant`` must queue behind others already waiting
    for a slot here; refused while the process drains (503: another replica takes it) and past
    ``limits.background_queue_size`` waiting (429)."""
    runs = runs_of(request)
    if not runs.accepting:
        raise ServiceUnavailable(
            "This gateway is shutting down and takes no new background responses; retry."
        )
    waiting = runs.waiting(tenant)
    size = gw.settings.limits.background_queue_size
    if waiting and waiting >= size:
        raise RateLimited(
            f"Too many background responses of this tenant wait for a concurrency slot (at most "
            f"{size}); retry later.",
            code=ErrorCode.BACKGROUND_QUEUE_FULL,
            retry_after=1.0,
        )
    return waiting > 0


async def start(
    request: Request,
    gw: Gateway,
    turn: Turn,
    principal: Principal,
    extra: list[tuple[bytes, bytes]],
    send: Send,
    watch: DisconnectWatch,
    *,
    stream: bool,
) -> None:
    """Run ``turn`` (prepared with ``background``) detached, and answer at once: its resource as it
    is now (JSON), or its events as they are logged (SSE)."""
    runs = runs_of(request)
    inflight: InFlight = request.app.state.inflight
    live: LiveGateway = request.app.state.live
    live.retain(gw)
    inflight.add(turn, principal.tenant)

    def done() -> None:
        inflight.discard(turn)
        live.release(gw)

    rid: str = turn.result.resource["id"]
    res = turn.result.resource
    payload = json_bytes(res)  # before it runs: queued or in_progress

    async def slot() -> None:
        await gw.take_slot(turn, principal)

    runs.start(turn, principal.tenant, done, slot if res["status"] == "queued" else None)
    if not stream:
        await send({"type": "http.response.start", "status": 200, "headers": _JSON_HEADERS + extra})
        await send({"type": "http.response.body", "body": payload})
        return
    await follow(request, runs, principal.tenant, rid, -1, extra, send, watch)


async def follow(
    request: Request,
    runs: BackgroundRuns,
    tenant: str,
    rid: str,
    after: int,
    extra: list[tuple[bytes, bytes]],
    send: Send,
    watch: DisconnectWatch,
) -> None:
    """The response's logged events after ``after``, live until its terminal event, as SSE; a log
    that stops answering ends the stream with an ``error`` event (the client can resume from the
    last number it got)."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + extra})
    writer = BodyWriter(send, watch)
    stalls: StallWatch = request.app.state.stall_watch
    stalls.add(watch)
    try:
        try:
            async for event in runs.follow(tenant, rid, after):
                await writer.send(event.data)
                after = event.seq
        except GatewayError as err:  # the log became unreachable: the client may resume later
            await writer.send(sse_frame(err.stream_event(after + 1)))
        await writer.end(SSE_DONE)
    finally:
        stalls.discard(watch)


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param="response_id")


def starting_after(request: Request) -> int:
    raw = request.query_params.get("starting_after")
    if raw is None:
        return -1
    try:
        value = int(raw)
    except ValueError:
        value = -2
    if value < -1:
        raise InvalidRequest(
            "'starting_after' must be a non-negative integer (a sequence number).",
            param="starting_after",
            code=ErrorCode.INVALID_VALUE,
        )
    return value


async def _background_of(
    gw: Gateway, runs: BackgroundRuns, principal: Principal, rid: str, refusal: str, param: str
) -> StoredResponse:
    """The caller's response ``rid`` as it stands: NotFound when its tenant has none by that id, an
    InvalidRequest (``refusal``, on ``param``) when it was not created in the background."""
    stored = await runs.current(principal.tenant, rid) if gw.retains(principal.tenant) else None
    if stored is None:
        raise _not_found(rid)
    if not stored.resource.get("background"):
        raise InvalidRequest(refusal, param=param, code=ErrorCode.INVALID_VALUE)
    return stored


async def resume(
    scope: Scope, receive: Receive, send: Send, gw: Gateway, principal: Principal, rid: str
) -> None:
    """``GET /v1/responses/{id}?stream=true``: the caller's background response's events after
    ``starting_after``, then live until the end."""
    request = Request(scope, receive)
    runs = runs_of(request)
    try:
        after = starting_after(request)
        await _background_of(
            gw,
            runs,
            principal,
            rid,
            "Only a background response can be streamed: this one was not created with background: true.",
            "stream",
        )
    except GatewayError as err:
        await error_response(err)(scope, receive, send)
        return
    async with DisconnectWatch(receive, send) as watch:
        await follow(request, runs, principal.tenant, rid, after, [], send, watch)


async def cancel_response(request: Request, gw: Gateway) -> Response:
    """``POST /v1/responses/{id}/cancel``: a background response still queued or running is
    cancelled, wherever it runs, and answered once it has ended; one already ended is answered as
    it is (cancelling twice changes nothing); one not created in the background is a 400."""
    rid = request.path_params["response_id"]
    runs = runs_of(request)
    try:
        principal = gw.auth.authenticate(request.headers.get("authorization"))
        stored = await _background_of(
            gw,
            runs,
            principal,
            rid,
            "Only a response created with background: true can be cancelled.",
            "response_id",
        )
        if stored.resource.get("status") in RUNNING:
            await runs.cancel(principal.tenant, rid)
            ended = await runs.wait_ended(principal.tenant, rid, CANCEL_WAIT_SECONDS)
            stored = ended or stored
    except GatewayError as err:
        return error_response(err)
    return json_response(stored.resource)
