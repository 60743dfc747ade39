"""Pure stream translation: parsed Gemini ``GenerateContentResponse`` chunks → normalized deltas.

``thought: true`` parts are thought *summaries* (what Gemini returns with ``includeThoughts``), so
they become ``ReasoningSummaryDelta``; a ``thoughtSignature`` becomes ``ReasoningEncrypted`` (on
the open reasoning item, or a new one just before the part it came with). Each ``functionCall``
part is a whole call; several in one chunk are parallel calls. Call ids come from the builder
unless Gemini sends one. The stream has no terminal event: the last chunk has ``finishReason``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from adapters.deltas import (
    Delta,
    Finish,
    FinishReason,
    ReasoningEncrypted,
    ReasoningSummaryDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
    as_deltas,
)
from adapters.upstream_errors import error_code_from_body, map_stream_error
from gateway.kernel.errors import ErrorCode, UpstreamError

__all__ = ["GeminiStreamTranslator", "stream_error"]

_FINISH: dict[str, FinishReason] = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "LANGUAGE": "content_filter",
}
_RETRYABLE_STATUSES = frozenset({"UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED", "ABORTED", "UNKNOWN"})
_REJECTED_STATUSES = frozenset({"INVALID_ARGUMENT", "FAILED_PRECONDITION", "NOT_FOUND", "OUT_OF_RANGE"})
_AUTH_STATUSES = frozenset({"PERMISSION_DENIED", "UNAUTHENTICATED"})


class GeminiStreamTranslator:
    """Feed each parsed chunk to :meth:`feed`; call :meth:`end` when the body is over."""

    __slots__ = ("_calls", "_finish", "_usage")
    done = False  # no terminal event: the body's end is the stream's end

    def __init__(self) -> None:
        self._calls = 0
        self._finish: str | None = None
        self._usage: Usage | None = None

    def feed(self, chunk: Mapping[str, Any]) -> list[Delta]:
        """The deltas of one chunk. Raises ``UpstreamError`` for an in-stream error object."""
        return as_deltas(self.deltas_or_text(chunk))

    def deltas_or_text(self, chunk: Mapping[str, Any]) -> list[Delta] | str:
        """:meth:`feed`, but the text alone for a plain-text chunk (``adapters.streaming``): one
        candidate whose one part is ``{"text": ...}`` alone, without a finish reason or logprobs
        (its usage, the same in the next such chunk, is taken as :meth:`feed` takes it)."""
        candidates = chunk.get("candidates")
        if type(candidates) is list and len(candidates) == 1 and not chunk.get("error"):
            candidate = candidates[0]
            if type(candidate) is dict and not candidate.get("finishReason"):
                content = candidate.get("content")
                parts = content.get("parts") if type(content) is dict else None
                if type(parts) is list and len(parts) == 1 and not candidate.get("logprobsResult"):
                    part = parts[0]
                    text = part.get("text") if type(part) is dict and len(part) == 1 else None
                    if text and type(text) is str:
                        usage = chunk.get("usageMetadata")
                        if isinstance(usage, Mapping):
                            self._usage = usage_from(usage)
                        return text
        if chunk.get("error"):
            raise stream_error(chunk["error"])
        usage = chunk.get("usageMetadata")
        if isinstance(usage, Mapping):
            self._usage = usage_from(usage)
        candidates = chunk.get("candidates") or []
        if not candidates:
            if (chunk.get("promptFeedback") or {}).get("blockReason"):
                self._finish = "SAFETY"  # the prompt itself was blocked
            return []
        candidate = candidates[0]
        out: list[Delta] = []
        for part in (candidate.get("content") or {}).get("parts") or []:
            self._part(part, out)
        result = candidate.get("logprobsResult")
        if result and out and type(out[-1]) is TextDelta:
            out[-1] = TextDelta(out[-1].text, token_logprobs(result))
        if candidate.get("finishReason"):
            self._finish = candidate["finishReason"]
        return out

    def end(self) -> list[Delta]:
        """Usage and the finish reason. Raises ``UpstreamError`` if no chunk said it finished."""
        finish = self._finish
        if finish is None:
            raise UpstreamError("The upstream stream ended before the response finished.", retryable=True)
        if finish in ("MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "TOO_MANY_TOOL_CALLS"):
            raise UpstreamError(
                "The model produced an invalid function call.",
                retryable=True,
                code=ErrorCode.MALFORMED_FUNCTION_CALL,
            )
        reason = _FINISH.get(finish, "stop")
        if reason == "stop" and self._calls:
            reason = "tool_calls"
        out: list[Delta] = [] if self._usage is None else [self._usage]
        out.append(Finish(reason))
        return out

    # -- internals ---------------------------------------------------------------------------
    def _part(self, part: Mapping[str, Any], out: list[Delta]) -> None:
        signature = part.get("thoughtSignature")
        text = part.get("text")
        if part.get("thought"):
            if text:
                out.append(ReasoningSummaryDelta(text))
            if signature:
                out.append(ReasoningEncrypted(signature))
            return
        if signature:  # state for the part it comes with: a reasoning item just before it
            out.append(ReasoningEncrypted(signature))
        call = part.get("functionCall")
        if isinstance(call, Mapping):
            key = self._calls
            self._calls += 1
            out.append(ToolCallStart(key, call.get("name") or "", call.get("id") or None))
            out.append(ToolCallArgsDelta(key, orjson.dumps(call.get("args") or {}).decode()))
        elif text:
            out.append(TextDelta(text))


def usage_from(u: Mapping[str, Any]) -> Usage:
    """``usageMetadata`` as a ``Usage`` delta (thoughts count as output, as OpenAI counts them)."""
    thoughts = int(u.get("thoughtsTokenCount") or 0)
    return Usage(
        input_tokens=int(u.get("promptTokenCount") or 0) + int(u.get("toolUsePromptTokenCount") or 0),
        output_tokens=int(u.get("candidatesTokenCount") or 0) + thoughts,
        cached_tokens=int(u.get("cachedContentTokenCount") or 0),
        reasoning_tokens=thoughts,
    )


def stream_error(error: Any) -> UpstreamError:
    """The gateway error for an error object sent inside the stream."""
    error = error if isinstance(error, Mapping) else {}
    return map_stream_error(
        error.get("status"),
        error_code_from_body({"error": error}),
        rate_limited="RESOURCE_EXHAUSTED",
        rejected=_REJECTED_STATUSES,
        retryable=_RETRYABLE_STATUSES,
        auth=_AUTH_STATUSES,
        error=error,
    )


def token_logprobs(result: Any) -> list[dict[str, Any]] | None:
    """A chunk's ``logprobsResult`` in the spec's shape: each chosen token with its alternatives."""
    if not isinstance(result, Mapping):
        return None
    chosen = result.get("chosenCandidates") or []
    tops = result.get("topCandidates") or []
    out = []
    for n, entry in enumerate(chosen):
        if not isinstance(entry, Mapping):
            continue
        top = tops[n].get("candidates") or [] if n < len(tops) and isinstance(tops[n], Mapping) else []
        out.append({**_logprob(entry), "top_logprobs": [_logprob(t) for t in top if isinstance(t, Mapping)]})
    return out or None


def _logprob(entry: Mapping[str, Any]) -> dict[str, Any]:
    token = str(entry.get("token", ""))
    return {
        "token": token,
        "logprob": float(entry.get("logProbability") or 0.0),
        "bytes": list(token.encode()),
    }
