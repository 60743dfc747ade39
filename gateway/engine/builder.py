"""The one ResponseBuilder: a pure, synchronous reducer from normalized deltas to spec events.

It alone assigns item ids, ``output_index``, ``content_index``, ``summary_index`` and
``sequence_number``, enforces the response / item / content-part state machines
(``ResponseState``, ``ItemState``, ``PartState``), and accumulates the final ResponseResource.
``start()``, ``feed(delta)``, ``finish()`` and ``fail(error)`` each return the events to send, in
order. An illegal transition raises ``IllegalTransition`` and leaves the builder able to
``fail()`` cleanly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

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

Event = dict[str, Any]


class ResponseState(Enum):
    NEW = "new"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"


class ItemState(Enum):
    """An output item: ``in_progress`` until closed, once, as ``completed`` or ``incomplete``.
    The values are the item's wire ``status``."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"


class PartState(Enum):
    """A content part or reasoning summary part: ``in_progress`` from its ``*.added`` event, then
    ``completed`` with its two ``*.done`` events, or ``incomplete`` when ``fail()`` cuts it off."""

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
_ITEM_OPEN = ItemState.IN_PROGRESS
_PART_OPEN = PartState.IN_PROGRESS
_TERMINAL = (ResponseState.COMPLETED, ResponseState.INCOMPLETE, ResponseState.FAILED)
_INCOMPLETE_REASON = {"length": "max_output_tokens", "content_filter": "content_filter"}


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


