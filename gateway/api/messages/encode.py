"""The builder's spec events and final resource → Anthropic Messages: the ``Message`` object of a JSON
answer (``message_of``), and the event stream (``MessageStream``: one spec event in, the Messages
events it makes out: ``message_start``, ``ping``, ``content_block_start`` / ``_delta`` / ``_stop``,
``message_delta``, ``message_stop``, ``error``). Both are pure: no I/O, no state outside the object.

A reasoning item is a ``thinking`` block (its summary or reasoning text, its ``encrypted_content``
as the signature), or a ``redacted_thinking`` block when the anthropic adapter marked it so.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from adapters.anthropic.request import REDACTED_PREFIX
from gateway.kernel.errors import ErrorCode, GatewayError

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
          429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error"}  # fmt: skip
# the spec error ``type`` → Anthropic's, for an error met mid-stream
_BY_SPEC_TYPE = {"invalid_request_error": "invalid_request_error", "too_many_requests": "rate_limit_error",
                 "authentication_error": "authentication_error", "permission_error": "permission_error",
                 "not_found": "not_found_error"}  # fmt: skip


class Finished(Protocol):
    """What the builder knows of how generation ended beyond the resource (gateway/engine/builder.py)."""

    stop_sequence: str | None
    cache_write_tokens: int


def error_status(err: GatewayError) -> int:
    """The HTTP status Messages answers ``err`` with: the gateway's, except an unknown (or not
    allowed) model, which Anthropic's API answers 404 ``not_found_error``."""
    return 404 if err.code == ErrorCode.MODEL_NOT_FOUND else err.status


def error_type(status: int) -> str:
    return _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(err: GatewayError, request_id: str | None = None) -> dict[str, Any]:
    """``err`` in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``."""
    message = err.message
    param = err.param
    # the engine's own refusals name a field as ``param`` (its paths: the ingress's fields are
    # named by the ingress itself, gateway/api/messages/parse.py)
    if param and "[" not in param and not message.startswith(f"{param}: "):
        message = f"{param}: {message}"
    body: dict[str, Any] = {
        "type": "error",
        "error": {"type": error_type(error_status(err)), "message": message},
    }
    if request_id:
        body["request_id"] = request_id
    return body


def message_id(resource: dict[str, Any]) -> str:
    rid: str = resource["id"]
    return "msg_" + rid.removeprefix("resp_")


def usage_of(resource: dict[str, Any], finished: Finished) -> dict[str, int]:
    """Anthropic's usage: its ``input_tokens`` leave out the cached and the cache-written ones
    (the engine's, OpenAI's meaning, include them)."""
    usage = resource.get("usage") or {}
    cached = int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
    written = finished.cache_write_tokens
    return {
        "input_tokens": max(int(usage.get("input_tokens") or 0) - cached - written, 0),
        "output_tokens": int(usage.get("output_tokens") or 0),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": cached,
    }


def stop_reason(resource: dict[str, Any], finished: Finished, called: bool | None = None) -> str:
    """``called``: whether the output holds a function call, if known."""
    if resource.get("status") == "incomplete":
        reason = (resource.get("incomplete_details") or {}).get("reason")
        return "refusal" if reason == "content_filter" else "max_tokens"
    if finished.stop_sequence is not None:
        return "stop_sequence"
    if called is None:
        called = any(item.get("type") == "function_call" for item in resource.get("output") or ())
    return "tool_use" if called else "end_turn"


def _tool_input(arguments: str) -> Any:
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _reasoning_block(item: dict[str, Any]) -> dict[str, Any]:
    enc = item.get("encrypted_content") or ""
    parts = item.get("summary") or item.get("content") or []
    text = "".join(p.get("text") or "" for p in parts)
    if enc.startswith(REDACTED_PREFIX) and not text:
        return {"type": "redacted_thinking", "data": enc[len(REDACTED_PREFIX) :]}
    return {"type": "thinking", "thinking": text, "signature": enc}


