"""The one ResponseBuilder: a pure, synchronous reducer from normalized deltas to spec events.

It alone assigns item ids, ``output_index``, ``content_index``, ``summary_index`` and
``sequence_number``, enforces the response / item / content-part state machines
(``ResponseState`` for the response, ``OutputState`` for the open item and its open part, which
one ``_OpenItem`` holds), and accumulates the final ResponseResource.
``start()``, ``feed(delta)``, ``finish()`` and ``fail(error)`` each return the events to send, in
order. An illegal transition raises ``IllegalTransition`` and leaves the builder able to
``fail()`` cleanly.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from adapters.deltas import (
    Delta,
    Finish,
    ItemDone,
    ReasoningDelta,
    ReasoningEncrypted,
    ReasoningSummaryDelta,
    RefusalDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
from gateway.kernel.errors import GatewayError, IllegalTransition
from gateway.kernel.ids import new_id

if TYPE_CHECKING:
    from gateway.engine.hosted import HostedFunction

Event = dict[str, Any]


class ResponseState(Enum):
    NEW = "new"
    QUEUED = "queued"  # a background response waiting for a concurrency slot
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"
    CANCELLED = "cancelled"


class OutputState(Enum):
    """An output item, or a content part or reasoning summary part of one: ``in_progress`` until
    closed, once, as ``completed`` or ``incomplete``. An item's value is its wire ``status``; a part
    opens with its ``*.added`` event, completes with its two ``*.done`` events, and is left
    ``incomplete`` when ``fail()`` cuts it off."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"


@dataclass(frozen=True, slots=True)
class _PartKind:
    """How one kind of part is stored and streamed."""

    type: str  # the part's own ``type``
    key: str  # its text field
    item: str  # the type of item it belongs to
    parts: str  # the item's list of such parts
    index: str  # the events' index field
    added: str
    delta: str
    done: str
    part_done: str


_TEXT = _PartKind(
    "output_text",
    "text",
    "message",
    "content",
    "content_index",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
)
_REFUSAL = _PartKind(
    "refusal",
    "refusal",
    "message",
    "content",
    "content_index",
    "response.content_part.added",
    "response.refusal.delta",
    "response.refusal.done",
    "response.content_part.done",
)
_SUMMARY = _PartKind(
    "summary_text",
    "text",
    "reasoning",
    "summary",
    "summary_index",
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_text.delta",
    "response.reasoning_summary_text.done",
    "response.reasoning_summary_part.done",
)
_REASONING = _PartKind(
    "reasoning_text",
    "text",
    "reasoning",
    "content",
    "content_index",
    "response.content_part.added",
    "response.reasoning.delta",
    "response.reasoning.done",
    "response.content_part.done",
)

# Bound once: the per-delta checks compare against these.
_LIVE = ResponseState.IN_PROGRESS
_OPEN = OutputState.IN_PROGRESS
_TERMINAL = (
    ResponseState.COMPLETED,
    ResponseState.INCOMPLETE,
    ResponseState.FAILED,
    ResponseState.CANCELLED,
)
_INCOMPLETE_REASON = {"length": "max_output_tokens", "content_filter": "content_filter"}
# The items a model's call to a function becomes: the client's own, or a hosted tool's receipt.
_CALL_KINDS = frozenset({"function_call", "mcp_call", "mcp_approval_request"})
_HOSTED_EVENTS = {"completed": "response.mcp_call.completed", "failed": "response.mcp_call.failed"}