class ResponseBuilder:
    __slots__ = (
        "_call_keys",
        "_error_event",
        "_finish",
        "_item",
        "_item_kind",
        "_item_state",
        "_kind",
        "_logprobs",
        "_oi",
        "_part",
        "_part_index",
        "_part_state",
        "_seq",
        "_summary_key",
        "_summary_keys",
        "_template",
        "_texts",
        "resource",
        "state",
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
        # The latest item and part; the states say whether they are still open.
        self._item: dict[str, Any] = {}
        self._item_kind = ""
        self._item_state: ItemState | None = None
        self._part: dict[str, Any] = {}
        self._kind: _PartKind | None = None
        self._part_index = -1
        self._part_state: PartState | None = None
        self._summary_keys: set[int] = set()  # the adapter's summary part numbers seen in this item
        self._summary_key = -1  # the open summary part's
        self._texts: list[str] = []  # the open part's (or call's arguments') pieces
        self._logprobs: list[dict[str, Any]] | None = None  # of the open output_text part, if any came
        self._template: Event | None = None  # a copy of the open part's (or call's) first delta event
        self._call_keys: dict[int | str, dict[str, Any]] = {}
        self._finish: str | None = None

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
        template = self._template
        if template is None:
            item_id = self._item["id"]
            kind = self._kind
            if kind is None:  # a function call
                event = self._event(
                    "response.function_call_arguments.delta",
                    item_id=item_id,
                    output_index=self._oi,
                    delta=text,
                )
            else:
                event = self._event(
                    kind.delta,
                    item_id=item_id,
                    output_index=self._oi,
                    **{kind.index: self._part_index},
                    delta=text,
                )
            self._template = event.copy()  # the caller may change its copy (logprobs, renumbering)
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
    def start(self) -> list[Event]:
        if self.state is not ResponseState.NEW:
            raise IllegalTransition("start() called twice")
        self.state = ResponseState.IN_PROGRESS
        self.resource["status"] = "in_progress"
        return [
            self._event("response.created", response=self._snapshot()),
            self._event("response.in_progress", response=self._snapshot()),
        ]

    def feed(self, delta: Delta) -> list[Event]:
        if self.state is not _LIVE:
            raise IllegalTransition(f"delta after the response left in_progress ({self.state.value})")
        match delta:
            case TextDelta():
                events = self._piece(_TEXT, delta.text)
                logprobs = delta.logprobs
                if logprobs:
                    events[-1]["logprobs"] = logprobs
                    if self._logprobs is None:
                        self._logprobs = []
                    self._logprobs.extend(logprobs)
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
                events = [] if self._item_open("reasoning") else self._open_item(_new_item("reasoning"))
                self._item["encrypted_content"] = delta.content
                return events
            case Usage():
                self._usage(delta)
                return []
            case Finish():
                self._finish = delta.reason
                return []
            case ItemDone():
                return self._close_item(ItemState.COMPLETED)
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
        events += self._close_item(ItemState.COMPLETED)
        return events

    def finish(self) -> list[Event]:
        """Close what is open and emit the terminal event (completed, or incomplete on length)."""
        if self.state is not _LIVE:
            raise IllegalTransition(f"finish() after the response left in_progress ({self.state.value})")
        reason = _INCOMPLETE_REASON.get(self._finish or "")
        events = self._close_item(ItemState.INCOMPLETE if reason else ItemState.COMPLETED)
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
        return self._item_state is _ITEM_OPEN and self._item_kind == "function_call"

    def interrupt(self, reason: str) -> list[Event]:
        """End the response at a safe boundary (steering): the open part is closed with the text so
        far (its two ``*.done`` events), the open item with ``output_item.done`` (a cut message or
        reasoning item as ``incomplete``; a function call, whose arguments the caller let finish, as
        ``completed``), then ``response.incomplete`` with ``incomplete_details.reason``."""
        if self.state is not _LIVE:
            raise IllegalTransition(f"interrupt() after the response left in_progress ({self.state.value})")
        cut = ItemState.COMPLETED if self.call_open else ItemState.INCOMPLETE
        events = self._close_item(cut)
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
        if self._item_state is _ITEM_OPEN:  # keep what was streamed so far in the final snapshot
            if self._part_state is _PART_OPEN:
                self._end_part(PartState.INCOMPLETE)
            elif self._item_kind == "function_call":
                self._item["arguments"] = "".join(self._texts)
            self._end_item(ItemState.INCOMPLETE)
        self.state = ResponseState.FAILED
        return self._failed(error, started)

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
    def _item_open(self, kind: str) -> bool:
        return self._item_state is _ITEM_OPEN and self._item_kind == kind

    def _open_item(self, item: dict[str, Any]) -> list[Event]:
        """Close the open item, if any, and open ``item``."""
        events = self._close_item(ItemState.COMPLETED)
        kind = item["type"]
        if kind == "reasoning":
            self._summary_keys = set()
        elif kind == "function_call":
            self._texts = []
            self._template = None
        self._oi += 1
        self._item = item
        self._item_kind = kind
        self._item_state = _ITEM_OPEN
        self._kind = None
        self._part_index = -1
        self._part_state = None
        self.resource["output"].append(item)
        added = {k: (list(v) if isinstance(v, list) else v) for k, v in item.items()}
        events.append(self._event("response.output_item.added", output_index=self._oi, item=added))
        return events

    def _close_item(self, to: ItemState) -> list[Event]:
        """Close the open item, if any, as ``to``."""
        if self._item_state is not _ITEM_OPEN:
            return []
        item = self._item
        events = self._close_part()
        if self._item_kind == "function_call":
            item["arguments"] = "".join(self._texts)
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=self._oi,
                    arguments=item["arguments"],
                )
            )
        self._end_item(to)
        events.append(self._event("response.output_item.done", output_index=self._oi, item=item))
        return events

    def _end_item(self, to: ItemState) -> None:
        """The item state machine: in_progress → completed | incomplete, once."""
        if self._item_state is not _ITEM_OPEN or to is _ITEM_OPEN:
            now = "none" if self._item_state is None else self._item_state.value
            raise IllegalTransition(f"output item {now} cannot become {to.value}")
        self._item_state = to
        self._item["status"] = to.value

    # -- parts ------------------------------------------------------------------------------------
    def _piece(self, kind: _PartKind, text: str) -> list[Event]:
        """``text`` for a part of ``kind``: the open one, or a new one (in a new item if need be)."""
        if self._part_state is _PART_OPEN and self._kind is kind:
            self._texts.append(text)
            return [self._delta(text)]
        return self._new_piece(kind, text)

    def _new_piece(self, kind: _PartKind, text: str) -> list[Event]:
        events = self._open_part(kind)
        self._texts.append(text)
        events.append(self._delta(text))
        return events

    def _summary(self, d: ReasoningSummaryDelta) -> list[Event]:
        """Summary text for the adapter's summary part ``d.part``. A number not seen in this reasoning
        item opens the next summary part (numbered densely, in order, whatever the adapter's
        numbers); a part once closed takes no more text."""
        if self._part_state is _PART_OPEN and self._kind is _SUMMARY and self._summary_key == d.part:
            self._texts.append(d.text)
            return [self._delta(d.text)]
        if d.part in self._summary_keys and self._item_open("reasoning"):
            raise IllegalTransition(f"reasoning summary part {d.part} is already closed")
        events = self._new_piece(_SUMMARY, d.text)
        self._summary_keys.add(d.part)
        self._summary_key = d.part
        return events

    def _open_part(self, kind: _PartKind) -> list[Event]:
        if self._item_open(kind.item):
            events = self._close_part()
        else:
            events = self._open_item(_new_item(kind.item))
        item = self._item
        parts = item.setdefault(kind.parts, [])
        part: dict[str, Any] = {"type": kind.type, kind.key: ""}
        if kind is _TEXT:
            part["annotations"] = []
        parts.append(part)
        self._part = part
        self._kind = kind
        self._part_index = index = len(parts) - 1
        self._part_state = _PART_OPEN
        self._texts = []
        self._logprobs = None
        self._template = None
        events.append(
            self._event(
                kind.added, item_id=item["id"], output_index=self._oi, **{kind.index: index}, part=dict(part)
            )
        )
        return events

    def _close_part(self) -> list[Event]:
        """Close the open part, if any: its ``*.done`` event, then the part's."""
        if self._part_state is not _PART_OPEN:
            return []
        kind = self._kind
        assert kind is not None
        text = self._end_part(PartState.COMPLETED)
        part = self._part
        item_id = self._item["id"]
        index = {kind.index: self._part_index}
        done = self._event(kind.done, item_id=item_id, output_index=self._oi, **index, **{kind.key: text})
        if self._logprobs is not None:
            part["logprobs"] = done["logprobs"] = self._logprobs
            self._logprobs = None
        return [done, self._event(kind.part_done, item_id=item_id, output_index=self._oi, **index, part=part)]

    def _end_part(self, to: PartState) -> str:
        """The part state machine: in_progress → completed | incomplete, once. Returns its text."""
        if self._part_state is not _PART_OPEN or to is _PART_OPEN or self._kind is None:
            now = "none" if self._part_state is None else self._part_state.value
            raise IllegalTransition(f"content part {now} cannot become {to.value}")
        self._part_state = to
        text = self._part[self._kind.key] = "".join(self._texts)
        return text

    # -- function calls ---------------------------------------------------------------------------
    def _call_start(self, d: ToolCallStart) -> list[Event]:
        if d.key in self._call_keys:
            raise IllegalTransition(f"tool call {d.key!r} started twice")
        if d.call_id is not None and any(v["call_id"] == d.call_id for v in self._call_keys.values()):
            raise IllegalTransition(f"duplicate tool call id {d.call_id!r}")
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
        if self._call_keys.get(d.key) is not self._item or self._item_state is not _ITEM_OPEN:
            raise IllegalTransition(f"arguments for a tool call that is not open ({d.key!r})")
        self._texts.append(d.delta)
        return [self._delta(d.delta)]

    # -- usage ------------------------------------------------------------------------------------
    def _usage(self, u: Usage) -> None:
        self.resource["usage"] = {
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "total_tokens": u.input_tokens + u.output_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        }
