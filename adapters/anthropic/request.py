"""Pure request translation: a normalized ``UpstreamRequest`` → an Anthropic Messages API body.

System and developer text goes to ``system``; tool outputs become ``tool_result`` blocks of a user
turn; consecutive same-role turns are merged, as the API requires. Reasoning items come back as
``thinking`` blocks only when they carry a signature (``encrypted_content``): unsigned thinking is
rejected by the API, so it is dropped.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Literal

import orjson

from adapters.anthropic.wire import (
    ContentBlock,
    DocumentBlock,
    ImageBlock,
    MessagesMessage,
    MessagesRequest,
    MessagesSampling,
    MessagesTool,
    MessagesToolChoice,
    RedactedThinkingBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from adapters.base import UpstreamRequest
from adapters.content import (
    arguments_object,
    assistant_texts,
    native_stop,
    parse_data_url,
    unsupported_content,
)
from adapters.tools import function_tools
from gateway.kernel.client_api import ClientApi
from gateway.kernel.errors import ErrorCode, UpstreamRejected
from gateway.kernel.tool_choice import parse_tool_choice

__all__ = [
    "REDACTED_PREFIX",
    "applied",
    "build_body",
    "build_messages",
    "build_tools",
    "mark_breakpoints",
    "sampling",
    "thinking_budget",
]

REDACTED_PREFIX = "redacted_thinking:"  # marks encrypted_content that holds a redacted_thinking block
_EFFORT_BUDGET = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 24576, "xhigh": 32768}
_MIN_BUDGET = 1024  # the API's minimum thinking budget
_DOC_TYPES = {"application/pdf": "base64", "text/plain": "text"}


def build_body(
    req: UpstreamRequest, *, default_max_tokens: int, caching: bool = False, send_defaults: bool = False
) -> MessagesRequest:
    """The ``POST /v1/messages`` body for ``req`` (streamed unless ``req.stream`` is False);
    ``caching``: with prompt-cache breakpoints (:func:`mark_breakpoints`); ``send_defaults``: see
    :func:`sampling`."""
    native = req.native
    if native is not None and native.api is ClientApi.MESSAGES:
        return _client_body(req, native.fields, default_max_tokens, send_defaults)
    system, messages = build_messages(req)
    max_tokens = req.max_output_tokens or default_max_tokens
    body: MessagesRequest = {"model": req.model, "max_tokens": max_tokens, "messages": messages}
    hint = _format_hint(req.text_format)
    if hint:
        system = f"{system}\n\n{hint}" if system else hint
    if system:
        body["system"] = system
    budget = _budget(req, max_tokens, messages)
    if budget is not None:
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    tools, choice = build_tools(req, thinking=budget is not None)
    if tools:
        body["tools"] = tools
        if choice is not None:
            body["tool_choice"] = choice
    sent = sampling(req, thinking=budget is not None, send_defaults=send_defaults)
    if "temperature" in sent:
        body["temperature"] = sent["temperature"]
    if "top_p" in sent:
        body["top_p"] = sent["top_p"]
    if req.safety_identifier:
        body["metadata"] = {"user_id": req.safety_identifier}
    stop = native_stop(req)
    if stop:
        body["stop_sequences"] = stop
    if req.stream:
        body["stream"] = True
    if caching:
        mark_breakpoints(body)
    return body


def _client_body(
    req: UpstreamRequest, fields: dict[str, Any], default_max_tokens: int, send_defaults: bool
) -> MessagesRequest:
    """A Messages client's own request: every field it sent goes on as it sent it (its blocks'
    cache_control included, so no breakpoints of the gateway's), the model the route's. The
    gateway adds only what the client left to it: streaming, and a server's default sampling that
    must be sent (``send_defaults``). Nothing is translated: the engine's items and tools are the
    same request, which the client's own fields say exactly."""
    max_tokens = req.max_output_tokens or default_max_tokens
    body: MessagesRequest = {"model": req.model, "max_tokens": max_tokens, "messages": []}
    if send_defaults:
        thinking = thinking_budget(req.reasoning, max_tokens) is not None
        body.update(sampling(req, thinking=thinking, send_defaults=True))  # type: ignore[typeddict-item]
    if req.stream:
        body["stream"] = True
    body.update(fields)  # type: ignore[typeddict-item]
    body["model"] = req.model  # the route's, in place of the client's
    return body


