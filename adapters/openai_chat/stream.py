"""Pure stream translation: parsed ``chat.completion.chunk`` dicts → normalized deltas.

Stateful (tool calls by index, the held finish reason and usage); no I/O. Usage and the finish
reason are held until the stream ends, so they come last and in that order.
"""

from __future__ import annotations

from typing import Any

import orjson

from adapters.deltas import (
    Delta,
    Finish,
    FinishReason,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
    as_deltas,
)
from adapters.upstream_errors import error_code_from_body, map_status_error, map_stream_error
from gateway.kernel.errors import UpstreamError

__all__ = ["ChatStreamTranslator"]

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "eos": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "length": "length",
    "max_tokens": "length",
    "model_length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "tool_use": "tool_calls",
    "content_filter": "content_filter",
    "safety": "content_filter",
}


class _Call:
    __slots__ = ("call_id", "key", "pending", "started")

    def __init__(self, key: int, call_id: str | None) -> None:
        self.key = key
        self.call_id = call_id
        self.started = False
        self.pending: list[str] = []  # argument pieces that arrived before the name


class ChatStreamTranslator:
    """Feed each parsed chunk to :meth:`feed`; call :meth:`end` once the stream is over."""

    __slots__ = ("_by_index", "_calls", "_finish", "_usage")
    done = False  # no terminal chunk: the adapter sees the stream's end ([DONE]) and tells end()

    def __init__(self) -> None:
        self._by_index: dict[Any, _Call] = {}  # the provider's tool-call index → the current call
        self._calls = 0  # calls seen; also the next delta key
        self._finish: FinishReason | None = None
        self._usage: Usage | None = None

    def feed(self, chunk: dict[str, Any]) -> list[Delta]:
        """The deltas in one chunk. Raises ``UpstreamError`` for an in-stream error chunk."""
        return as_deltas(self.deltas_or_text(chunk))

    def deltas_or_text(self, chunk: dict[str, Any]) -> list[Delta] | str:
        """:meth:`feed`, but the text alone for a plain-text chunk (``adapters.streaming``)."""
        choices = chunk.get("choices")
        # The per-token hot path, one upstream chunk per delta: one choice 0 whose delta is
        # ``{"content": "..."}`` alone, no finish reason, logprobs, usage or error: the text of
        # the TextDelta the general path below makes, with fewer lookups (issue 14).
        if choices and len(choices) == 1 and not chunk.get("usage") and not chunk.get("error"):
            choice = choices[0]
            if type(choice) is dict:
                delta = choice.get("delta")
                if (
                    type(delta) is dict
                    and len(delta) == 1
                    and not choice.get("finish_reason")
                    and not choice.get("logprobs")
                    and choice.get("index", 0) == 0
                ):
                    content = delta.get("content")
                    if content and type(content) is str:
                        return content
        if chunk.get("error"):
            raise _stream_error(chunk)
        usage = chunk.get("usage")
        if usage:
            self._usage = _usage(usage)
        if not choices:
            return []
        out: list[Delta] = []
        for choice in choices:
            if choice.get("index", 0) != 0:
                continue  # n > 1 is not requested; ignore any other choice
            delta = choice.get("delta") or choice.get("message")
            if delta:
                self._delta(delta, out, choice.get("logprobs"))
            reason = choice.get("finish_reason")
            if reason:
                if reason == "error":
                    raise UpstreamError("The upstream provider failed while generating.", retryable=True)
                self._finish = _FINISH.get(reason, "stop")
        return out

    def end(self, *, done: bool = False) -> list[Delta]:
        """The held usage and finish. ``done``: the stream ended with ``[DONE]``.

        Raises ``UpstreamError`` when the stream stopped with neither ``[DONE]`` nor a finish reason.
        """
        finish = self._finish
        if finish is None:
            if not done:
                raise UpstreamError("upstream stream ended early", retryable=False)
            finish = "stop"
        if finish == "stop" and self._calls:
            finish = "tool_calls"  # some servers (Ollama, llama.cpp) say "stop" after tool calls
        out: list[Delta] = []
        if self._usage is not None:
            out.append(self._usage)
        out.append(Finish(finish))
        return out

    # -- internals ---------------------------------------------------------------------------
    def _delta(self, delta: dict[str, Any], out: list[Delta], logprobs: Any = None) -> None:
        if len(delta) == 1 and not logprobs:  # the per-token hot path: {"content": "..."} alone
            content = delta.get("content")
            if content and isinstance(content, str):
                out.append(TextDelta(content))
                return
        # vLLM/DeepSeek say "reasoning_content", OpenRouter/Ollama "reasoning"; some send both.
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning and isinstance(reasoning, str):
            out.append(ReasoningDelta(reasoning))
        content = delta.get("content")
        if content and isinstance(content, str):
            out.append(TextDelta(content, token_logprobs(logprobs) if logprobs else None))
        refusal = delta.get("refusal")
        if refusal and isinstance(refusal, str):
            out.append(RefusalDelta(refusal))
        tool_calls = delta.get("tool_calls")
        if tool_calls:
            for position, tc in enumerate(tool_calls):
                self._tool_call(tc, position, out)

    def _tool_call(self, tc: dict[str, Any], position: int, out: list[Delta]) -> None:
        index = tc.get("index")
        call_id = tc.get("id") or None
        fn = tc.get("function") or {}
        name = fn.get("name")
        args = fn.get("arguments")
        if index is None:  # some servers omit the index: fall back to the id, then the position
            index = call_id if call_id is not None else ("pos", position)
        call = self._by_index.get(index)
        # A new id under a known index (servers that reuse index 0 for parallel calls) is a new call.
        if call is None or (call_id is not None and call.call_id is not None and call_id != call.call_id):
            call = _Call(self._calls, call_id)
            self._calls += 1
            self._by_index[index] = call
        elif call.call_id is None and call_id is not None:
            call.call_id = call_id
        if not call.started and name:
            call.started = True
            out.append(ToolCallStart(call.key, name, call.call_id))
            if call.pending:
                out.append(ToolCallArgsDelta(call.key, "".join(call.pending)))
                call.pending = []
        if args and isinstance(args, str):
            if call.started:
                out.append(ToolCallArgsDelta(call.key, args))
            else:
                call.pending.append(args)
        elif args and isinstance(args, dict):  # a few servers send parsed arguments
            piece = orjson.dumps(args).decode()
            if call.started:
                out.append(ToolCallArgsDelta(call.key, piece))
            else:
                call.pending.append(piece)