def content_of(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for item in output:
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                text = part.get("text") if part.get("type") == "output_text" else part.get("refusal")
                blocks.append({"type": "text", "text": text or ""})
        elif kind == "function_call":
            blocks.append(
                {
                    "type": "tool_use",
                    "id": item["call_id"],
                    "name": item["name"],
                    "input": _tool_input(item["arguments"]),
                }
            )
        elif kind == "reasoning":
            blocks.append(_reasoning_block(item))
    return blocks


def message_of(resource: dict[str, Any], finished: Finished) -> dict[str, Any]:
    """The ``Message`` object of a finished turn (``resource``: its final ResponseResource)."""
    content = content_of(resource.get("output") or [])
    lone_text = len(content) == 1 and content[0]["type"] == "text"  # the common answer: no call in it
    return {
        "id": "msg_" + resource["id"].removeprefix("resp_"),  # message_id, inline on the hot path
        "type": "message",
        "role": "assistant",
        "model": resource["model"],
        "content": content,
        "stop_reason": stop_reason(resource, finished, False if lone_text else None),
        "stop_sequence": finished.stop_sequence,
        "usage": usage_of(resource, finished),
    }


def sse(event: dict[str, Any]) -> bytes:
    """One Messages SSE event: ``event:`` its ``type``, one ``data:`` line."""
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


_TEXT_DELTA_HEAD = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
_TEXT_DELTA_MID = b',"delta":{"type":"text_delta","text":'


class MessageStream:
    """Feed each spec event of one turn to :meth:`feed`; it returns the Messages events to send."""

    __slots__ = ("_errored", "_finished", "_index", "_item", "_open", "_thinking")

    def __init__(self, finished: Finished) -> None:
        self._finished = finished
        self._index = -1  # the open (or last) content block's index
        self._open = False  # a content block is open
        self._item = ""  # the type of the open output item
        self._thinking = False  # the open reasoning item's block has started
        self._errored = False

    def _start(self, block: dict[str, Any]) -> dict[str, Any]:
        self._index += 1
        self._open = True
        return {"type": "content_block_start", "index": self._index, "content_block": block}

    def _stop(self) -> list[dict[str, Any]]:
        if not self._open:
            return []
        self._open = False
        return [{"type": "content_block_stop", "index": self._index}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self._index, "delta": delta}

    def _start_thinking(self) -> list[dict[str, Any]]:
        if self._thinking:
            return []
        self._thinking = True
        return [self._start({"type": "thinking", "thinking": "", "signature": ""})]

    def frames(self, event: dict[str, Any]) -> bytes:
        """The SSE frames of what :meth:`feed` returns for ``event`` (empty: nothing to send). A
        text delta, most of a stream, is written without the dicts: the same bytes orjson makes of
        its ``content_block_delta``."""
        if event["type"] == "response.output_text.delta":
            return b"".join(
                (
                    _TEXT_DELTA_HEAD,
                    str(self._index).encode(),
                    _TEXT_DELTA_MID,
                    orjson.dumps(event["delta"]),
                    b"}}\n\n",
                )
            )
        return b"".join([sse(out) for out in self.feed(event)])

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event["type"]
        if kind == "response.output_text.delta" or kind == "response.refusal.delta":
            return [self._delta({"type": "text_delta", "text": event["delta"]})]
        if kind == "response.function_call_arguments.delta":
            return [self._delta({"type": "input_json_delta", "partial_json": event["delta"]})]
        if kind == "response.reasoning_summary_text.delta" or kind == "response.reasoning.delta":
            out = self._start_thinking()
            out.append(self._delta({"type": "thinking_delta", "thinking": event["delta"]}))
            return out
        if kind == "response.created":
            return self._message_start(event["response"])
        if kind == "response.output_item.added":
            item = event["item"]
            self._item = item["type"]
            self._thinking = False
            if self._item == "function_call":
                return [
                    self._start(
                        {"type": "tool_use", "id": item["call_id"], "name": item["name"], "input": {}}
                    )
                ]
            return []
        if kind == "response.content_part.added" and self._item == "message":
            return [self._start({"type": "text", "text": ""})]
        if kind == "response.content_part.done" and self._item == "message":
            return self._stop()
        if kind == "response.output_item.done":
            return self._item_done(event["item"])
        if kind in ("response.completed", "response.incomplete"):
            return self._message_end(event["response"])
        if kind == "error":
            self._errored = True
            err = event.get("error") or {}
            spec_type = err.get("type") or ""
            return [
                {
                    "type": "error",
                    "error": {
                        "type": _BY_SPEC_TYPE.get(spec_type, "api_error"),
                        "message": err.get("message") or "",
                    },
                }
            ]
        if kind == "response.failed" and not self._errored:
            self._errored = True
            failure = event["response"].get("error") or {}
            message = failure.get("message") or "The response failed."
            return [{"type": "error", "error": {"type": "api_error", "message": message}}]
        return []  # in_progress, *.done of texts, summary parts: nothing of their own in Messages

    def _message_start(self, resource: dict[str, Any]) -> list[dict[str, Any]]:
        message = {
            "id": message_id(resource),
            "type": "message",
            "role": "assistant",
            "model": resource["model"],
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 0,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def _item_done(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        kind = item["type"]
        self._item = ""
        if kind == "function_call":
            return self._stop()
        if kind != "reasoning":
            return []
        out: list[dict[str, Any]] = []
        enc = item.get("encrypted_content") or ""
        if not self._thinking:
            block = _reasoning_block(item)
            if block["type"] == "redacted_thinking":
                return [self._start(block), *self._stop()]
            out += self._start_thinking()
        if enc:
            out.append(self._delta({"type": "signature_delta", "signature": enc}))
        self._thinking = False
        return out + self._stop()

    def _message_end(self, resource: dict[str, Any]) -> list[dict[str, Any]]:
        finished = self._finished
        out = self._stop()
        out.append(
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": stop_reason(resource, finished),
                    "stop_sequence": finished.stop_sequence,
                },
                "usage": usage_of(resource, finished),
            }
        )
        out.append({"type": "message_stop"})
        return out
