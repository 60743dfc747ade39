"""Steering on one WebSocket (``response.steer``): which responses of the socket may be steered, the
input queued for each, and the ``response.steer.*`` events. The socket (gateway/api/ws.py) runs
the turns; this book decides.

A response is ``active`` while its turn runs: a steer queues input and asks the turn to stop at a
safe boundary (``Turn.stop``). When the turn is over the queued input goes to an automatic
successor (a ``Handoff``: same settings, ``previous_response_id`` the steered response), or, if
the response waits for client-owned tool results, stays queued (``awaiting``) with a
``response.steer.pending`` until the client's own continuation of it, whose input it is put into.
Either way the new response's ``response.created`` commits it; until then it can still come back
in ``response.steer.failed``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from gateway.engine.steer_input import required_input, steer_items
from gateway.kernel.errors import GatewayError, InvalidRequest
from gateway.kernel.ids import new_id

if TYPE_CHECKING:
    from gateway.engine.turn import Turn, TurnResult

Event = dict[str, Any]
_FIELDS = frozenset({"type", "previous_response_id", "input"})
_KEEP = 128  # finished responses remembered per socket (to tell "completed" from "not found")
_KEEP_AWAITING = 64  # responses kept waiting for tool results that may never come


class SteerState(Enum):
    """Where a response of the socket is, as steering sees it."""

    ACTIVE = "active"  # its turn is running
    HANDOFF = "handoff"  # its queued input is going to a successor that is not created yet
    AWAITING = "awaiting"  # it waits for the client's tool results (function calls in its output)
    COMPLETED = "completed"  # completed, nothing outstanding
    CLOSED = "closed"  # failed, cancelled, cut off, steered into a successor, or continued


@dataclass(slots=True)
class Submission:
    """One accepted ``response.steer``: its id, the input as sent (returned on failure), as items."""

    id: str
    input: Any
    items: list[dict[str, Any]]
    notified: bool = False  # its response.steer.pending went out (at most once)


@dataclass(slots=True)
class SteerableResponse:
    """A response made on this socket, as steering sees it."""

    id: str
    stream_id: str | None
    state: SteerState = SteerState.ACTIVE
    turn: Turn | None = None
    data: dict[str, Any] | None = None  # its create's fields, for an automatic successor
    result: TurnResult | None = None
    queue: list[Submission] = field(default_factory=list)
    late: list[Submission] = field(default_factory=list)  # accepted during a handoff
    stubs: list[dict[str, Any]] = field(default_factory=list)  # the results it waits for


@dataclass(slots=True)
class Handoff:
    """Queued steering on its way into a new response (committed by its ``response.created``).
    ``automatic``: a successor the gateway starts; else the client's own continuation."""

    parent: SteerableResponse
    subs: list[Submission]
    automatic: bool

    def items(self) -> list[dict[str, Any]]:
        return [item for sub in self.subs for item in sub.items]

    def successor(self) -> dict[str, Any]:
        """The automatic successor's create: the parent's settings, continuing from it, with the
        queued input in submission order."""
        assert self.parent.data is not None
        return {
            **self.parent.data,
            "type": "response.create",
            "input": self.items(),
            "previous_response_id": self.parent.id,
        }