def _usage(u: dict[str, Any]) -> Usage:
    prompt_details = u.get("prompt_tokens_details") or {}
    completion_details = u.get("completion_tokens_details") or {}
    cached = prompt_details.get("cached_tokens") or u.get("prompt_cache_hit_tokens") or 0
    return Usage(
        input_tokens=int(u.get("prompt_tokens") or 0),
        output_tokens=int(u.get("completion_tokens") or 0),
        cached_tokens=int(cached),
        reasoning_tokens=int(completion_details.get("reasoning_tokens") or 0),
    )


def _stream_error(chunk: dict[str, Any]) -> UpstreamError:
    """An error chunk inside the 200 stream: its ``code``, when an HTTP status, is classified as
    that status would be (vLLM and llama-server put one there); otherwise it is not retried."""
    err = chunk.get("error")
    status = err.get("code") if isinstance(err, dict) else None
    if type(status) is int and 400 <= status < 600:
        return map_status_error(status, chunk)
    code = error_code_from_body(chunk)
    return map_stream_error(
        code or "unknown",
        code,
        rate_limited="rate_limit_exceeded",
        rejected=frozenset(),
        retryable=frozenset(),
        error=err,
    )


def token_logprobs(raw: Any) -> list[dict[str, Any]] | None:
    """A choice's ``logprobs.content`` in the spec's shape (``bytes`` filled in when absent)."""
    content = raw.get("content") if isinstance(raw, dict) else None
    if not isinstance(content, list):
        return None
    out = []
    for entry in content:
        if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
            continue
        out.append(
            {**_logprob(entry), "top_logprobs": [_logprob(t) for t in entry.get("top_logprobs") or []]}
        )
    return out or None


def _logprob(entry: dict[str, Any]) -> dict[str, Any]:
    token = str(entry.get("token", ""))
    raw = entry.get("bytes")
    return {
        "token": token,
        "logprob": float(entry.get("logprob") or 0.0),
        "bytes": raw if isinstance(raw, list) else list(token.encode()),
    }
