"""Input items (wire models) → the normalized dict form adapters read (see adapters/base.py).

Every normalized item carries an ``id`` (kept from the client or made here) so stored turns can
be addressed by ``item_reference`` later.
"""

from __future__ import annotations

from typing import Any

from gateway.kernel.ids import new_id
from gateway.kernel.spec.request import (
    CompactionItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    ItemReference,
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
    McpListToolsItem,
    MessageItem,
    ReasoningItem,
)

# hosted tools' receipts (gateway/engine/hosted.py): kept whole, as sent, without their status
_RECEIPTS = (McpListToolsItem, McpCallItem, McpApprovalRequestItem, McpApprovalResponseItem)
_RECEIPT_TYPES = frozenset({"mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response"})

_ASSISTANT_TEXT = frozenset({"input_text", "text", "output_text"})

Item = dict[str, Any]  # an item in normalized form


def _part(part: Any, role: str) -> dict[str, Any]:
    t = part.type
    if role == "assistant":
        if t in _ASSISTANT_TEXT:
            return {"type": "output_text", "text": part.text}
        if t == "refusal":
            return {"type": "refusal", "refusal": part.refusal}
    elif t in ("text", "output_text"):
        return {"type": "input_text", "text": part.text}
    elif t == "refusal":
        return {"type": "input_text", "text": part.refusal}
    dumped: dict[str, Any] = part.model_dump(exclude_none=True)
    return dumped


def message(role: str, text: str, *, item_id: str | None = None) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {
        "type": "message",
        "id": item_id or new_id("msg"),
        "role": role,
        "content": [{"type": kind, "text": text}],
    }


def normalize(item: Any) -> dict[str, Any]:
    """One parsed input item (not a reference or compaction item) → its normalized dict. An item in
    normalized form already (a dict: what the Chat Completions and Messages ingresses map their
    messages to) is taken as it is."""
    if isinstance(item, dict):
        return item
    if isinstance(item, MessageItem):
        role = item.role
        if isinstance(item.content, str):
            out = message(role, item.content, item_id=item.id)
        else:
            out = {
                "type": "message",
                "id": item.id or new_id("msg"),
                "role": role,
                "content": [_part(p, role) for p in item.content],
            }
        if item.phase is not None and role == "assistant":
            out["phase"] = item.phase
        return out
    if isinstance(item, FunctionCallItem):
        return {
            "type": "function_call",
            "id": item.id or new_id("fc"),
            "call_id": item.call_id,
            "name": item.name,
            "arguments": item.arguments,
        }
    if isinstance(item, FunctionCallOutputItem):
        output: Any = item.output
        if not isinstance(output, str):
            output = [_part(p, "user") for p in output]
        return {
            "type": "function_call_output",
            "id": item.id or new_id("fco"),
            "call_id": item.call_id,
            "output": output,
        }
    if isinstance(item, ReasoningItem):
        out = {
            "type": "reasoning",
            "id": item.id or new_id("rs"),
            "summary": [{"type": "summary_text", "text": s.text} for s in item.summary],
        }
        if item.content:
            out["content"] = [{"type": "reasoning_text", "text": c.text} for c in item.content]
        if item.encrypted_content:
            out["encrypted_content"] = item.encrypted_content
        return out
    if isinstance(item, _RECEIPTS):
        out = item.model_dump(exclude={"status"})
        if isinstance(item, McpApprovalResponseItem) and item.id is None:
            out["id"] = new_id("mcpa")
        return out
    if isinstance(item, ItemReference | CompactionItem):
        raise TypeError("references and compaction items are resolved by gateway/engine/context.py")
    raise TypeError(f"unknown item {type(item).__name__}")


def output_as_input(item: dict[str, Any]) -> dict[str, Any]:
    """An output item of a stored response, in normalized input form (drops status/annotations)."""
    t = item.get("type")
    if t == "message":
        content = []
        for p in item.get("content", []):
            if p.get("type") == "output_text":
                content.append({"type": "output_text", "text": p.get("text", "")})
            else:
                content.append(p)
        out = {"type": "message", "id": item["id"], "role": item.get("role", "assistant"), "content": content}
        if "phase" in item:
            out["phase"] = item["phase"]
        return out
    if t == "function_call":
        return {
            "type": "function_call",
            "id": item["id"],
            "call_id": item["call_id"],
            "name": item["name"],
            "arguments": item["arguments"],
        }
    if t in _RECEIPT_TYPES:
        return {k: v for k, v in item.items() if k != "status"}
    if t == "reasoning":
        out = {"type": "reasoning", "id": item["id"], "summary": item.get("summary", [])}
        if item.get("content"):
            out["content"] = item["content"]
        if item.get("encrypted_content"):
            out["encrypted_content"] = item["encrypted_content"]
        return out
    return item


def call_ids(items: list[dict[str, Any]]) -> frozenset[str]:
    """The call ids of the function calls among ``items``."""
    return frozenset(i["call_id"] for i in items if i.get("type") == "function_call")
