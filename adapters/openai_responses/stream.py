"""Pure stream translation: parsed Responses API stream events → normalized deltas.

Upstream ids, sequence numbers and indexes are read only to tell items apart; the builder makes
ours. Content that a server sends only in ``response.output_item.done`` (no deltas) is still
delivered. Usage and the finish reason come from the terminal event, last and in that order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.deltas import (
    Delta,
    Finish,
    FinishReason,
    ItemDone,
    ReasoningDelta,
    ReasoningEncrypted,
    ReasoningSummaryDelta,
    RefusalDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
    as_deltas,
)
from adapters.openai_responses.request import wrap_encrypted
from adapters.upstream_errors import error_code_from_body, map_stream_error
from gateway.kernel.errors import UpstreamError

__all__ = ["ResponsesStreamTranslator", "stream_error", "usage_from"]

_RETRYABLE_CODES = frozenset({"server_error", "server_is_overloaded", "overloaded", "slow_down", "timeout"})
_REJECTED_CODES = frozenset(
    {
        "context_length_exceeded",
        "invalid_prompt",
        "invalid_image",
        "invalid_image_url",
        "invalid_base64_image",
    }
)
_INCOMPLETE: dict[str, FinishReason] = {"max_output_tokens": "length", "content_filter": "content_filter"}


class ResponsesStreamTranslator:
    """Feed each parsed event to :meth:`feed`; call :meth:`end` when the body is over."""

    __slots__ = ("_calls", "_done", "_started", "_streamed")

    def __init__(self) -> None:
        self._started: set[int] = set()  # output indexes of calls already announced
        self._streamed: set[int] = set()  # output indexes that produced deltas
        self._calls = 0
        self._done = False

    @property
    def done(self) -> bool:
        """A terminal event (completed or incomplete) was seen."""
        return self._done

    def feed(self, event: Mapping[str, Any]) -> list[Delta]:
        """The deltas of one event. Raises ``UpstreamError`` for ``error`` / ``response.failed``."""
        return as_deltas(self.deltas_or_text(event))

    def deltas_or_text(self, event: Mapping[str, Any]) -> list[Delta] | str:
        """:meth:`feed`, but the text alone for a text delta without logprobs
        (``adapters.streaming``)."""
        kind = event.get("type")
        oi = event.get("output_index", 0)
        if kind == "response.output_text.delta":
            text = event.get("delta")
            logprobs = event.get("logprobs")
            if text and type(text) is str and not logprobs:  # the per-token event
                self._streamed.add(oi)
                return text
            return self._piece(oi, TextDelta(text or "", logprobs or None))
        if kind == "response.function_call_arguments.delta":
            return self._piece(oi, ToolCallArgsDelta(oi, event.get("delta") or ""))
        if kind == "response.reasoning_summary_text.delta":
            return self._piece(
                oi, ReasoningSummaryDelta(event.get("delta") or "", event.get("summary_index", 0))
            )
        if kind in ("response.reasoning_text.delta", "response.reasoning.delta"):
            return self._piece(oi, ReasoningDelta(event.get("delta") or ""))
        if kind == "response.refusal.delta":
            return self._piece(oi, RefusalDelta(event.get("delta") or ""))
        if kind == "response.output_item.added":
            item = event.get("item") or {}
            if item.get("type") == "function_call":
                return self._call(oi, item)
            return []
        if kind == "response.output_item.done":
            return self._item_done(oi, event.get("item") or {})
        if kind == "response.function_call_arguments.done":
            if oi not in self._streamed and event.get("arguments"):
                return self._piece(oi, ToolCallArgsDelta(oi, event["arguments"]))
            return []
        if kind in ("response.completed", "response.incomplete"):
            return self._terminal(event.get("response") or {})
        if kind == "response.failed":
            response = event.get("response") or {}
            raise stream_error(response.get("error"))
        if kind == "error":
            raise stream_error(event.get("error") if isinstance(event.get("error"), Mapping) else event)
        return []  # created, in_progress, part added/done, *.done echoes, annotations...

    def unstreamed_deltas(self, response: Mapping[str, Any]) -> list[Delta]:
        """The deltas of a complete, non-streamed response object (a server that ignored ``stream``)."""
        if response.get("status") == "failed" or response.get("error"):
            raise stream_error(response.get("error"))
        out: list[Delta] = []
        for oi, item in enumerate(response.get("output") or []):
            if isinstance(item, Mapping):
                out += self._item_done(oi, item)
        return out + self._terminal(response)

    def end(self) -> list[Delta]:
        """Checks the stream ended properly. Raises ``UpstreamError`` if it stopped early."""
        if not self._done:
            raise UpstreamError("The upstream stream ended before the response finished.", retryable=True)
        return []

    # -- internals ---------------------------------------------------------------------------
    def _piece(self, oi: int, delta: Delta) -> list[Delta]:
        if getattr(delta, "text", None) == "" or getattr(delta, "delta", None) == "":
            return []
        self._streamed.add(oi)
        return [delta]

    def _call(self, oi: int, item: Mapping[str, Any]) -> list[Delta]:
        if oi in self._started:
            return []
        self._started.add(oi)
        self._calls += 1
        out: list[Delta] = [ToolCallStart(oi, item.get("name") or "", item.get("call_id") or None)]
        if item.get("arguments"):
            out += self._piece(oi, ToolCallArgsDelta(oi, item["arguments"]))
        return out

    def _item_done(self, oi: int, item: Mapping[str, Any]) -> list[Delta]:
        kind = item.get("type")
        out: list[Delta] = []
        if kind == "function_call":
            out += self._call(oi, item)
            if oi not in self._streamed and item.get("arguments"):
                out += self._piece(oi, ToolCallArgsDelta(oi, item["arguments"]))
        elif kind == "message":
            if oi not in self._streamed:
                for part in item.get("content") or []:
                    if part.get("type") == "output_text" and part.get("text"):
                        out.append(TextDelta(part["text"], part.get("logprobs") or None))
                    elif part.get("type") == "refusal" and part.get("refusal"):
                        out.append(RefusalDelta(part["refusal"]))
        elif kind == "reasoning":
            if oi not in self._streamed:
                for index, part in enumerate(item.get("summary") or []):
                    if part.get("text"):
                        out.append(ReasoningSummaryDelta(part["text"], index))
                for part in item.get("content") or []:
                    if part.get("text"):
                        out.append(ReasoningDelta(part["text"]))
            if item.get("encrypted_content"):
                out.append(ReasoningEncrypted(wrap_encrypted(item.get("id"), item["encrypted_content"])))
        else:
            return []  # hosted-tool calls, compaction items...: nothing the deltas can carry
        self._streamed.add(oi)
        if item.get("status") != "incomplete":  # an incomplete item stays open: finish() marks it
            out.append(ItemDone())
        return out

    def _terminal(self, response: Mapping[str, Any]) -> list[Delta]:
        self._done = True
        out: list[Delta] = []
        usage = response.get("usage")
        if isinstance(usage, Mapping):
            out.append(usage_from(usage))
        if response.get("status") == "incomplete":
            reason = (response.get("incomplete_details") or {}).get("reason") or ""
            out.append(Finish(_INCOMPLETE.get(reason, "length")))
        else:
            out.append(Finish("tool_calls" if self._calls else "stop"))
        return out


def usage_from(usage: Mapping[str, Any]) -> Usage:
    """A Responses ``usage`` object as a ``Usage`` delta."""
    details_in = usage.get("input_tokens_details") or {}
    details_out = usage.get("output_tokens_details") or {}
    return Usage(
        input_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        cached_tokens=int(details_in.get("cached_tokens") or 0),
        reasoning_tokens=int(details_out.get("reasoning_tokens") or 0),
    )


def stream_error(error: Any) -> UpstreamError:
    """The gateway error for an in-stream ``error`` event or a ``response.failed`` error object."""
    code = error_code_from_body({"error": error}) if isinstance(error, Mapping) else None
    return map_stream_error(
        code,
        code,
        rate_limited="rate_limit_exceeded",
        rejected=_REJECTED_CODES,
        retryable=_RETRYABLE_CODES,
        error=error,
    )
