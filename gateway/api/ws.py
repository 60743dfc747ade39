"""The WebSocket transport on /v1/responses: authenticate at the upgrade, then run one turn per
``response.create``, FIFO per lane (``stream_id``, gateway/api/lanes.py), lanes side by side; each
event one JSON text frame; ``response.steer`` (gateway/api/steer_book.py); with the
connection-local cache, the connection age limit, disconnect cancellation and shutdown drain."""

from __future__ import annotations

import asyncio
import contextlib
import time
from enum import Enum
from typing import Any, cast

import orjson
import structlog
from starlette.requests import Request
from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.api.encode import ws_bytes, ws_text
from gateway.api.exchange import RequestLog, error_response
from gateway.api.frames import TERMINAL_EVENTS, FrameWriter
from gateway.api.inflight import InFlight
from gateway.api.lanes import Lane, QueuedCreate, lane_of, tagged
from gateway.api.live import LiveGateway
from gateway.api.stall import StallWatch
from gateway.api.steer_book import Handoff, SteerableResponse, SteerBook
from gateway.engine.auth import Principal
from gateway.engine.orchestrator import Gateway
from gateway.engine.steer_input import with_steering
from gateway.engine.turn import Emit, TurnResult
from gateway.engine.validate import create_request, no_background
from gateway.kernel.errors import (
    ConnectionLimitReached,
    ErrorCode,
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    ServiceUnavailable,
)
from gateway.kernel.ids import new_id
from gateway.observability.observer import Metrics
from gateway.server.internals import abort_websocket
from state.connection import ConnectionCache