def _new_item(kind: str) -> dict[str, Any]:
    """A new assistant message or reasoning item."""
    if kind == "message":
        return {
            "id": new_id("msg"),
            "type": kind,
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
    return {"id": new_id("rs"), "type": kind, "status": "in_progress", "summary": []}


class _OpenItem:
    """The latest output item and its latest part, with the state of each (``state`` None: no item
    yet): what is streaming now. A new item gets a new one; its parts come and go inside it."""

    __slots__ = (
        "item",
        "kind",
        "logprobs",
        "part",
        "part_index",
        "part_kind",
        "part_state",
        "state",
        "summary_key",
        "summary_keys",
        "template",
        "texts",
    )

    def __init__(self, item: dict[str, Any], state: OutputState | None = _OPEN) -> None:
        self.item = item
        self.kind: str = item.get("type", "")  # the item's type
        self.state = state
        self.part: dict[str, Any] = {}
        self.part_kind: _PartKind | None = None  # None: no part yet (or a function call's arguments)
        self.part_index = -1
        self.part_state: OutputState | None = None
        self.summary_keys: set[int] = set()  # the adapter's summary part numbers seen in this item
        self.summary_key = -1  # the open summary part's
        self.texts: list[str] = []  # the open part's (or call's arguments') pieces
        self.logprobs: list[dict[str, Any]] | None = None  # of the open output_text part, if any came
        self.template: Event | None = None  # a copy of the open part's (or call's) first delta event

    def is_open(self, kind: str) -> bool:
        return self.state is _OPEN and self.kind == kind

    def open_part(self, kind: _PartKind, part: dict[str, Any], index: int) -> None:
        self.part = part
        self.part_kind = kind
        self.part_index = index
        self.part_state = _OPEN
        self.texts = []
        self.logprobs = None
        self.template = None

    def park(self) -> None:
        """The item leaves the open slot still ``in_progress``: a hosted call whose arguments are
        complete, to be executed and then closed (``ResponseBuilder.hosted_done``)."""
        if self.state is not _OPEN:
            raise IllegalTransition("only an open item can be parked")
        self.state = OutputState.COMPLETED

    def end(self, to: OutputState) -> None:
        """The item's state machine: in_progress → completed | incomplete, once."""
        if self.state is not _OPEN or to is _OPEN:
            now = "none" if self.state is None else self.state.value
            raise IllegalTransition(f"output item {now} cannot become {to.value}")
        self.state = to
        self.item["status"] = to.value

    def end_part(self, to: OutputState) -> str:
        """The part's state machine: in_progress → completed | incomplete, once. Returns its text."""
        kind = self.part_kind
        if self.part_state is not _OPEN or to is _OPEN or kind is None:
            now = "none" if self.part_state is None else self.part_state.value
            raise IllegalTransition(f"content part {now} cannot become {to.value}")
        self.part_state = to
        text = self.part[kind.key] = "".join(self.texts)
        return text


_NO_ITEM: dict[str, Any] = {}


class ResponseBuilder:
    __slots__ = (
        "_base_cache_writes",
        "_base_usage",
        "_call_keys",
        "_error_event",
        "_finish",
        "_oi",
        "_open",
        "_parked",
        "_seq",
        "cache_write_tokens",
        "handoff",
        "hosted",
        "resource",
        "state",
        "stop_sequence",
    )

    def __init__(self, resource: dict[str, Any], *, error_event: bool = True) -> None:
        """``resource`` is a complete ResponseResource with ``status: in_progress`` and empty output.
        ``error_event``: a failure mid-stream emits ``error`` before ``response.failed`` (SSE, JSON);
        False emits ``response.failed`` alone (a WebSocket, whose clients end a turn at any error)."""
        self.resource = resource
        self._error_event = error_event
        self.state = ResponseState.NEW
        self._seq = 0
        self._oi = -1
        self._open = _OpenItem(_NO_ITEM, None)  # the latest item and part; their states say if open
        self._call_keys: dict[int | str, dict[str, Any]] = {}
        self._finish: str | None = None
        # hosted tools by the function name the model calls (gateway/engine/hosted.py): a call to
        # one is an ``mcp_call`` (or ``mcp_approval_request``) item, parked until executed
        self.hosted: Mapping[str, HostedFunction] = {}
        self._parked: dict[int, dict[str, Any]] = {}  # output_index → its mcp_call
        self._base_usage: dict[str, Any] | None = None  # the earlier upstream calls' (next_round)
        self._base_cache_writes = 0
        # the model made a call the client answers (its own function, or an approval request): the
        # response ends with this upstream call, whatever hosted calls it made too
        self.handoff = False
        # What the resource has no field for, for the ingresses that answer it (Messages):
        # the stop sequence that ended generation, and the tokens written to a prompt cache.
        self.stop_sequence: str | None = None
        self.cache_write_tokens = 0

    # -- events -----------------------------------------------------------------------------------
    def _next(self) -> int:
        """The one place sequence numbers are handed out."""
        n = self._seq
        self._seq = n + 1
        return n

    def _event(self, type_: str, **fields: Any) -> Event:
        """The one event constructor: ``type``, ``sequence_number``, then ``fields`` in order."""
        return {"type": type_, "sequence_number": self._next(), **fields}

    def _delta(self, text: str) -> Event:
        """The next ``*.delta`` event of the open part or function call. The first is built by
        ``_event``; the rest copy it with a new number and text (the per-token hot path)."""
        cur = self._open
        template = cur.template
        if template is None:
            item_id = cur.item["id"]
            kind = cur.part_kind
            if kind is None:  # a function call, or a hosted tool's
                event = self._event(
                    "response.mcp_call_arguments.delta"
                    if cur.kind == "mcp_call"
                    else "response.function_call_arguments.delta",
                    item_id=item_id,
                    output_index=self._oi,
                    delta=text,
                )
            else:
                event = self._event(
                    kind.delta,
                    item_id=item_id,
                    output_index=self._oi,
                    **{kind.index: cur.part_index},
                    delta=text,
                )
            cur.template = event.copy()  # the caller may change its copy (logprobs, renumbering)
            return event
        event = template.copy()
        event["sequence_number"] = self._next()
        event["delta"] = text
        return event

    def _snapshot(self) -> dict[str, Any]:
        snap = dict(self.resource)
        snap["output"] = list(self.resource["output"])
        return snap

    # -- lifecycle --------------------------------------------------------------------------------
    def queued(self) -> list[Event]:
        """A background response waits for a slot: ``response.created`` and ``response.queued``,
        status ``queued``; ``start()`` then emits ``response.in_progress`` alone."""
        if self.state is not ResponseState.NEW:
            raise IllegalTransition("queued() after the response started")
        self.state = ResponseState.QUEUED
        self.resource["status"] = "queued"
        return [
            self._event("response.created", response=self._snapshot()),
            self._event("response.queued", response=self._snapshot()),
        ]

    def start(self) -> list[Event]:
        if self.state not in (ResponseState.NEW, ResponseState.QUEUED):
            raise IllegalTransition("start() called twice")
        was = self.state
        self.state = ResponseState.IN_PROGRESS
        self.resource["status"] = "in_progress"
        events = (
            [self._event("response.created", response=self._snapshot())] if was is ResponseState.NEW else []
        )
        events.append(self._event("response.in_progress", response=self._snapshot()))
        return events

    def feed(self, delta: Delta) -> list[Event]:
        if self.state is not _LIVE:
            raise IllegalTransition(f"delta after the response left in_progress ({self.state.value})")
        match delta:
            case TextDelta():
                events = self._piece(_TEXT, delta.text)
                logprobs = delta.logprobs
                if logprobs:
                    events[-1]["logprobs"] = logprobs
                    cur = self._open
                    if cur.logprobs is None:
                        cur.logprobs = []
                    cur.logprobs.extend(logprobs)
                return events
            case ToolCallArgsDelta():
                return self._args(delta)
            case ReasoningSummaryDelta():
                return self._summary(delta)
            case ReasoningDelta():
                return self._piece(_REASONING, delta.text)
            case RefusalDelta():
                return self._piece(_REFUSAL, delta.text)
            case ToolCallStart():
                return self._call_start(delta)
            case ReasoningEncrypted():
                events = [] if self._open.is_open("reasoning") else self._open_item(_new_item("reasoning"))
                self._open.item["encrypted_content"] = delta.content
                return events
            case Usage():
                self._usage(delta)
                return []
            case Finish():
                self._finish = delta.reason
                self.stop_sequence = delta.stop_sequence
                return []
            case ItemDone():
                return self._close_item(OutputState.COMPLETED)
            case _:
                raise IllegalTransition(f"unknown delta {type(delta).__name__}")

    def compaction(self, item: dict[str, Any]) -> list[Event]:
        """A ``compaction`` item the gateway sealed before sampling (inline compaction), as the
        response's first output item: ``output_item.added`` (its ``encrypted_content`` still
        empty), ``response.compaction.compacting``, ``output_item.done`` with the sealed item."""
        if self.state is not _LIVE or self._oi != -1:
            raise IllegalTransition("a compaction item comes right after start(), before any output")
        item = {**item, "status": "in_progress"}
        events = self._open_item(item)
        events[-1]["item"]["encrypted_content"] = ""
        events.append(
            self._event("response.compaction.compacting", item_id=item["id"], output_index=self._oi)
        )
        events += self._close_item(OutputState.COMPLETED)
        return events

    def finish(self) -> list[Event]:
        """Close what is open and emit the terminal event (completed, or incomplete on length)."""
        if self.state is not _LIVE:
            raise IllegalTransition(f"finish() after the response left in_progress ({self.state.value})")
        reason = _INCOMPLETE_REASON.get(self._finish or "")
        events = self._close_item(OutputState.INCOMPLETE if reason else OutputState.COMPLETED)
        events += self._unpark()
        res = self.resource
        if reason:
            self.state = ResponseState.INCOMPLETE
            res["status"] = "incomplete"
            res["incomplete_details"] = {"reason": reason}
            etype = "response.incomplete"
        else:
            self.state = ResponseState.COMPLETED
            res["status"] = "completed"
            etype = "response.completed"
        res["completed_at"] = int(time.time())
        events.append(self._event(etype, response=res))
        return events

    @property
    def call_open(self) -> bool:
        """A function call's arguments are still streaming (not a safe boundary to stop at)."""
        cur = self._open
        return cur.state is _OPEN and cur.kind in _CALL_KINDS

    def interrupt(self, reason: str) -> list[Event]:
        """End the response at a safe boundary (steering): the open part is closed with the text so
        far (its two ``*.done`` events), the open item with ``output_item.done`` (a cut message or
        reasoning item as ``incomplete``; a function call, whose arguments the caller let finish, as
        ``completed``), then ``response.incomplete`` with ``incomplete_details.reason``."""
        if self.state is not _LIVE:
            raise IllegalTransition(f"interrupt() after the response left in_progress ({self.state.value})")
        cut = OutputState.COMPLETED if self.call_open else OutputState.INCOMPLETE
        events = self._close_item(cut)
        events += self._unpark()
        res = self.resource
        self.state = ResponseState.INCOMPLETE
        res["status"] = "incomplete"
        res["incomplete_details"] = {"reason": reason}
        res["completed_at"] = int(time.time())
        events.append(self._event("response.incomplete", response=res))
        return events

    def fail(self, error: GatewayError) -> list[Event]:
        """``error`` then ``response.failed``. Open items are left ``incomplete`` in the final output."""
        if self.state in _TERMINAL:
            raise IllegalTransition(f"fail() after the response ended ({self.state.value})")
        started = self.state is ResponseState.IN_PROGRESS
        self._cut_open()
        self.state = ResponseState.FAILED
        return self._failed(error, started)

    def cancel(self) -> list[Event]:
        """End a background response its client cancelled: open items are left ``incomplete`` in
        the final output (as by ``fail()``), then ``response.cancelled`` with status ``cancelled``."""
        if self.state not in (_LIVE, ResponseState.QUEUED):
            raise IllegalTransition(f"cancel() after the response left in_progress ({self.state.value})")
        self._cut_open()
        self.state = ResponseState.CANCELLED
        self.resource["status"] = "cancelled"
        return [self._event("response.cancelled", response=self.resource)]

    def _cut_open(self) -> None:
        cur = self._open
        if cur.state is _OPEN:  # keep what was streamed so far in the final snapshot
            if cur.part_state is _OPEN:
                cur.end_part(OutputState.INCOMPLETE)
            elif cur.kind in _CALL_KINDS:
                cur.item["arguments"] = "".join(cur.texts)
            cur.end(OutputState.INCOMPLETE)
        for item in self._parked.values():  # hosted calls never executed
            item["status"] = "incomplete"
        self._parked.clear()

    def revoke(self, error: GatewayError) -> list[Event]:
        """Replace a terminal event computed by ``finish()`` but not yet sent with ``error`` +
        ``response.failed`` (e.g. the response could not be persisted)."""
        if self.state not in (ResponseState.COMPLETED, ResponseState.INCOMPLETE):
            raise IllegalTransition(f"revoke() in state {self.state.value}")
        self._seq -= 1  # the unsent terminal event's number is reused
        self.state = ResponseState.FAILED
        self.resource["completed_at"] = None
        self.resource["incomplete_details"] = None
        return self._failed(error, True)

    def _failed(self, error: GatewayError, error_event: bool) -> list[Event]:
        res = self.resource
        res["status"] = "failed"
        res["error"] = error.response_error()
        events = [error.stream_event(self._next())] if error_event and self._error_event else []
        events.append(self._event("response.failed", response=res))
        return events

    # -- items ------------------------------------------------------------------------------------
    def _open_item(self, item: dict[str, Any]) -> list[Event]:
        """Close the open item, if any, and open ``item``."""
        events = self._close_item(OutputState.COMPLETED)
        self._oi += 1
        self._open = _OpenItem(item)
        self.resource["output"].append(item)
        added = {k: (list(v) if isinstance(v, list) else v) for k, v in item.items()}
        events.append(self._event("response.output_item.added", output_index=self._oi, item=added))
        return events

    def _close_item(self, to: OutputState) -> list[Event]:
        """Close the open item, if any, as ``to``."""
        cur = self._open
        if cur.state is not _OPEN:
            return []
        item = cur.item
        events = self._close_part()
        kind = cur.kind
        if kind in _CALL_KINDS:
            item["arguments"] = "".join(cur.texts)
            if kind != "mcp_approval_request":  # an approval request's arguments are not streamed
                events.append(
                    self._event(
                        "response.mcp_call_arguments.done"
                        if kind == "mcp_call"
                        else "response.function_call_arguments.done",
                        item_id=item["id"],
                        output_index=self._oi,
                        arguments=item["arguments"],
                    )
                )
            if kind == "mcp_call" and to is OutputState.COMPLETED:
                cur.park()  # executed after this upstream call; closed by hosted_done
                self._parked[self._oi] = item
                return events
        cur.end(to)
        events.append(self._event("response.output_item.done", output_index=self._oi, item=item))
        return events

    # -- parts ------------------------------------------------------------------------------------
    def _piece(self, kind: _PartKind, text: str) -> list[Event]:
        """``text`` for a part of ``kind``: the open one, or a new one (in a new item if need be)."""
        cur = self._open
        if cur.part_state is _OPEN and cur.part_kind is kind:
            cur.texts.append(text)
            return [self._delta(text)]
        return self._new_piece(kind, text)

    def _new_piece(self, kind: _PartKind, text: str) -> list[Event]:
        events = self._open_part(kind)
        self._open.texts.append(text)
        events.append(self._delta(text))
        return events

    def _summary(self, d: ReasoningSummaryDelta) -> list[Event]:
        """Summary text for the adapter's summary part ``d.part``. A number not seen in this reasoning
        item opens the next summary part (numbered densely, in order, whatever the adapter's
        numbers); a part once closed takes no more text."""
        cur = self._open
        if cur.part_state is _OPEN and cur.part_kind is _SUMMARY and cur.summary_key == d.part:
            cur.texts.append(d.text)
            return [self._delta(d.text)]
        if d.part in cur.summary_keys and cur.is_open("reasoning"):
            raise IllegalTransition(f"reasoning summary part {d.part} is already closed")
        events = self._new_piece(_SUMMARY, d.text)
        cur = self._open  # perhaps a new reasoning item
        cur.summary_keys.add(d.part)
        cur.summary_key = d.part
        return events

    def _open_part(self, kind: _PartKind) -> list[Event]:
        if self._open.is_open(kind.item):
            events = self._close_part()
        else:
            events = self._open_item(_new_item(kind.item))
        cur = self._open
        item = cur.item
        parts = item.setdefault(kind.parts, [])
        part: dict[str, Any] = {"type": kind.type, kind.key: ""}
        if kind is _TEXT:
            part["annotations"] = []
        parts.append(part)
        index = len(parts) - 1
        cur.open_part(kind, part, index)
        events.append(
            self._event(
                kind.added, item_id=item["id"], output_index=self._oi, **{kind.index: index}, part=dict(part)
            )
        )
        return events

    def _close_part(self) -> list[Event]:
        """Close the open part, if any: its ``*.done`` event, then the part's."""
        cur = self._open
        if cur.part_state is not _OPEN:
            return []
        kind = cur.part_kind
        assert kind is not None
        text = cur.end_part(OutputState.COMPLETED)
        part = cur.part
        item_id = cur.item["id"]
        index = {kind.index: cur.part_index}
        done = self._event(kind.done, item_id=item_id, output_index=self._oi, **index, **{kind.key: text})
        if cur.logprobs is not None:
            part["logprobs"] = done["logprobs"] = cur.logprobs
            cur.logprobs = None
        return [done, self._event(kind.part_done, item_id=item_id, output_index=self._oi, **index, part=part)]

    # -- function calls ---------------------------------------------------------------------------
    def _call_start(self, d: ToolCallStart) -> list[Event]:
        if d.key in self._call_keys:
            raise IllegalTransition(f"tool call {d.key!r} started twice")
        if d.call_id is not None and any(v.get("call_id") == d.call_id for v in self._call_keys.values()):
            raise IllegalTransition(f"duplicate tool call id {d.call_id!r}")
        hosted = self.hosted.get(d.name) if self.hosted else None
        if hosted is not None:
            return self._hosted_start(d, hosted)
        self.handoff = True
        item = {
            "id": new_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": d.call_id or new_id("call"),
            "name": d.name,
            "arguments": "",
        }
        self._call_keys[d.key] = item
        return self._open_item(item)

    def _args(self, d: ToolCallArgsDelta) -> list[Event]:
        cur = self._open
        if self._call_keys.get(d.key) is not cur.item or cur.state is not _OPEN:
            raise IllegalTransition(f"arguments for a tool call that is not open ({d.key!r})")
        cur.texts.append(d.delta)
        if cur.kind == "mcp_approval_request":
            return []
        return [self._delta(d.delta)]

    # -- hosted tools (gateway/engine/hosted.py) ----------------------------------------------------
    def _hosted_start(self, d: ToolCallStart, hosted: HostedFunction) -> list[Event]:
        """The model calls a hosted tool: an ``mcp_call`` item (its arguments stream as
        ``response.mcp_call_arguments.*``), or an ``mcp_approval_request`` when the client must
        approve the call first (it is announced whole, once its arguments are complete)."""
        label = hosted.server.label
        item: dict[str, Any]
        if hosted.approval:
            self.handoff = True
            item = {
                "id": new_id("mcpr"),
                "type": "mcp_approval_request",
                "status": "in_progress",
                "server_label": label,
                "name": hosted.tool,
                "arguments": "",
            }
        else:
            item = {
                "id": new_id("mcp"),
                "type": "mcp_call",
                "status": "in_progress",
                "server_label": label,
                "name": hosted.tool,
                "arguments": "",
                "output": None,
                "error": None,
                "approval_request_id": None,
            }
        self._call_keys[d.key] = item
        events = self._open_item(item)
        if not hosted.approval:
            events.append(
                self._event("response.mcp_call.in_progress", item_id=item["id"], output_index=self._oi)
            )
        return events

    def end_round(self) -> list[Event]:
        """The upstream call ended: close its open item (a hosted call's is parked)."""
        if self.state is not _LIVE:
            raise IllegalTransition(f"end_round() after the response left in_progress ({self.state.value})")
        return self._close_item(OutputState.COMPLETED)

    def parked(self) -> list[tuple[int, dict[str, Any]]]:
        """The hosted calls whose arguments are complete and that await execution, in output order
        (their ``output_index`` and item)."""
        return sorted(self._parked.items())

    def hosted_done(self, index: int, outcome: Mapping[str, Any]) -> list[Event]:
        """The parked call at ``index`` was executed: ``outcome`` sets its ``output``, ``error`` and
        ``status`` (completed | failed); ``response.mcp_call.completed`` (or ``.failed``) and its
        ``output_item.done``."""
        if self.state is not _LIVE:
            raise IllegalTransition(f"hosted_done() after the response left in_progress ({self.state.value})")
        item = self._parked.pop(index, None)
        if item is None:
            raise IllegalTransition(f"no hosted call awaits execution at output_index {index}")
        item.update(outcome)
        return [
            self._event(_HOSTED_EVENTS[item["status"]], item_id=item["id"], output_index=index),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def announce(self, item: dict[str, Any]) -> list[Event]:
        """An item the gateway made before sampling, with its events: a listing (``mcp_list_tools``:
        added with no tools, ``response.mcp_list_tools.in_progress`` and ``.completed``, done), or
        an approved call it executed (``mcp_call``: added, in_progress, its arguments, completed or
        failed, done)."""
        if self.state is not _LIVE:
            raise IllegalTransition("announce() outside an in-progress response")
        events = self._close_item(OutputState.COMPLETED)
        final = {**item, "status": "completed" if item.get("status") is None else item["status"]}
        self._oi += 1
        index = self._oi
        self._open = _OpenItem(_NO_ITEM, None)
        self.resource["output"].append(final)
        kind = item["type"]
        added = {**final, "status": "in_progress"}
        item_id = item["id"]
        if kind == "mcp_list_tools":
            added["tools"] = []
            steps = ["response.mcp_list_tools.in_progress", "response.mcp_list_tools.completed"]
        else:
            added.update(output=None, error=None)
            steps = ["response.mcp_call.in_progress"]
        events.append(self._event("response.output_item.added", output_index=index, item=added))
        for step in steps:
            events.append(self._event(step, item_id=item_id, output_index=index))
        if kind == "mcp_call":
            events.append(
                self._event(
                    "response.mcp_call_arguments.done",
                    item_id=item_id,
                    output_index=index,
                    arguments=item["arguments"],
                )
            )
            events.append(self._event(_HOSTED_EVENTS[final["status"]], item_id=item_id, output_index=index))
        events.append(self._event("response.output_item.done", output_index=index, item=final))
        return events

    def next_round(self) -> None:
        """Another upstream call of the same response begins (after hosted calls): its usage adds
        to the earlier calls', and its finish reason replaces theirs."""
        self._base_usage = self.resource.get("usage")
        self._base_cache_writes = self.cache_write_tokens
        self._finish = None

    def _unpark(self) -> list[Event]:
        """Hosted calls still parked when the response ends (not executed): closed incomplete."""
        events: list[Event] = []
        for index, item in self.parked():
            item["status"] = "incomplete"
            events.append(self._event("response.output_item.done", output_index=index, item=item))
        self._parked.clear()
        return events

    # -- usage ------------------------------------------------------------------------------------
    def _usage(self, u: Usage) -> None:
        inp, out, cached, reasoning = u.input_tokens, u.output_tokens, u.cached_tokens, u.reasoning_tokens
        base = self._base_usage
        if base is not None:  # the response's earlier upstream calls (hosted tools' rounds)
            inp += base["input_tokens"]
            out += base["output_tokens"]
            cached += base["input_tokens_details"]["cached_tokens"]
            reasoning += base["output_tokens_details"]["reasoning_tokens"]
        self.cache_write_tokens = self._base_cache_writes + u.cache_write_tokens
        self.resource["usage"] = {
            "input_tokens": inp,
            "output_tokens": out,
            "total_tokens": inp + out,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens_details": {"reasoning_tokens": reasoning},
        }