# -- prompt caching ---------------------------------------------------------------------------
MAX_BREAKPOINTS = 4  # the API refuses a request with more cache_control blocks
_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})  # the API refuses cache_control on them


def mark_breakpoints(body: MessagesRequest) -> None:
    """Mark the cacheable prefixes with ``cache_control`` breakpoints, as the API caches only
    what is marked: the last tool (the tool definitions), the system prompt (the tools and it),
    and the last block of the turn before the newest one (the whole conversation so far, which
    the next request reads back). The API caches in this order, tools, then system, then
    messages; a prefix shorter than the model's minimum (1024 tokens for most) is not cached,
    and costs nothing more. Three breakpoints, within the API's four; the body carries none
    before (no client field reaches a block's ``cache_control``)."""
    tools = body.get("tools")
    if tools:
        tools[-1]["cache_control"] = {"type": "ephemeral"}
    system = body.get("system")
    if isinstance(system, str) and system:
        body["system"] = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
    messages = body["messages"]
    if len(messages) >= 2:
        blocks = messages[-2]["content"]
        block = next((b for b in reversed(blocks) if b["type"] not in _UNMARKABLE), None)
        if block is not None:
            block["cache_control"] = {"type": "ephemeral"}


def _budget(req: UpstreamRequest, max_tokens: int, messages: list[MessagesMessage] | None) -> int | None:
    """The thinking budget the body gets (``messages``: the body's, built when None)."""
    budget = thinking_budget(req.reasoning, max_tokens)
    if budget is not None and _unsigned_tool_turn(build_messages(req)[1] if messages is None else messages):
        budget = None  # the API refuses thinking when the tool-use turn lacks its thinking block
    return budget


def sampling(req: UpstreamRequest, *, thinking: bool, send_defaults: bool = False) -> MessagesSampling:
    """The sampling fields sent. Anthropic's defaults are the resource's (temperature 1.0, no
    nucleus: top_p 1.0), so a default is not sent. Thinking takes the default sampling only;
    newer models refuse temperature with top_p (temperature wins); temperature is 0..1 (clamped).
    ``send_defaults`` (another server speaking Messages, ``ProviderSettings.sends_default_sampling``:
    llama.cpp samples at 0.8 / 0.95 otherwise): both are sent, as the resource states them."""
    if thinking:
        return {}
    temperature = 1.0 if req.temperature is None else min(max(req.temperature, 0.0), 1.0)
    if send_defaults:
        return {"temperature": temperature, "top_p": 1.0 if req.top_p is None else req.top_p}
    if temperature != 1.0:
        return {"temperature": temperature}
    if req.top_p is not None and req.top_p != 1.0:
        return {"top_p": req.top_p}
    return {}


def applied(req: UpstreamRequest, *, default_max_tokens: int, send_defaults: bool = False) -> dict[str, Any]:
    """The resource's sampling fields as :func:`build_body` applies them, and ``top_logprobs`` 0:
    Messages returns no log probabilities."""
    budget = _budget(req, req.max_output_tokens or default_max_tokens, None)
    sent = sampling(req, thinking=budget is not None, send_defaults=send_defaults)
    return {"temperature": sent.get("temperature", 1.0), "top_p": sent.get("top_p", 1.0), "top_logprobs": 0}


def _unsigned_tool_turn(messages: list[MessagesMessage]) -> bool:
    """The last assistant turn calls tools but does not start with a (signed) thinking block."""
    last = next((m for m in reversed(messages) if m["role"] == "assistant"), None)
    if last is None or not any(b["type"] == "tool_use" for b in last["content"]):
        return False
    return last["content"][0]["type"] not in ("thinking", "redacted_thinking")


