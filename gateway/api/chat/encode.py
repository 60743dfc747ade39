"""The builder's spec events in Chat Completions' wire format: a pure encoder fed one event at a
time (``ChatChunks``: ``chat.completion.chunk`` objects), and the final ``chat.completion`` object
of a turn's resource (``completion``).

Finish reasons: a completed response that called a function is ``tool_calls``, else ``stop``; an
incomplete one is ``length`` (max_output_tokens) or ``content_filter``. Usage carries the cached
and reasoning tokens (``prompt_tokens_details`` / ``completion_tokens_details``). Reasoning text,
which Chat Completions has no field for, goes in ``reasoning_content`` (as vLLM and DeepSeek send
it); clients that do not know it ignore it.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["ChatChunks", "chat_id", "chat_usage", "completion", "finish_reason"]

_TEXT_DELTAS = frozenset({"response.reasoning_summary_text.delta", "response.reasoning.delta"})


def chat_id(response_id: str) -> str:
    """The completion's id, made from the response's (``resp_…`` → ``chatcmpl-…``)."""
    return "chatcmpl-" + response_id.removeprefix("resp_")


def chat_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    prompt, completion_ = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_,
        "total_tokens": prompt + completion_,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


def finish_reason(resource: dict[str, Any], called: bool | None = None) -> str:
    """``called``: whether the output holds a function call, if known."""
    if resource.get("status") == "incomplete":
        reason = (resource.get("incomplete_details") or {}).get("reason")
        return "content_filter" if reason == "content_filter" else "length"
    if called is None:
        called = any(item.get("type") == "function_call" for item in resource.get("output") or ())
    return "tool_calls" if called else "stop"


def _logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    return {"content": entries, "refusal": None} if entries else None


def completion(resource: dict[str, Any]) -> dict[str, Any]:
    """The ``chat.completion`` of a finished (completed or incomplete) response."""
    texts: list[str] = []
    refusals: list[str] = []
    reasoning: list[str] = []
    logprobs: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for item in resource.get("output") or ():
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                if part.get("type") == "output_text":
                    texts.append(part.get("text") or "")
                    logprobs += part.get("logprobs") or ()
                elif part.get("type") == "refusal":
                    refusals.append(part.get("refusal") or "")
        elif kind == "function_call":
            calls.append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments") or ""},
                }
            )
        elif kind == "reasoning":
            for part in (item.get("content") or []) + (item.get("summary") or []):
                reasoning.append(part.get("text") or "")
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts or not (calls or refusals) else None,
        "refusal": "".join(refusals) if refusals else None,
        "annotations": [],
    }
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    out: dict[str, Any] = {
        "id": "chatcmpl-" + resource["id"].removeprefix("resp_"),  # chat_id, inline on the hot path
        "object": "chat.completion",
        "created": resource["created_at"],
        "model": resource["model"],
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason(resource, bool(calls)),
                "logprobs": {"content": logprobs, "refusal": None} if logprobs else None,
            }
        ],
        "usage": chat_usage(resource.get("usage")),
        "service_tier": resource.get("service_tier"),
        "system_fingerprint": None,
    }
    return out


class ChatChunks:
    """Feed each spec event to :meth:`feed`; it answers the chunks (or the in-stream error object)
    to send for it, in order. ``include_usage``: every chunk carries ``usage: null`` and a last
    chunk with no choices carries the usage, as ``stream_options.include_usage`` asks."""

    __slots__ = ("_calls", "_failed", "_head", "_include_usage", "_text")

    def __init__(self, *, include_usage: bool = False) -> None:
        self._include_usage = include_usage
        self._head: dict[str, Any] | None = None
        self._calls: dict[int, int] = {}  # output_index of a function call → its tool_calls index
        self._failed = False
        self._text: tuple[bytes, bytes] | None = None  # a content chunk's frame, around its text

    def frames(self, event: dict[str, Any]) -> bytes:
        """The ``data:`` frames of what :meth:`feed` returns for ``event`` (empty: nothing to send).
        A text delta without log probabilities, most of a stream, is written without the dicts: the
        same bytes orjson makes of its chunk."""
        text = self._text
        if text is not None and event["type"] == "response.output_text.delta" and not event.get("logprobs"):
            return text[0] + orjson.dumps(event["delta"]) + text[1]
        return b"".join([b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in self.feed(event)])

    def _chunk(
        self, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None
    ) -> dict[str, Any]:
        assert self._head is not None  # response.created comes first
        chunk: dict[str, Any] = {
            **self._head,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}],
        }
        if self._include_usage:
            chunk["usage"] = None
        return chunk

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event["type"]
        if kind == "response.output_text.delta":
            return [self._chunk({"content": event["delta"]}, logprobs=_logprobs(event.get("logprobs")))]
        if kind == "response.function_call_arguments.delta":
            index = self._calls.get(event["output_index"])
            if index is None:
                return []
            return [
                self._chunk({"tool_calls": [{"index": index, "function": {"arguments": event["delta"]}}]})
            ]
        if kind in _TEXT_DELTAS:
            return [self._chunk({"reasoning_content": event["delta"]})]
        if kind == "response.refusal.delta":
            return [self._chunk({"refusal": event["delta"]})]
        if kind == "response.output_item.added":
            item = event["item"]
            if item.get("type") != "function_call":
                return []
            index = self._calls[event["output_index"]] = len(self._calls)
            call = {
                "index": index,
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item.get("arguments") or ""},
            }
            return [self._chunk({"tool_calls": [call]})]
        if kind == "response.created":
            res = event["response"]
            self._head = {
                "id": chat_id(res["id"]),
                "object": "chat.completion.chunk",
                "created": res["created_at"],
                "model": res["model"],
                "service_tier": res.get("service_tier"),
                "system_fingerprint": None,
            }
            tail = b'},"finish_reason":null,"logprobs":null}]' + (
                b',"usage":null' if self._include_usage else b""
            )
            head = b"data: " + orjson.dumps(self._head)[:-1] + b',"choices":[{"index":0,"delta":{"content":'
            self._text = (head, tail + b"}\n\n")
            return [self._chunk({"role": "assistant", "content": "", "refusal": None})]
        if kind in ("response.completed", "response.incomplete"):
            res = event["response"]
            out = [self._chunk({}, finish_reason(res))]
            if self._include_usage:
                assert self._head is not None
                out.append({**self._head, "choices": [], "usage": chat_usage(res.get("usage"))})
            return out
        if kind in ("error", "response.failed"):
            if self._failed:
                return []
            self._failed = True
            err = event.get("error") if kind == "error" else (event["response"].get("error") or {})
            return [{"error": _error_object(err or {})}]
        return []


def _error_object(err: dict[str, Any]) -> dict[str, Any]:
    """A mid-stream failure as OpenAI's error object (the openai SDK raises it as ``APIError``)."""
    return {
        "message": err.get("message") or "The response failed.",
        "type": err.get("type") or "server_error",
        "param": err.get("param"),
        "code": err.get("code"),
    }
