"""The one ResponseBuilder: a pure, synchronous reducer from normalized deltas to spec events.

It alone assigns item ids, ``output_index``, ``content_index``, ``summary_index`` and
``sequence_number``, enforces the response / item / content-part state machines, and
accumulates the final ResponseResource. ``start()``, ``feed(delta)``, ``finish()`` and
``fail(error)`` each return the events to send, in order. An illegal transition raises
``IllegalTransition`` and leaves the builder able to ``fail()`` cleanly.
"""

from __future__ import annotations

import time
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
from gateway.kernel.errors import GatewayError, UpstreamError
from gateway.kernel.ids import new_id

Event = dict[str, Any]


class IllegalTransition(UpstreamError):
    """The delta sequence broke a state machine (an adapter or upstream bug)."""

    code = "upstream_protocol_error"


class ResponseState(Enum):
    NEW = "new"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"


_TERMINAL = (ResponseState.COMPLETED, ResponseState.INCOMPLETE, ResponseState.FAILED)
_INCOMPLETE_REASON = {"length": "max_output_tokens", "content_filter": "content_filter"}


class ResponseBuilder:
    __slots__ = (
        "_call_keys",
        "_closed_calls",
        "_error_event",
        "_finish",
        "_item",
        "_item_kind",
        "_logprobs",
        "_oi",
        "_part",
        "_part_index",
        "_part_kind",
        "_seq",
        "_sub",
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
        self._item: dict[str, Any] | None = None
        self._item_kind = ""
        self._part: dict[str, Any] | None = None
        self._part_kind = ""
        self._part_index = -1
        self._sub: tuple[str, int] | None = None  # reasoning: ("summary"|"content", index)
        self._texts: list[str] = []
        self._logprobs: list[dict[str, Any]] | None = None  # of the open output_text part, if any came
        self._call_keys: dict[int | str, dict[str, Any]] = {}
        self._closed_calls: set[int | str] = set()
        self._finish: str | None = None

    # -- helpers --------------------------------------------------------------------------------
    def _next(self) -> int:
        n = self._seq
        self._seq = n + 1
        return n

    def _snapshot(self) -> dict[str, Any]:
        snap = dict(self.resource)
        snap["output"] = list(self.resource["output"])
        return snap

    def _require_open(self) -> None:
        if self.state is not ResponseState.IN_PROGRESS:
            raise IllegalTransition(f"delta after the response left in_progress ({self.state.value})")

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> list[Event]:
        if self.state is not ResponseState.NEW:
            raise IllegalTransition("start() called twice")
        self.state = ResponseState.IN_PROGRESS
        self.resource["status"] = "in_progress"
        return [
            {"type": "response.created", "sequence_number": self._next(), "response": self._snapshot()},
            {"type": "response.in_progress", "sequence_number": self._next(), "response": self._snapshot()},
        ]

    def feed(self, delta: Delta) -> list[Event]:
        self._require_open()
        kind = type(delta)
        if kind is TextDelta:
            events = self._content(delta.text, "output_text")  # type: ignore[union-attr]
            logprobs = delta.logprobs  # type: ignore[union-attr]
            if logprobs:
                events[-1]["logprobs"] = logprobs
                if self._logprobs is None:
                    self._logprobs = []
                self._logprobs.extend(logprobs)
            return events
        if kind is ToolCallArgsDelta:
            return self._args(delta)  # type: ignore[arg-type]
        if kind is ToolCallStart:
            return self._call_start(delta)  # type: ignore[arg-type]
        if kind is RefusalDelta:
            return self._content(delta.text, "refusal")  # type: ignore[union-attr]
        if kind is ReasoningDelta:
            return self._reasoning(("content", 0), delta.text)  # type: ignore[union-attr]
        if kind is ReasoningSummaryDelta:
            return self._reasoning(("summary", delta.part), delta.text)  # type: ignore[union-attr]
        if kind is ReasoningEncrypted:
            events = [] if self._item_kind == "reasoning" else self._open_reasoning()
            assert self._item is not None
            self._item["encrypted_content"] = delta.content  # type: ignore[union-attr]
            return events
        if kind is Usage:
            self._usage(delta)  # type: ignore[arg-type]
            return []
        if kind is Finish:
            self._finish = delta.reason  # type: ignore[union-attr]
            return []
        if kind is ItemDone:
            return self._close_item("completed")
        raise IllegalTransition(f"unknown delta {kind.__name__}")

    def finish(self) -> list[Event]:
        """Close what is open and emit the terminal event (completed, or incomplete on length)."""
        self._require_open()
        reason = _INCOMPLETE_REASON.get(self._finish or "")
        events = self._close_item("incomplete" if reason else "completed")
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
        events.append({"type": etype, "sequence_number": self._next(), "response": res})
        return events

    def fail(self, error: GatewayError) -> list[Event]:
        """``error`` then ``response.failed``. Open items are left ``incomplete`` in the final output."""
        if self.state in _TERMINAL:
            raise IllegalTransition(f"fail() after the response ended ({self.state.value})")
        started = self.state is ResponseState.IN_PROGRESS
        if self._item is not None:
            if self._part is not None:  # keep what was streamed so far in the final snapshot
                key = "refusal" if self._part_kind == "refusal" else "text"
                self._part[key] = "".join(self._texts)
                self._part = None
            self._item["status"] = "incomplete"
            self._item = None
        self.state = ResponseState.FAILED
        res = self.resource
        res["status"] = "failed"
        res["error"] = error.response_error()
        events = [error.stream_event(self._next())] if started and self._error_event else []
        events.append({"type": "response.failed", "sequence_number": self._next(), "response": res})
        return events

    def revoke(self, error: GatewayError) -> list[Event]:
        """Replace a terminal event computed by ``finish()`` but not yet sent with ``error`` +
        ``response.failed`` (e.g. the response could not be persisted)."""
        if self.state not in (ResponseState.COMPLETED, ResponseState.INCOMPLETE):
            raise IllegalTransition(f"revoke() in state {self.state.value}")
        self._seq -= 1  # the unsent terminal event's number is reused
        self.state = ResponseState.FAILED
        res = self.resource
        res["status"] = "failed"
        res["completed_at"] = None
        res["incomplete_details"] = None
        res["error"] = error.response_error()
        events = [error.stream_event(self._next())] if self._error_event else []
        events.append({"type": "response.failed", "sequence_number": self._next(), "response": res})
        return events

    @property
    def finish_reason(self) -> str | None:
        return self._finish

    # -- items ------------------------------------------------------------------------------------
    def _open_item(self, item: dict[str, Any], kind: str) -> list[Event]:
        events = self._close_item("completed")
        self._oi += 1
        self._item = item
        self._item_kind = kind
        self._part_index = -1
        self.resource["output"].append(item)
        added = {k: (list(v) if isinstance(v, list) else v) for k, v in item.items()}
        events.append(
            {
                "type": "response.output_item.added",
                "sequence_number": self._next(),
                "output_index": self._oi,
                "item": added,
            }
        )
        return events

    def _close_item(self, status: str) -> list[Event]:
        item = self._item
        if item is None:
            return []
        events = self._close_part() if self._item_kind != "reasoning" else self._close_sub()
        if self._item_kind == "function_call":
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    "sequence_number": self._next(),
                    "item_id": item["id"],
                    "output_index": self._oi,
                    "arguments": item["arguments"],
                }
            )
            self._closed_calls.update(k for k, v in self._call_keys.items() if v is item)
        item["status"] = status
        self._item = None
        self._item_kind = ""
        events.append(
            {
                "type": "response.output_item.done",
                "sequence_number": self._next(),
                "output_index": self._oi,
                "item": item,
            }
        )
        return events

    # -- message content ---------------------------------------------------------------------------
    def _content(self, text: str, part_kind: str) -> list[Event]:
        events: list[Event] = []
        if self._item_kind != "message":
            events = self._open_item(
                {
                    "id": new_id("msg"),
                    "type": "message",
                    "status": "in_progress",
                    "role": "assistant",
                    "content": [],
                },
                "message",
            )
        if self._part_kind != part_kind:
            events += self._close_part()
            events += self._open_part(part_kind)
        self._texts.append(text)
        events.append(
            {
                "type": "response.output_text.delta"
                if part_kind == "output_text"
                else "response.refusal.delta",
                "sequence_number": self._next(),
                "item_id": self._item["id"],  # type: ignore[index]
                "output_index": self._oi,
                "content_index": self._part_index,
                "delta": text,
            }
        )
        return events

    def _open_part(self, part_kind: str) -> list[Event]:
        assert self._item is not None
        if part_kind == "output_text":
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": []}
        else:
            part = {"type": "refusal", "refusal": ""}
        self._part_index += 1
        self._part = part
        self._part_kind = part_kind
        self._texts = []
        self._logprobs = None
        self._item["content"].append(part)
        return [
            {
                "type": "response.content_part.added",
                "sequence_number": self._next(),
                "item_id": self._item["id"],
                "output_index": self._oi,
                "content_index": self._part_index,
                "part": dict(part),
            }
        ]

    def _close_part(self) -> list[Event]:
        part = self._part
        if part is None:
            return []
        item_id = self._item["id"]  # type: ignore[index]
        text = "".join(self._texts)
        if self._part_kind == "output_text":
            part["text"] = text
            done: Event = {
                "type": "response.output_text.done",
                "sequence_number": self._next(),
                "item_id": item_id,
                "output_index": self._oi,
                "content_index": self._part_index,
                "text": text,
            }
            if self._logprobs is not None:
                part["logprobs"] = done["logprobs"] = self._logprobs
                self._logprobs = None
        else:
            part["refusal"] = text
            done = {
                "type": "response.refusal.done",
                "sequence_number": self._next(),
                "item_id": item_id,
                "output_index": self._oi,
                "content_index": self._part_index,
                "refusal": text,
            }
        self._part = None
        self._part_kind = ""
        return [
            done,
            {
                "type": "response.content_part.done",
                "sequence_number": self._next(),
                "item_id": item_id,
                "output_index": self._oi,
                "content_index": self._part_index,
                "part": part,
            },
        ]

    # -- function calls ------------------------------------------------------------------------------
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
        events = self._open_item(item, "function_call")
        self._call_keys[d.key] = item
        return events

    def _args(self, d: ToolCallArgsDelta) -> list[Event]:
        item = self._call_keys.get(d.key)
        if item is None or d.key in self._closed_calls or item is not self._item:
            raise IllegalTransition(f"arguments for a tool call that is not open ({d.key!r})")
        item["arguments"] += d.delta
        return [
            {
                "type": "response.function_call_arguments.delta",
                "sequence_number": self._next(),
                "item_id": item["id"],
                "output_index": self._oi,
                "delta": d.delta,
            }
        ]

    # -- reasoning -----------------------------------------------------------------------------------
    def _open_reasoning(self) -> list[Event]:
        self._sub = None
        return self._open_item(
            {"id": new_id("rs"), "type": "reasoning", "status": "in_progress", "summary": []}, "reasoning"
        )

    def _reasoning(self, sub: tuple[str, int], text: str) -> list[Event]:
        events = [] if self._item_kind == "reasoning" else self._open_reasoning()
        item = self._item
        assert item is not None
        if self._sub != sub:
            events += self._close_sub()
            kind, index = sub
            if kind == "summary":
                if index != len(item["summary"]):
                    index = len(item["summary"])  # summary indexes are dense, in order
                    sub = ("summary", index)
                part = {"type": "summary_text", "text": ""}
                item["summary"].append(part)
                events.append(
                    {
                        "type": "response.reasoning_summary_part.added",
                        "sequence_number": self._next(),
                        "item_id": item["id"],
                        "output_index": self._oi,
                        "summary_index": index,
                        "part": dict(part),
                    }
                )
            else:
                content = item.setdefault("content", [])
                index = len(content)
                sub = ("content", index)
                part = {"type": "reasoning_text", "text": ""}
                content.append(part)
                events.append(
                    {
                        "type": "response.content_part.added",
                        "sequence_number": self._next(),
                        "item_id": item["id"],
                        "output_index": self._oi,
                        "content_index": index,
                        "part": dict(part),
                    }
                )
            self._sub = sub
            self._part = part
            self._texts = []
        self._texts.append(text)
        kind, index = self._sub  # type: ignore[misc]
        if kind == "summary":
            events.append(
                {
                    "type": "response.reasoning_summary_text.delta",
                    "sequence_number": self._next(),
                    "item_id": item["id"],
                    "output_index": self._oi,
                    "summary_index": index,
                    "delta": text,
                }
            )
        else:
            events.append(
                {
                    "type": "response.reasoning.delta",
                    "sequence_number": self._next(),
                    "item_id": item["id"],
                    "output_index": self._oi,
                    "content_index": index,
                    "delta": text,
                }
            )
        return events

    def _close_sub(self) -> list[Event]:
        if self._sub is None or self._part is None:
            self._sub = None
            return []
        kind, index = self._sub
        part = self._part
        item_id = self._item["id"]  # type: ignore[index]
        text = "".join(self._texts)
        part["text"] = text
        self._sub = None
        self._part = None
        if kind == "summary":
            return [
                {
                    "type": "response.reasoning_summary_text.done",
                    "sequence_number": self._next(),
                    "item_id": item_id,
                    "output_index": self._oi,
                    "summary_index": index,
                    "text": text,
                },
                {
                    "type": "response.reasoning_summary_part.done",
                    "sequence_number": self._next(),
                    "item_id": item_id,
                    "output_index": self._oi,
                    "summary_index": index,
                    "part": part,
                },
            ]
        return [
            {
                "type": "response.reasoning.done",
                "sequence_number": self._next(),
                "item_id": item_id,
                "output_index": self._oi,
                "content_index": index,
                "text": text,
            },
            {
                "type": "response.content_part.done",
                "sequence_number": self._next(),
                "item_id": item_id,
                "output_index": self._oi,
                "content_index": index,
                "part": part,
            },
        ]

    # -- usage ---------------------------------------------------------------------------------------
    def _usage(self, u: Usage) -> None:
        self.resource["usage"] = {
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "total_tokens": u.input_tokens + u.output_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        }