def thinking_budget(reasoning: dict[str, Any] | None, max_tokens: int) -> int | None:
    """Extended-thinking budget for a ``reasoning.effort``, or None (thinking off)."""
    effort = (reasoning or {}).get("effort")
    if not effort or effort == "none":
        return None
    budget = min(_EFFORT_BUDGET.get(effort, _EFFORT_BUDGET["medium"]), max_tokens - 1)
    return budget if budget >= _MIN_BUDGET else None


def _format_hint(text_format: dict[str, Any] | None) -> str | None:
    """Messages has no response-format field: JSON output is asked for in the system prompt."""
    kind = (text_format or {}).get("type")
    if kind == "json_object":
        return "Respond with a single valid JSON object and nothing else."
    if kind == "json_schema":
        schema = orjson.dumps(text_format.get("schema") or {}).decode()  # type: ignore[union-attr]
        return (
            f"Respond with a single JSON object that conforms to this JSON schema, and nothing else: {schema}"
        )
    return None


# -- messages ---------------------------------------------------------------------------------
_OPENING = "."  # the user turn put before an assistant-first history (the API needs one, non-empty)


def build_messages(req: UpstreamRequest) -> tuple[str, list[MessagesMessage]]:
    """(system text, messages with strictly alternating roles)."""
    system: list[str] = [req.instructions] if req.instructions else []
    turns: list[tuple[Literal["user", "assistant"], list[ContentBlock]]] = []

    def add(role: Literal["user", "assistant"], blocks: list[ContentBlock]) -> None:
        if not blocks:
            return
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))

    for item in req.items:
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role", "user")
            if role in ("system", "developer"):
                text = _text_of(item.get("content"))
                if text:
                    system.append(text)
            elif role == "assistant":
                add("assistant", _assistant_blocks(item.get("content")))
            else:
                add("user", _user_blocks(item.get("content")))
        elif kind == "function_call":
            add("assistant", [_tool_use(item)])
        elif kind == "function_call_output":
            add("user", [_tool_result(item)])
        elif kind == "reasoning":
            block = _thinking(item)
            if block is not None:
                add("assistant", [block])
    messages: list[MessagesMessage] = []
    for role, blocks in turns:
        if role == "user":
            # tool_result blocks must open the user turn that answers the tool_use turn
            blocks = [b for b in blocks if b["type"] == "tool_result"] + [
                b for b in blocks if b["type"] != "tool_result"
            ]
        messages.append({"role": role, "content": blocks})
    if messages and messages[0]["role"] == "assistant":
        # The API refuses a history that opens with the assistant ("first message must use the
        # user role"), which Open Responses allows: a minimal user turn opens it instead.
        messages.insert(0, {"role": "user", "content": [{"type": "text", "text": _OPENING}]})
    return "\n\n".join(system), messages


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text") or "" for p in content or [] if "text" in p)


def _assistant_blocks(content: Any) -> list[ContentBlock]:
    # assistant_texts skips empty texts: the API rejects empty text blocks
    return [{"type": "text", "text": text} for text in assistant_texts(content)]


def _user_blocks(content: Any) -> list[ContentBlock]:
    blocks: list[ContentBlock] = []
    for part in content or []:
        kind = part.get("type")
        if kind in ("input_text", "text", "output_text"):
            if part.get("text"):
                blocks.append({"type": "text", "text": part["text"]})
        elif kind == "input_image":
            blocks.append(_image(part))
        elif kind == "input_file":
            blocks.append(_document(part))
        else:
            raise unsupported_content(kind)
    return blocks