class SteerBook:
    __slots__ = ("_seq", "finished", "max_items", "max_pending", "targets")

    def __init__(self, max_pending: int, max_items: int) -> None:
        self.max_pending = max_pending
        self.max_items = max_items
        self.targets: OrderedDict[str, SteerableResponse] = OrderedDict()  # active, handoff, awaiting
        # the latest done with (completed | closed): a few bytes each, not a SteerableResponse
        self.finished: OrderedDict[str, tuple[SteerState, str | None]] = OrderedDict()
        self._seq = 0

    # -- events ----------------------------------------------------------------------------------
    def _event(self, type_: str, stream_id: str | None, **fields: Any) -> Event:
        """Steering events are the socket's, not a response's: numbered per socket."""
        event = {"type": type_, "sequence_number": self._seq, **fields}
        self._seq += 1
        if stream_id is not None:
            event["stream_id"] = stream_id
        return event

    def accepted(self, target: SteerableResponse, sub: Submission) -> Event:
        steer = {"id": sub.id, "previous_response_id": target.id}
        return self._event("response.steer.accepted", target.stream_id, steer=steer)

    def pending(self, target: SteerableResponse, sub: Submission) -> Event:
        sub.notified = True
        return self._event(
            "response.steer.pending",
            target.stream_id,
            reason="waiting_for_required_input",
            required_input=[dict(s) for s in target.stubs],
            steer={"id": sub.id, "previous_response_id": target.id},
        )

    def failed(
        self,
        code: str,
        message: str,
        previous: str,
        input_: Any,
        sub_id: str | None = None,
        stream_id: str | None = None,
    ) -> Event:
        steer: dict[str, Any] = {"previous_response_id": previous, "input": input_}
        if sub_id is not None:
            steer = {"id": sub_id, **steer}
        error = {"type": "invalid_request_error", "code": code, "message": message}
        return self._event("response.steer.failed", stream_id, error=error, steer=steer)

    def _returned(
        self, target: SteerableResponse, subs: list[Submission], code: str, message: str
    ) -> list[Event]:
        return [self.failed(code, message, target.id, s.input, s.id, target.stream_id) for s in subs]

    # -- a response.steer ------------------------------------------------------------------------
    def submit(self, data: dict[str, Any]) -> list[Event]:
        """A client's ``response.steer`` → the events that answer it (a turn may be asked to stop)."""
        prev = data.get("previous_response_id")
        raw = data.get("input")
        target = self.targets.get(prev) if isinstance(prev, str) else None
        done = self.finished.get(prev) if isinstance(prev, str) and target is None else None
        shown = prev if isinstance(prev, str) else ""
        sid = target.stream_id if target is not None else done[1] if done is not None else None
        extra = sorted(k for k in data if k not in _FIELDS)
        try:
            if extra:
                hint = " (the target response decides the lane)" if "stream_id" in extra else ""
                raise InvalidRequest(
                    f"A response.steer accepts only type, previous_response_id and input; not "
                    f"{', '.join(repr(k[:64]) for k in extra[:4])}{hint}."
                )
            if not isinstance(prev, str) or not prev:
                raise InvalidRequest(
                    "A response.steer needs the previous_response_id of the response to steer."
                )
            items = steer_items(raw, self.max_items)
        except InvalidRequest as exc:
            return [self.failed("invalid_input", exc.message, shown, raw, stream_id=sid)]
        if done is not None:
            if done[0] == SteerState.COMPLETED:
                msg = "The response has completed and no longer accepts steering input."
                return [self.failed("response_already_completed", msg, prev, raw, stream_id=sid)]
            msg = "The response is no longer accepting steering input."
            return [self.failed("response_not_active", msg, prev, raw, stream_id=sid)]
        if target is None:
            msg = f"Response '{prev[:100]}' is not available on this connection."
            return [self.failed("response_not_found", msg, prev, raw)]
        state = target.state
        if len(target.queue) + len(target.late) >= self.max_pending:
            msg = f"At most {self.max_pending} steering inputs may be pending for one response."
            return [self.failed("too_many_pending_steers", msg, prev, raw, stream_id=sid)]
        sub = Submission(new_id("steer"), raw, items)
        if state == SteerState.HANDOFF:
            target.late.append(sub)
            return [self.accepted(target, sub)]
        target.queue.append(sub)
        if state == SteerState.AWAITING:
            return [self.accepted(target, sub), self.pending(target, sub)]
        assert target.turn is not None
        target.turn.stop("steered")
        return [self.accepted(target, sub)]

    # -- the life of a response on the socket ----------------------------------------------------
    def open(
        self, response_id: str, stream_id: str | None, turn: Turn, data: dict[str, Any]
    ) -> SteerableResponse:
        """A turn about to run: its response may be steered from now on."""
        target = SteerableResponse(response_id, stream_id, turn=turn, data=data)
        self.targets[response_id] = target
        return target

    def drop(self, target: SteerableResponse) -> None:
        """The turn failed before its first event: the response never existed."""
        self.targets.pop(target.id, None)

    def after_turn(self, target: SteerableResponse, closing: bool) -> tuple[list[Event], Handoff | None]:
        """The target's turn is over (its terminal event sent): what its queued input becomes.
        ``closing``: the socket is draining or past its age limit (no successor may start)."""
        result = target.result
        data, target.data, target.turn, target.result = target.data, None, None, None
        subs, target.queue = target.queue, []
        ended = result is not None and result.ended
        target.stubs = required_input(result.output) if result is not None and ended else []
        if not subs:
            if target.stubs:
                target.state = SteerState.AWAITING
                self._prune()
            else:
                self._finish(
                    target,
                    SteerState.COMPLETED
                    if result is not None and result.status == "completed"
                    else SteerState.CLOSED,
                )
            return [], None
        if not ended:
            self._finish(target, SteerState.CLOSED)
            status = result.status if result is not None else "failed"
            msg = f"The response ended {status} before the steering input could be applied."
            return self._returned(target, subs, "response_not_active", msg), None
        if target.stubs:  # client-owned tool results first: the input waits for the continuation
            target.state = SteerState.AWAITING
            target.queue = subs
            return [self.pending(target, s) for s in subs if not s.notified], None
        if closing or data is None:
            self._finish(target, SteerState.CLOSED)
            msg = "The successor response could not be created: the connection is closing."
            return self._returned(target, subs, "successor_creation_failed", msg), None
        target.state = SteerState.HANDOFF
        target.data = data
        return [], Handoff(target, subs, automatic=True)

    def continuation(self, previous: str) -> Handoff | None:
        """A client's ``response.create`` continuing ``previous``: the steering queued for it, if
        ``previous`` waits for tool results."""
        parent = self.targets.get(previous)
        if parent is None or parent.state != SteerState.AWAITING:
            return None
        subs, parent.queue = parent.queue, []
        parent.state = SteerState.HANDOFF
        return Handoff(parent, subs, automatic=False)

    def commit(self, handoff: Handoff, successor: SteerableResponse) -> None:
        """The new response's ``response.created`` is going out: the input is committed. Input
        accepted meanwhile steers the new response in turn."""
        parent = handoff.parent
        self._finish(parent, SteerState.CLOSED)
        parent.data = None
        late, parent.late = parent.late, []
        if late:
            successor.queue.extend(late)
            assert successor.turn is not None
            successor.turn.stop("steered")

    def abandon(self, handoff: Handoff, err: GatewayError) -> list[Event]:
        """The new response was not created: its input is returned. A client's continuation may be
        retried (the parent waits again); an automatic successor's parent is done."""
        parent = handoff.parent
        parent.data = None
        subs = handoff.subs + parent.late
        parent.late = []
        if handoff.automatic:
            self._finish(parent, SteerState.CLOSED)
        else:
            parent.state = SteerState.AWAITING
        msg = f"The successor response could not be created: {err.message}"
        return self._returned(parent, subs, "successor_creation_failed", msg)

    def _finish(self, target: SteerableResponse, state: SteerState) -> None:
        """``target`` is done with: only its final state (and lane) is kept, among the latest."""
        target.state = state
        self.targets.pop(target.id, None)
        self.finished[target.id] = (state, target.stream_id)
        if len(self.finished) > _KEEP:
            self.finished.popitem(last=False)

    def _prune(self) -> None:
        """Past ``_KEEP_AWAITING`` responses waiting for tool results with nothing queued, the
        oldest are given up on (a later steer of one: ``response_not_active``)."""
        idle = [t for t in self.targets.values() if t.state == SteerState.AWAITING and not t.queue]
        for target in idle[: max(0, len(idle) - _KEEP_AWAITING)]:
            self._finish(target, SteerState.CLOSED)
