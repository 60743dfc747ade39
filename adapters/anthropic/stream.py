"""Pure stream translation: parsed Anthropic Messages stream events → normalized deltas.

Content blocks map by index: ``text`` → assistant text, ``tool_use`` → a function call (key = block
index), ``thinking`` → a reasoning item whose summary is the thinking text and whose
``encrypted_content`` is the signature (``redacted_thinking``: its data, prefixed). Usage and the
finish reason are held until ``message_stop``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from adapters.anthropic.request import REDACTED_PREFIX
from adapters.deltas import (
    Delta,
    Finish,
    FinishReason,
    ItemDone,
    ReasoningEncrypted,
    ReasoningSummaryDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
    as_deltas,
)
from adapters.upstream_errors import error_code_from_body, map_stream_error
from gateway.kernel.errors import UpstreamError

__all__ = ["MessagesStreamTranslator", "stream_error"]

_FINISH: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}
_RETRYABLE_TYPES = frozenset({"overloaded_error", "api_error", "timeout_error"})
_REJECTED_TYPES = frozenset({"invalid_request_error", "request_too_large", "not_found_error"})
_AUTH_TYPES = frozenset({"authentication_error", "permission_error"})


class MessagesStreamTranslator:
    """Feed each parsed event to :meth:`feed`; call :meth:`end` when the body is over."""

    __slots__ = ("_blocks", "_calls", "_done", "_stop_reason", "_stop_sequence", "_usage", "_with_args")

    def __init__(self) -> None:
        self._blocks: dict[int, str] = {}  # content block index → block type
        self._with_args: set[int] = set()  # tool_use blocks that received argument text
        self._calls = 0
        self._usage: dict[str, int] = {}
        self._stop_reason: str | None = None
        self._stop_sequence: str | None = None
        self._done = False

    @property
    def done(self) -> bool:
        """``message_stop`` was seen."""
        return self._done

    def feed(self, event: Mapping[str, Any]) -> list[Delta]:
        """The deltas of one event. Raises ``UpstreamError`` for an ``error`` event."""
        return as_deltas(self.deltas_or_text(event))

    def deltas_or_text(self, event: Mapping[str, Any]) -> list[Delta] | str:
        """:meth:`feed`, but the text alone for a text delta (``adapters.streaming``)."""
        kind = event.get("type")
        if kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":  # the per-token event
                text = delta.get("text")
                if text and type(text) is str:
                    return text
                return [TextDelta(text)] if text else []
            return self._delta(event.get("index", 0), delta)
        if kind == "content_block_start":
            return self._start(event.get("index", 0), event.get("content_block") or {})
        if kind == "content_block_stop":
            return self._stop(event.get("index", 0))
        if kind == "message_start":
            self._take_usage((event.get("message") or {}).get("usage"))
            return []
        if kind == "message_delta":
            delta = event.get("delta") or {}
            self._stop_reason = delta.get("stop_reason") or self._stop_reason
            self._stop_sequence = delta.get("stop_sequence") or self._stop_sequence
            self._take_usage(event.get("usage"))
            return []
        if kind == "message_stop":
            self._done = True
            return self._final()
        if kind == "error":
            raise stream_error(event.get("error"))
        return []  # ping, unknown future events

    def unstreamed_deltas(self, message: Mapping[str, Any]) -> list[Delta]:
        """All deltas of an unstreamed Messages response: its blocks replayed as the events a
        stream would have carried (complete blocks, as ``content_block_start`` allows)."""
        if message.get("type") == "error":
            raise stream_error(message.get("error"))
        out = self.feed({"type": "message_start", "message": {"usage": message.get("usage")}})
        for index, block in enumerate(message.get("content") or []):
            if isinstance(block, Mapping):
                out += self._start(index, block)
                out += self._stop(index)
        self._stop_reason = message.get("stop_reason") or self._stop_reason
        self._stop_sequence = message.get("stop_sequence") or self._stop_sequence
        return out + self.feed({"type": "message_stop"})

    def end(self) -> list[Delta]:
        """Checks the stream ended with ``message_stop``; raises ``UpstreamError`` otherwise."""
        if not self._done:
            raise UpstreamError("The upstream stream ended before the message finished.", retryable=True)
        return []

    # -- internals ---------------------------------------------------------------------------
    def _start(self, index: int, block: Mapping[str, Any]) -> list[Delta]:
        kind = block.get("type") or ""
        self._blocks[index] = kind
        if kind == "text":
            return [TextDelta(block["text"])] if block.get("text") else []
        if kind == "tool_use":
            self._calls += 1
            out: list[Delta] = [ToolCallStart(index, block.get("name") or "", block.get("id") or None)]
            if block.get("input"):  # a complete input (non-incremental servers)
                self._with_args.add(index)
                out.append(ToolCallArgsDelta(index, orjson.dumps(block["input"]).decode()))
            return out
        if kind == "thinking":
            out = [ReasoningSummaryDelta(block["thinking"])] if block.get("thinking") else []
            if block.get("signature"):
                out.append(ReasoningEncrypted(block["signature"]))
            return out
        if kind == "redacted_thinking":
            return [ReasoningEncrypted(REDACTED_PREFIX + (block.get("data") or ""))]
        return []  # server tools and their results: nothing the deltas can carry

    def _delta(self, index: int, delta: Mapping[str, Any]) -> list[Delta]:
        kind = delta.get("type")
        if kind == "input_json_delta":
            if self._blocks.get(index) != "tool_use" or not delta.get("partial_json"):
                return []
            self._with_args.add(index)
            return [ToolCallArgsDelta(index, delta["partial_json"])]
        if kind == "thinking_delta":
            return [ReasoningSummaryDelta(delta["thinking"])] if delta.get("thinking") else []
        if kind == "signature_delta":
            return [ReasoningEncrypted(delta["signature"])] if delta.get("signature") else []
        return []  # citations_delta...

    def _stop(self, index: int) -> list[Delta]:
        kind = self._blocks.get(index)
        if kind == "tool_use" and index not in self._with_args:
            return [ToolCallArgsDelta(index, "{}")]  # a call without parameters
        if kind in ("thinking", "redacted_thinking"):
            return [ItemDone()]  # the next thinking block is a new reasoning item
        return []

    def _take_usage(self, usage: Any) -> None:
        if isinstance(usage, Mapping):
            for key, value in usage.items():
                if isinstance(value, int):
                    self._usage[key] = value

    def _final(self) -> list[Delta]:
        u = self._usage
        cache_read = u.get("cache_read_input_tokens", 0)
        cache_write = u.get("cache_creation_input_tokens", 0)
        out: list[Delta] = []
        if u:
            # Anthropic's input_tokens exclude cached ones; ours include them (OpenAI's meaning).
            out.append(
                Usage(
                    input_tokens=u.get("input_tokens", 0) + cache_read + cache_write,
                    output_tokens=u.get("output_tokens", 0),
                    cached_tokens=cache_read,
                    cache_write_tokens=cache_write,
                )
            )
        reason = _FINISH.get(self._stop_reason or "", "stop")
        if reason == "stop" and self._calls and self._stop_reason != "pause_turn":
            reason = "tool_calls"
        stop = self._stop_sequence if self._stop_reason == "stop_sequence" else None
        out.append(Finish(reason, stop if isinstance(stop, str) else None))
        return out


def stream_error(error: Any) -> UpstreamError:
    """The gateway error for an in-stream ``error`` event's ``error`` object."""
    error = error if isinstance(error, Mapping) else {}
    return map_stream_error(
        error.get("type"),
        error_code_from_body({"error": error}),
        rate_limited="rate_limit_error",
        rejected=_REJECTED_TYPES,
        retryable=_RETRYABLE_TYPES,
        auth=_AUTH_TYPES,
        error=error,
    )
