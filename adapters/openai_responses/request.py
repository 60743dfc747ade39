"""Pure request translation: a normalized ``UpstreamRequest`` → a Responses API JSON body.

The gateway owns conversation state, so the upstream gets the whole transcript as ``input`` with
``store: false`` (never the client's ``previous_response_id``), and reasoning state travels in
``encrypted_content`` (see :func:`wrap_encrypted` for how the upstream item id rides along).
"""

from __future__ import annotations

from typing import Any, get_args

from adapters.base import UpstreamRequest
from adapters.content import DEFAULT_ONE, LOGPROBS_INCLUDE
from adapters.openai_responses.wire import (
    PassThroughKey,
    ResponsesInputItem,
    ResponsesMessage,
    ResponsesReasoning,
    ResponsesRequest,
    ResponsesText,
)

__all__ = ["ENCRYPTED_INCLUDE", "build_body", "build_input", "unwrap_encrypted", "wrap_encrypted"]

ENCRYPTED_INCLUDE = "reasoning.encrypted_content"
_WRAP = "orgw1:"  # marks encrypted_content that carries the upstream reasoning item id
_PASS_THROUGH: tuple[PassThroughKey, ...] = get_args(PassThroughKey)


def wrap_encrypted(item_id: str | None, encrypted: str) -> str:
    """The ``encrypted_content`` shown to the client: the upstream's, plus its item id.

    Upstream item ids are replaced by the gateway's own, but a stateless Responses upstream may
    want the original id next to its encrypted reasoning, so it is kept inside the opaque string.
    """
    if not item_id or "|" in item_id:
        return encrypted
    return f"{_WRAP}{item_id}|{encrypted}"


def unwrap_encrypted(value: str) -> tuple[str | None, str]:
    """(upstream item id or None, the upstream's own encrypted_content)."""
    if value.startswith(_WRAP):
        item_id, sep, encrypted = value[len(_WRAP) :].partition("|")
        if sep:
            return item_id, encrypted
    return None, value


def build_body(req: UpstreamRequest, *, send_defaults: bool = True) -> ResponsesRequest:
    """The ``POST /responses`` body for ``req`` (streamed unless ``req.stream`` is False)."""
    items = build_input(req.items)
    body: ResponsesRequest = {"model": req.model, "input": items, "stream": req.stream, "store": False}
    if req.instructions:
        body["instructions"] = req.instructions
    if req.tools:
        body["tools"] = [_tool(t) for t in req.tools]
        if req.tool_choice != "auto":
            body["tool_choice"] = req.tool_choice
    for name in _PASS_THROUGH:
        value = getattr(req, name)
        if value is not None and (send_defaults or not (name in DEFAULT_ONE and value == 1.0)):
            body[name] = value
    text: ResponsesText = {}
    if req.text_format is not None:
        text["format"] = {k: v for k, v in req.text_format.items() if v is not None}
    if req.verbosity is not None:
        text["verbosity"] = req.verbosity
    if text:
        body["text"] = text
    if req.reasoning:
        body["reasoning"] = {k: v for k, v in req.reasoning.items() if v is not None}
    include = list(req.include)
    if req.top_logprobs and LOGPROBS_INCLUDE not in include:
        include.append(LOGPROBS_INCLUDE)  # OpenAI returns logprobs only when included
    # Without the store, reasoning only survives the next turn as encrypted_content.
    if ENCRYPTED_INCLUDE not in include and (
        req.reasoning or any(i.get("type") == "reasoning" for i in req.items)
    ):
        include.append(ENCRYPTED_INCLUDE)
    if include:
        body["include"] = include
    return body


def build_input(items: list[dict[str, Any]]) -> list[ResponsesInputItem]:
    """Normalized transcript items → Responses ``input`` items (gateway ids dropped)."""
    out: list[ResponsesInputItem] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message(item))
        elif kind == "function_call":
            out.append(
                {
                    "type": "function_call",
                    "call_id": item["call_id"],
                    "name": item["name"],
                    "arguments": item.get("arguments") or "{}",
                }
            )
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                output = [_part(p) for p in output or []]
            out.append({"type": "function_call_output", "call_id": item["call_id"], "output": output})
        elif kind == "reasoning":
            reasoning = _reasoning(item)
            if reasoning is not None:
                out.append(reasoning)
    return out


def _message(item: dict[str, Any]) -> ResponsesMessage:
    role = item.get("role", "user")
    msg: ResponsesMessage = {
        "type": "message",
        "role": role,
        "content": [_part(p) for p in item.get("content") or []],
    }
    if role == "assistant" and item.get("phase"):
        msg["phase"] = item["phase"]
    return msg


def _part(part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "output_text":
        return {"type": "output_text", "text": part.get("text", ""), "annotations": []}
    if kind == "input_image":
        out = {k: v for k, v in part.items() if v is not None}
        out.setdefault("detail", "auto")  # required by OpenAI
        return out
    return {k: v for k, v in part.items() if v is not None}


def _reasoning(item: dict[str, Any]) -> ResponsesReasoning | None:
    """A reasoning item the upstream can use, or None (no state to give it: dropped)."""
    encrypted = item.get("encrypted_content")
    content = item.get("content")
    if not encrypted and not content:
        return None  # with store=false the upstream cannot look a bare id up
    out: ResponsesReasoning = {"type": "reasoning", "summary": item.get("summary") or []}
    item_id = item.get("id")
    if encrypted:
        upstream_id, encrypted = unwrap_encrypted(encrypted)
        item_id = upstream_id or item_id
        out["encrypted_content"] = encrypted
    if content:
        out["content"] = content
    if item_id:
        out["id"] = item_id
    return out


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in tool.items() if v is not None}