log = structlog.get_logger("gateway.ws")

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_INTERNAL_ERROR = 1011
# A send that does not block (the client keeps up) never yields to the event loop, and an upstream
# whose bytes are already buffered does not either: every 64 events the turn yields once, so that
# the socket's reader (a steer, a disconnect) and the other lanes run even then.
_YIELD_EVERY = 63
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
        """Refuse new sockets; idle ones close now, busy ones after their in-flight turns; any
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


class ConnectionPhase(Enum):
    """Where a connection is. ``OPEN`` admits and starts turns. Past the age limit (``EXPIRED``) or
    at a shutdown (``DRAINING``) the turns in flight finish and no other starts, then the socket
    closes (1000 with the limit's envelope, 1001). ``CLOSED``: we sent the close frame (or dropped
    a client that stopped reading); ``GONE``: the client left first."""

    OPEN = "open"
    EXPIRED = "expired"
    DRAINING = "draining"
    CLOSED = "closed"
    GONE = "gone"


_OPEN = ConnectionPhase.OPEN
# no turn starts any more, whatever the age limit says
_ENDING = frozenset({ConnectionPhase.DRAINING, ConnectionPhase.CLOSED, ConnectionPhase.GONE})
_CLOSED = frozenset({ConnectionPhase.CLOSED, ConnectionPhase.GONE})


async def responses_socket(websocket: WebSocket) -> None:
    """The endpoint: refuse before the upgrade (HTTP 401/503, no turn runs), else serve. The
    upgrade runs on the live gateway, held while it authenticates and takes the connection's
    lease; each turn then holds its own (``Connection._turn``)."""
    app = websocket.app
    live: LiveGateway = app.state.live
    hub: WebSocketHub = app.state.ws_hub
    metrics: Metrics = app.state.metrics
    rlog = RequestLog(cast(Request, websocket), "websocket")
    with live.hold() as gw:
        try:
            principal = gw.auth.authenticate(websocket.headers.get("authorization"))
            rlog.fields["tenant"] = principal.tenant
            if hub.draining:
                raise ServiceUnavailable("The gateway is shutting down; connect again shortly.")
            lease = await gw.limits.open_socket(principal)  # tenants.<name>.limits.websocket_connections
        except GatewayError as err:
            # a refused upgrade is a request (gateway_requests_total), not a turn
            rlog.refused(metrics, err, phase="upgrade", turn=False)
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
            await gw.limits.settle_soon(lease, 0)  # never waits on the network: safe when cancelled


class Connection:
    """One accepted socket. The handler's task reads every frame at once (so a disconnect or a
    steer is seen mid-turn): a ``response.steer`` is answered there; a create joins its lane's
    FIFO (bounded across lanes), whose task runs the lane's turns in order, each a ``TurnCycle``.
    A supervisor task holds the age limit and the drain, and closes the socket."""

    def __init__(self, websocket: WebSocket, gw: Gateway, principal: Principal, metrics: Metrics) -> None:
        limits = gw.settings.limits
        self.ws = websocket
        self.gw = gw
        self.principal = principal
        self.metrics = metrics
        self.id = new_id("ws")
        self.cache = ConnectionCache(limits.ws_cache_entries)
        self.book = SteerBook(limits.ws_max_pending_steers, limits.max_input_elements)
        self.lanes: dict[str | None, Lane] = {}  # lanes with admitted creates
        self.max_lanes = limits.ws_max_lanes
        self.queue_size = limits.ws_queue_size
        self.pending = 0  # admitted creates not yet finished, all lanes (queued + in flight)
        self.frame_limit = limits.max_ws_frame_bytes
        self._loop = asyncio.get_running_loop()
        self.live: LiveGateway = websocket.app.state.live  # the turns' gateway (a reload swaps it)
        self.inflight: InFlight = websocket.app.state.inflight  # what a shutdown's deadline ends
        self.deadline = self._loop.time() + limits.ws_connection_seconds
        self.limit_minutes = limits.ws_connection_seconds / 60
        self.phase = _OPEN
        self._wake: asyncio.Future[None] | None = None  # the supervisor waits: drain, or lanes idle
        self._supervisor: asyncio.Task[None] | None = None  # the supervisor
        self._tasks: set[asyncio.Task[None]] = set()  # the lanes' tasks
        self.since = 0.0  # a send in progress since (gateway/api/stall.py)
        self.affinity: str | None = None  # keeps the connection's turns on one deployment
        self.frames = FrameWriter(websocket, self)  # the send path: events' frames (gateway/api/frames.py)
        self.sent = 0  # events sent, all lanes

    # -- lifecycle -----------------------------------------------------------------------------
    async def serve(self) -> None:
        supervisor = self._supervisor = asyncio.create_task(self._supervise())
        try:
            await self._read()  # until the client goes, or the supervisor has closed the socket
        finally:
            if self.phase is not ConnectionPhase.CLOSED:
                self.phase = ConnectionPhase.GONE
                # Cancelling a lane cancels its turn, whose event generator closes the adapter
                # stream (and with it the upstream request) on the way out.
                self._cancel()
            await asyncio.gather(supervisor, *self._tasks, return_exceptions=True)
            self.cache.clear()

    def _cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._supervisor is not None:
            self._supervisor.cancel()

    def _wake_supervisor(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _drain(self) -> None:
        if self.phase is _OPEN or self.phase is ConnectionPhase.EXPIRED:
            self.phase = ConnectionPhase.DRAINING

    def begin_drain(self) -> None:
        """Shutdown: finish the turns in flight (if any), start no other, then close with 1001."""
        self._drain()
        self._wake_supervisor()

    def abort(self) -> None:
        self._drain()
        self._cancel()

    async def _close(self, code: int, reason: str = "") -> None:
        if self.phase in _CLOSED:
            return
        self.phase = ConnectionPhase.CLOSED
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
        """The client stopped reading: cancel the turns (and their upstream calls), drop the socket
        (no close frame: it could not be delivered)."""
        self.phase = ConnectionPhase.CLOSED
        self._cancel()
        abort_websocket(self.ws)

    # -- reading -------------------------------------------------------------------------------
    async def _read(self) -> None:
        limit = self.frame_limit
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            text: str | None = message.get("text")
            frame: QueuedCreate
            if text is None:
                frame = InvalidRequest(
                    "Binary frames are not accepted; send each message as a JSON text frame.",
                    code=ErrorCode.UNSUPPORTED_FRAME_TYPE,
                )
            elif len(text) > limit // 4 and len(text.encode()) > limit:
                frame = PayloadTooLarge(f"The message exceeds the limit of {limit} bytes.")
            else:
                frame = _decode(text)
            key: str | None = None
            if isinstance(frame, dict):
                if frame.get("type") == "response.steer":
                    await self._steer(frame)
                    continue
                try:
                    key = lane_of(frame)
                except InvalidRequest as err:
                    frame = err
            await self._admit(key, frame)

    async def _admit(self, key: str | None, create: QueuedCreate) -> None:
        """Queue ``create`` on lane ``key``, or answer the envelope of a full queue or lane table."""
        if self.phase is not _OPEN:
            return  # the socket is closing: nothing more starts
        lane = self.lanes.get(key)
        err: GatewayError | None = None
        if lane is None and len(self.lanes) >= self.max_lanes:
            err = RateLimited(
                f"Too many lanes busy on this connection (at most {self.max_lanes} stream_ids run at "
                "once); this message was dropped.",
                code=ErrorCode.WEBSOCKET_LANE_LIMIT,
            )
        elif lane is not None and self.pending - len(self.lanes) >= self.queue_size:
            err = RateLimited(
                f"Too many messages queued on this connection (at most {self.queue_size} wait "
                "behind the response in flight); this one was dropped.",
                code=ErrorCode.WEBSOCKET_QUEUE_FULL,
            )
        if err is not None:
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                await self._send(ws_text(tagged(err.ws_envelope(), key)))
            return
        if lane is None:
            lane = self.lanes[key] = Lane(key)
        self.pending += 1
        lane.creates.append(create)
        if lane.task is None:
            lane.task = asyncio.create_task(self._lane(lane))
            self._tasks.add(lane.task)
            lane.task.add_done_callback(self._tasks.discard)

    async def _steer(self, data: dict[str, Any]) -> None:
        events = self.book.submit(data)
        log.info(
            "websocket_steer",
            connection_id=self.id,
            outcome=events[-1]["type"],
            code=events[-1].get("error", {}).get("code"),
        )
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            for event in events:
                await self._send(ws_text(event))

    # -- the lanes -----------------------------------------------------------------------------
    async def _lane(self, lane: Lane) -> None:
        """Run the lane's creates in order; the lane ends when it has none left (or nothing may start)."""
        loop = self._loop
        try:
            while lane.creates and self.phase not in _ENDING and loop.time() < self.deadline:
                try:
                    target = await self._turn(lane.key, lane.creates[0])
                    while target is not None:  # steered: its successor runs next, on this lane
                        target = await self._after_turn(lane.key, target)
                except WebSocketDisconnect:
                    return
                except Exception:
                    # A bug in one turn must not take the socket and the turns queued behind it.
                    with contextlib.suppress(Exception):
                        await self._send(ws_text(tagged(self._crashed().ws_envelope(), lane.key)))
                finally:
                    lane.creates.popleft()
                    self.pending -= 1
        finally:
            # No await before this: the reader must not queue on a lane whose task has ended.
            self.pending -= len(lane.creates)  # never run: the socket is closing
            lane.creates.clear()
            if self.lanes.get(lane.key) is lane:
                del self.lanes[lane.key]
            if not self.lanes:
                self._wake_supervisor()

    async def _after_turn(self, sid: str | None, target: SteerableResponse) -> SteerableResponse | None:
        """After a turn: its queued steering's pending or failed events, or its successor's turn."""
        closing = self.phase in _ENDING or self._loop.time() >= self.deadline
        events, handoff = self.book.after_turn(target, closing)
        for event in events:
            await self._send(ws_text(event))
        if handoff is None:
            return None
        return await self._turn(sid, handoff.successor(), handoff)

    # -- the supervisor ------------------------------------------------------------------------
    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        code = CLOSE_GOING_AWAY
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(self.deadline):
                    while self.phase is _OPEN:
                        self._wake = loop.create_future()
                        await self._wake
            if self.phase is _OPEN:
                self.phase = ConnectionPhase.EXPIRED
            while self.lanes:  # the turns in flight finish; nothing else starts
                self._wake = loop.create_future()
                await self._wake
            if self.phase is ConnectionPhase.EXPIRED:
                await self._limit_reached()
        except WebSocketDisconnect:
            return
        except Exception:
            log.exception("websocket_worker_crashed", connection_id=self.id)
            code = CLOSE_INTERNAL_ERROR
        finally:
            self._wake = None
            # Drain (and cancellation) ends here too: the close lets the reader finish.
            await self._close(code, "server shutting down" if code == CLOSE_GOING_AWAY else "")

    async def _limit_reached(self) -> None:
        err = ConnectionLimitReached(
            f"Responses websocket connection limit reached ({self.limit_minutes:g} minutes). "
            "Create a new websocket connection to continue."
        )
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            await self._send(ws_text(err.ws_envelope()))
        await self._close(CLOSE_NORMAL, "connection limit reached")

    # -- one turn ------------------------------------------------------------------------------
    async def _turn(
        self, sid: str | None, create: QueuedCreate, handoff: Handoff | None = None
    ) -> SteerableResponse | None:
        """Run one create on lane ``sid`` (a ``TurnCycle``). ``handoff``: queued steering it
        commits (an automatic successor's, or found for a client's continuation). → the
        response's steering target, or None when no response came of it. The turn holds the
        gateway current when it starts (a reload may swap it meanwhile)."""
        with self.live.hold() as gw:
            # each turn is a request of its own: its own request_id (the upgrade's X-Request-Id is not)
            rlog = RequestLog(cast(Request, self.ws), "websocket", new_id("req"))
            # the turn's span, the child of the upgrade's traceparent
            with rlog.traced(gw.tracer, "websocket response.create", self.ws.headers, _SPAN_ATTRS):
                return await TurnCycle(self, gw, sid, handoff, rlog).run(create)

    def principal_on(self, gw: Gateway) -> Principal:
        """The caller as ``gw`` (the gateway the turn holds) knows it: after a reload, the key must
        still be valid on the new one. The turn uses what this returns, never ``self.gw``: while a
        reload is under way, two lanes may hold different gateways."""
        if gw is self.gw:
            return self.principal
        principal = gw.auth.authenticate(self.ws.headers.get("authorization"))
        self.gw, self.principal = gw, principal
        return principal

    async def _emit(self, event: dict[str, Any]) -> None:
        """A turn's event: framed at once, written with the others ready in the same step
        (gateway/api/frames.py); this runs once per streamed event. The terminal event is written
        at once: the client has its answer before the turn's cleanup runs."""
        await self.frames.send(ws_bytes(event))
        if event["type"] in TERMINAL_EVENTS:
            self.frames.flush()
        self.sent += 1
        if not self.sent & _YIELD_EVERY:
            await asyncio.sleep(0)

    def emitter(self, sid: str | None) -> Emit:
        """Where lane ``sid``'s events go: ``_emit``, each event with its ``stream_id`` on a named
        lane (set as it is encoded)."""
        emit_one = self._emit
        if sid is None:
            return emit_one

        async def emit(event: dict[str, Any]) -> None:
            event["stream_id"] = sid
            await emit_one(event)

        return emit

    def _crashed(self) -> GatewayError:
        log.exception("websocket_turn_crashed", connection_id=self.id)
        return ServerError("The gateway hit an unexpected error.")