def _image(part: dict[str, Any]) -> ImageBlock:
    url = part.get("image_url") or ""
    if url.startswith("data:"):
        media_type, data = parse_data_url(url, "application/octet-stream")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    if url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise UpstreamRejected(
        "This model's provider needs images as an http(s) URL or a data URL.",
        code=ErrorCode.UNSUPPORTED_CONTENT,
    )


def _document(part: dict[str, Any]) -> DocumentBlock:
    url = part.get("file_url")
    data = part.get("file_data")
    block: DocumentBlock
    if data:
        if data.startswith("data:"):
            media_type, data = parse_data_url(data, "application/octet-stream")
        else:
            media_type = "text/plain" if (part.get("filename") or "").endswith(".txt") else "application/pdf"
        if _DOC_TYPES.get(media_type) == "text":
            text = _b64decode(data).decode("utf-8", "replace")
            block = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": text}}
        elif media_type == "application/pdf":
            block = {"type": "document", "source": {"type": "base64", "media_type": media_type, "data": data}}
        else:
            raise UpstreamRejected(
                "This model's provider accepts PDF and plain-text files only.",
                code=ErrorCode.UNSUPPORTED_CONTENT,
            )
    elif url:
        block = {"type": "document", "source": {"type": "url", "url": url}}
    else:
        raise UpstreamRejected(
            "This model's provider needs file_data or file_url.", code=ErrorCode.UNSUPPORTED_CONTENT
        )
    if part.get("filename"):
        block["title"] = part["filename"]
    return block


def _b64decode(data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        raise UpstreamRejected("file_data is not valid base64.", code=ErrorCode.INVALID_FILE_DATA) from None


def _tool_use(item: dict[str, Any]) -> ToolUseBlock:
    args = arguments_object(item.get("arguments"))
    return {"type": "tool_use", "id": item["call_id"], "name": item["name"], "input": args}


def _tool_result(item: dict[str, Any]) -> ToolResultBlock:
    output = item.get("output")
    content: str | list[ContentBlock]
    if output is None or isinstance(output, str):
        content = output or ""
    else:
        content = _user_blocks(output)
    block: ToolResultBlock = {"type": "tool_result", "tool_use_id": item["call_id"]}
    if content:
        block["content"] = content
    return block


def _thinking(item: dict[str, Any]) -> ThinkingBlock | RedactedThinkingBlock | None:
    signature = item.get("encrypted_content")
    if not signature:
        return None
    if signature.startswith(REDACTED_PREFIX):
        return {"type": "redacted_thinking", "data": signature[len(REDACTED_PREFIX) :]}
    parts = item.get("summary") or item.get("content") or []
    text = "".join(p.get("text") or "" for p in parts)
    return {"type": "thinking", "thinking": text, "signature": signature}


# -- tools ------------------------------------------------------------------------------------
def build_tools(
    req: UpstreamRequest, *, thinking: bool = False
) -> tuple[list[MessagesTool], MessagesToolChoice | None]:
    """Anthropic ``tools`` and ``tool_choice`` (None: omit). ``allowed_tools`` sends only the subset."""
    tc = parse_tool_choice(req.tool_choice)
    choice: MessagesToolChoice = _mode(tc.mode) if tc.name is None else {"type": "tool", "name": tc.name}
    tools: list[MessagesTool] = []
    for tool in function_tools(req.tools, tc.allowed):
        out: MessagesTool = {
            "name": tool["name"],
            "input_schema": tool.get("parameters") or {"type": "object", "properties": {}},
        }
        if tool.get("description"):
            out["description"] = tool["description"]
        tools.append(out)
    if not tools:
        return [], None
    if thinking and choice["type"] in ("any", "tool"):
        choice = {"type": "auto"}  # extended thinking only allows auto/none; the gateway still filters
    if req.parallel_tool_calls is False and choice["type"] != "none":
        choice["disable_parallel_tool_use"] = True
    return tools, (None if choice == {"type": "auto"} else choice)


def _mode(mode: str) -> MessagesToolChoice:
    return {"type": {"required": "any", "none": "none"}.get(mode, "auto")}
