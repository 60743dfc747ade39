"""The WebSocket transport on /v1/responses: authenticate at the upgrade, then run one turn per
``response.create`` (FIFO, one in flight), each event one JSON text frame, with the
connection-local cache, the connection age limit, disconnect cancellation and shutdown drain."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, cast

import orjson
import structlog
from starlette.requests import Request
from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.api.common import RequestLog, error_response
from gateway.api.encode import ws_bytes, ws_text
from gateway.api.frames import TERMINAL_EVENTS, FrameWriter
from gateway.api.stall import StallWatch, abort_transport
from gateway.engine.auth import Principal
from gateway.engine.orchestrator import Gateway
from gateway.engine.turn import TurnResult
from gateway.engine.validate import create_request
from gateway.kernel.errors import (
    ConnectionLimitReached,
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    ServiceUnavailable,
)
from gateway.kernel.ids import new_id
from gateway.metrics import Metrics
from state.connection import ConnectionCache

log = structlog.get_logger("gateway.ws")

Job = str | GatewayError  # a raw text frame, or the error a bad frame already earned
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_INTERNAL_ERROR = 1011
# Real clients (the openai SDKs) send stream: true and stream_options on a WebSocket create too.
_IGNORED_KEYS = ("type", "stream", "stream_options")
_SPAN_ATTRS = {"gen_ai.operation.name": "chat", "gateway.transport": "websocket"}


class WebSocketHub:
    """Every open socket of the process, so that shutdown can drain them."""

    def __init__(self) -> None:
        self.connections: set[Connection] = set()
        self.draining = False
        self._empty = asyncio.Event()
        self._empty.set()

    def add(self, conn: Connection) -> None:
        self.connections.add(conn)
        self._empty.clear()

    def discard(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if not self.connections:
            self._empty.set()

    async def drain(self, seconds: float) -> None:
        """Refuse new sockets; idle ones close now, busy ones after their in-flight turn; any
        still open after ``seconds`` are cut. All close with 1001."""
        self.draining = True
        if not self.connections:
            return
        log.info("websocket_drain", connections=len(self.connections), seconds=seconds)
        for conn in list(self.connections):
            conn.begin_drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._empty.wait(), seconds)
        if self.connections:
            log.warning("websocket_drain_timeout", connections=len(self.connections))
            for conn in list(self.connections):
                conn.abort()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._empty.wait(), 1.0)


async def responses_socket(websocket: WebSocket) -> None:
    """The endpoint: refuse before the upgrade (HTTP 401/503, no turn runs), else serve."""
    app = websocket.app
    gw: Gateway = app.state.gateway
    hub: WebSocketHub = app.state.ws_hub
    metrics: Metrics = app.state.metrics
    try:
        principal = gw.auth.authenticate(websocket.headers.get("authorization"))
        if hub.draining:
            raise ServiceUnavailable("The gateway is shutting down; connect again shortly.")
        lease = await gw.limits.open_socket(principal)  # tenants.<name>.limits.websocket_connections
    except GatewayError as err:
        rlog = RequestLog(cast(Request, websocket), "websocket")
        rlog.emit(err.status, error_code=err.code, phase="upgrade")
        await websocket.send_denial_response(error_response(err))
        return
    try:
        await websocket.accept()
        conn = Connection(websocket, gw, principal, metrics)
        stalls: StallWatch = app.state.stall_watch
        hub.add(conn)
        stalls.add(conn)
        metrics.ws_connections += 1
        try:
            await conn.serve()
        finally:
            metrics.ws_connections -= 1
            stalls.discard(conn)
            hub.discard(conn)
    finally:
        if lease is not None:
            await gw.limits.settle(lease, 0)


class Connection:
    """One accepted socket: the handler's task reads every frame at once (so a disconnect is seen
    mid-turn) into a bounded FIFO; one worker task runs the turns in order."""

    def __init__(self, websocket: WebSocket, gw: Gateway, principal: Principal, metrics: Metrics) -> None:
        limits = gw.settings.limits
        self.ws = websocket
        self.gw = gw
        self.principal = principal
        self.metrics = metrics
        self.id = new_id("ws")
        self.cache = ConnectionCache(limits.ws_cache_entries)
        # A list and a future rather than an asyncio.Queue: a few KiB less per idle socket.
        self.inbox: list[Job] = []
        self.queue_size = limits.ws_queue_size
        self.pending = 0  # admitted creates not yet finished (queued + in flight)
        self.frame_limit = limits.max_ws_frame_bytes
        self.deadline = asyncio.get_running_loop().time() + limits.ws_connection_seconds
        self.limit_minutes = limits.ws_connection_seconds / 60
        self.busy = False
        self.draining = False
        self.client_gone = False
        self.closed = False  # we have sent the close frame
        self._wake: asyncio.Future[None] | None = None
        self._worker: asyncio.Task[None] | None = None
        self.since = 0.0  # a send in progress since (gateway/api/stall.py)
        self.affinity: str | None = None  # keeps the connection's turns on one deployment
        self.frames = FrameWriter(websocket, self)  # the send path: events' frames (gateway/api/frames.py)

    # -- lifecycle -----------------------------------------------------------------------------
    async def serve(self) -> None:
        worker = self._worker = asyncio.create_task(self._work())
        try:
            await self._read()  # until the client goes, or the worker has closed the socket
        finally:
            self.client_gone = not self.closed
            if self.client_gone:
                # Cancelling the worker cancels the turn, whose event generator closes the adapter
                # stream (and with it the upstream request) on the way out.
                worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
            self.cache.clear()

    def begin_drain(self) -> None:
        """Shutdown: finish the in-flight turn (if any), start no other, then close with 1001."""
        self.draining = True
        if not self.busy and self._worker is not None:
            self._worker.cancel()

    def abort(self) -> None:
        self.draining = True
        if self._worker is not None:
            self._worker.cancel()

    async def _close(self, code: int, reason: str = "") -> None:
        if self.closed or self.client_gone:
            return
        self.closed = True
        self.frames.flush()  # events still unwritten go before the close frame
        with contextlib.suppress(Exception):
            await self.ws.close(code, reason)

    async def _send(self, text: str) -> None:
        # Awaits the transport: uvicorn pauses us at its write high-water mark, so a slow reader
        # stalls this turn (and the upstream read behind it) instead of growing a buffer; the
        # StallWatch drops it past limits.client_send_seconds.
        self.frames.flush()  # events still unwritten go first
        self.since = time.monotonic()
        await self.ws.send({"type": "websocket.send", "text": text})
        self.since = 0.0

    def stalled(self) -> None:
        """The client stopped reading: cancel the turn (and its upstream call), drop the socket
        (no close frame: it could not be delivered)."""
        self.closed = True
        self.draining = True
        if self._worker is not None:
            self._worker.cancel()
        abort_transport(self.ws._send)

    # -- reading -------------------------------------------------------------------------------
    async def _read(self) -> None:
        limit = self.frame_limit
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            text: str | None = message.get("text")
            job: Job
            if text is None:
                job = InvalidRequest(
                    "Binary frames are not accepted; send each message as a JSON text frame.",
                    code="unsupported_frame_type",
                )
            elif len(text) > limit // 4 and len(text.encode()) > limit:
                job = PayloadTooLarge(f"The message exceeds the limit of {limit} bytes.")
            else:
                job = text
            if self.pending > self.queue_size:
                err = RateLimited(
                    f"Too many messages queued on this connection (at most {self.queue_size} wait "
                    "behind the response in flight); this one was dropped.",
                    code="websocket_queue_full",
                )
                with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                    await self._send(ws_text(err.ws_envelope()))
                continue
            self.pending += 1
            self.inbox.append(job)
            if self._wake is not None and not self._wake.done():
                self._wake.set_result(None)

    async def _next(self) -> Job | None:
        """The next admitted frame, or None once the connection has reached its age limit."""
        while not self.inbox:
            self._wake = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout_at(self.deadline):
                    await self._wake
            except TimeoutError:
                return None
            finally:
                self._wake = None
        return self.inbox.pop(0)

    # -- the worker ----------------------------------------------------------------------------
    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        code = CLOSE_GOING_AWAY
        try:
            while not self.draining:
                job = await self._next()
                if self.draining:
                    break
                if job is None or loop.time() >= self.deadline:
                    # The in-flight turn (if any) has finished; idle or not, the socket ends here.
                    await self._limit_reached()
                    return
                self.busy = True
                try:
                    with self.ws.app.state.live.hold() as gw:  # the turn keeps it; a reload may swap it
                        await self._turn(job, gw)
                except WebSocketDisconnect:
                    raise
                except Exception:
                    # A bug in one turn must not take the socket and the turns queued behind it.
                    with contextlib.suppress(Exception):
                        await self._send(ws_text(self._crashed().ws_envelope()))
                finally:
                    self.busy = False
                    self.pending -= 1
        except WebSocketDisconnect:
            return
        except Exception:
            log.exception("websocket_worker_crashed", connection_id=self.id)
            code = CLOSE_INTERNAL_ERROR
        finally:
            # Drain (and cancellation by drain) ends here too: the close lets the reader finish.
            await self._close(code, "server shutting down" if code == CLOSE_GOING_AWAY else "")

    async def _limit_reached(self) -> None:
        err = ConnectionLimitReached(
            f"Responses websocket connection limit reached ({self.limit_minutes:g} minutes). "
            "Create a new websocket connection to continue."
        )
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            await self._send(ws_text(err.ws_envelope()))
        await self._close(CLOSE_NORMAL, "connection limit reached")

    async def _turn(self, job: Job, gw: Gateway) -> None:
        rlog = RequestLog(cast(Request, self.ws), "websocket")
        # the turn's span (a no-op unless tracing is on), the child of the upgrade's traceparent
        with gw.tracer.server("websocket response.create", self.ws.headers, _SPAN_ATTRS) as span:
            rlog.span = span
            await self._run_turn(job, rlog, gw)

    async def _run_turn(self, job: Job, rlog: RequestLog, gw: Gateway) -> None:
        rlog.fields["request_id"] = new_id("req")
        rlog.fields["connection_id"] = self.id
        previous: str | None = None
        try:
            self._use(gw)
            rlog.fields["tenant"] = self.principal.tenant
            if isinstance(job, GatewayError):
                raise job
            data = _parse(job)
            prev = data.get("previous_response_id")
            previous = prev if isinstance(prev, str) else None
            model = data.get("model")
            rlog.fields["model"] = model if isinstance(model, str) else None
            body = create_request(data, self.gw.settings.limits)
            turn = await self.gw.prepare(
                body,
                self.principal,
                cache=self.cache,
                error_event=False,
                request_id=rlog.request_id,
                affinity=self.affinity,
            )
            self.affinity = self.affinity or turn.affinity
        except Exception as exc:
            err = exc if isinstance(exc, GatewayError) else self._crashed()
            if previous is not None:
                self.cache.evict(previous)  # a failed continuation: retrying it must not hit the cache
            rlog.done(self.metrics, err.status, error_code=err.code)
            await self._send(ws_text(err.ws_envelope()))
            return
        rlog.fields["provider"] = turn.route.provider
        rlog.routed = True
        turn.on_end(lambda result: self._ended(result, rlog, previous))
        try:
            await turn.run(self._emit)
        except GatewayError as err:  # before generation: the envelope only
            await self._send(ws_text(err.ws_envelope()))

    def _use(self, gw: Gateway) -> None:
        """The turn's gateway: after a reload, the new one, on which the key must still be valid."""
        if gw is not self.gw:
            self.principal = gw.auth.authenticate(self.ws.headers.get("authorization"))
            self.gw = gw

    async def _emit(self, event: dict[str, Any]) -> None:
        """A turn's event: framed at once, written with the others ready in the same step
        (gateway/api/frames.py); this runs once per streamed event. The terminal event is written
        at once: the client has its answer before the turn's cleanup runs."""
        await self.frames.send(ws_bytes(event))
        if event["type"] in TERMINAL_EVENTS:
            self.frames.flush()

    def _ended(self, result: TurnResult, rlog: RequestLog, previous: str | None) -> None:
        """The end-of-turn hook: the connection cache remembers a response that exists, and forgets
        the one a failed continuation referenced; then the log line."""
        if result.ended:
            self.cache.remember(result.resource["id"], result.context.ran_on(), result.output)
        elif previous is not None:
            self.cache.evict(previous)
        rlog.turn_ended(self.metrics, result)

    def _crashed(self) -> GatewayError:
        log.exception("websocket_turn_crashed", connection_id=self.id)
        return ServerError("The gateway hit an unexpected error.")


def _parse(text: str) -> dict[str, Any]:
    """A client frame → the ``CreateResponseBody`` fields of a ``response.create``."""
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise InvalidRequest("The message is not valid JSON.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidRequest("A message must be a JSON object.", code="invalid_json")
    kind = data.get("type")
    if kind != "response.create":
        shown = kind if isinstance(kind, str) else orjson.dumps(kind).decode()
        raise InvalidRequest(
            f"Unsupported message type '{shown[:64]}'; the only client message is 'response.create'.",
            param="type",
            code="unknown_message_type",
        )
    for key in _IGNORED_KEYS:
        data.pop(key, None)
    return data