class TurnCycle:
    """One ``response.create`` of a connection, from its frame to its end (as uvicorn's
    ``RequestResponseCycle`` is apart from its protocol): the gateway it holds, its lane, its
    request log, the steering it commits (``handoff``) and the steering target its response
    becomes, and the end-of-turn hook."""

    __slots__ = ("conn", "gw", "handoff", "previous", "rlog", "sid", "target")

    def __init__(
        self, conn: Connection, gw: Gateway, sid: str | None, handoff: Handoff | None, rlog: RequestLog
    ) -> None:
        self.conn = conn
        self.gw = gw
        self.sid = sid
        self.handoff = handoff
        self.rlog = rlog
        self.previous: str | None = None  # the previous_response_id it continues, if any
        self.target: SteerableResponse | None = None

    async def run(self, create: QueuedCreate) -> SteerableResponse | None:
        conn, gw, rlog = self.conn, self.gw, self.rlog
        rlog.fields["connection_id"] = conn.id
        if self.sid is not None:
            rlog.fields["stream_id"] = self.sid
        if self.handoff is not None and self.handoff.automatic:
            rlog.fields["steered_from"] = self.handoff.parent.id
        try:
            principal = conn.principal_on(gw)  # this turn's: lanes may hold different gateways at once
            rlog.fields["tenant"] = principal.tenant
            if isinstance(create, GatewayError):
                raise create
            data = _fields(create)
            prev = data.get("previous_response_id")
            self.previous = prev if isinstance(prev, str) else None
            if self.handoff is None and self.previous is not None:
                self.handoff = conn.book.continuation(self.previous)
                if self.handoff is not None and self.handoff.subs:
                    data["input"] = with_steering(data.get("input"), self.handoff.items())
            model = data.get("model")
            rlog.fields["model"] = model if isinstance(model, str) else None
            body = create_request(data, gw.settings.limits)
            no_background(body)
            turn = await gw.prepare(
                body,
                principal,
                cache=conn.cache,
                error_event=False,
                request_id=rlog.request_id,
                affinity=conn.affinity,
            )
            conn.affinity = conn.affinity or turn.affinity
        except Exception as exc:
            err = exc if isinstance(exc, GatewayError) else conn._crashed()
            if self.previous is not None:
                conn.cache.evict(self.previous)  # a failed continuation: retrying it must not hit the cache
            rlog.refused(conn.metrics, err)
            await self._refused(err)
            return None
        rlog.routed_to(turn)
        target = self.target = conn.book.open(turn.result.resource["id"], self.sid, turn, data)
        turn.on_end(self._ended)
        opened = None
        if self.handoff is not None:
            committing = self.handoff

            async def opened() -> None:
                conn.book.commit(committing, target)

        inflight = conn.inflight
        inflight.add(turn, conn.principal.tenant)
        try:
            await turn.run(conn.emitter(self.sid), opened=opened)
        except GatewayError as err:  # before generation: the envelope only
            conn.book.drop(target)
            await self._refused(err)
            return None
        finally:
            inflight.discard(turn)
        return target

    async def _refused(self, err: GatewayError) -> None:
        """A create that made no response: its envelope (not for an automatic successor, which no
        client asked for), and the steering input it was to commit comes back."""
        conn, handoff = self.conn, self.handoff
        if handoff is None or not handoff.automatic:
            await conn._send(ws_text(tagged(err.ws_envelope(), self.sid)))
        if handoff is not None:
            for event in conn.book.abandon(handoff, err):
                await conn._send(ws_text(event))

    def _ended(self, result: TurnResult) -> None:
        """The end-of-turn hook: the connection cache remembers a response that exists, and forgets
        the one a failed continuation referenced; steering learns the outcome; then the log line."""
        target = self.target
        assert target is not None  # the hook is added once the target is open
        target.result = result
        cache = self.conn.cache
        if result.ended:
            cache.remember(result.resource["id"], result.context.ran_on(), result.output)
        elif self.previous is not None:
            cache.evict(self.previous)
        self.rlog.turn_ended(self.conn.metrics, result)


def _decode(text: str) -> QueuedCreate:
    """A client frame → its JSON object, or the error it earns."""
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return InvalidRequest("The message is not valid JSON.", code=ErrorCode.INVALID_JSON)
    if not isinstance(data, dict):
        return InvalidRequest("A message must be a JSON object.", code=ErrorCode.INVALID_JSON)
    return data


def _fields(data: dict[str, Any]) -> dict[str, Any]:
    """A ``response.create`` frame → its ``CreateResponseBody`` fields."""
    kind = data.get("type")
    if kind != "response.create":
        shown = kind if isinstance(kind, str) else orjson.dumps(kind).decode()
        raise InvalidRequest(
            f"Unsupported message type '{shown[:64]}'; the client messages are 'response.create' "
            "and 'response.steer'.",
            param="type",
            code=ErrorCode.UNKNOWN_MESSAGE_TYPE,
        )
    for key in _IGNORED_KEYS:
        data.pop(key, None)
    return data
