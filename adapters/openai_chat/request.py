"""Pure request translation: a normalized ``UpstreamRequest`` → a Chat Completions JSON body.

Chosen for the widest compatibility (vLLM, Ollama, llama.cpp, OpenRouter, Groq): developer
messages become ``system``, text-only content is a plain string, ``max_tokens`` not
``max_completion_tokens``, and ``tool_choice`` is omitted when it is ``auto``.
"""

from __future__ import annotations

from typing import Any, Literal, cast, get_args

from adapters.base import UpstreamRequest
from adapters.content import DEFAULT_ONE, LOGPROBS_INCLUDE, native_stop, unsupported_content
from adapters.openai_chat.wire import (
    ChatContentPart,
    ChatFile,
    ChatFunction,
    ChatImageURL,
    ChatJSONSchema,
    ChatMessage,
    ChatRequest,
    ChatResponseFormat,
    ChatTool,
    ChatToolCall,
    ChatToolChoice,
    SamplingKey,
)
from adapters.tools import function_tools
from gateway.kernel.client_api import ClientApi
from gateway.kernel.errors import ErrorCode, UpstreamRejected
from gateway.kernel.tool_choice import parse_tool_choice

__all__ = ["build_body", "build_messages", "build_tools"]

_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
# the chat role of a one-text-part message's role (developer → system; an unknown role → user)
_ROLES: dict[str, Literal["user", "assistant", "system"]] = {
    "user": "user",
    "assistant": "assistant",
    "system": "system",
    "developer": "system",
}
_FUNCTION_KEYS: tuple[Literal["description", "parameters", "strict"], ...] = (
    "description",
    "parameters",
    "strict",
)
_SAMPLING: tuple[SamplingKey, ...] = get_args(SamplingKey)


def build_body(req: UpstreamRequest, *, send_defaults: bool = True) -> ChatRequest:
    """The ``/chat/completions`` request body for ``req`` (streamed, with usage in the stream,
    unless ``req.stream`` is False). A Chat Completions client's request is its own body, as it
    came (``req.native``), with the route's model and the gateway's streaming in place of the
    client's."""
    if req.native is not None and req.native.api is ClientApi.CHAT:
        native = cast(ChatRequest, {**req.native.fields, "model": req.model})
        if req.stream:
            native["stream"] = True
            native["stream_options"] = {"include_usage": True}
        else:
            native.pop("stream", None)
            native.pop("stream_options", None)
        return native
    body: ChatRequest = {"model": req.model, "messages": build_messages(req)}
    tools, tool_choice = build_tools(req.tools, req.tool_choice)
    if tools:
        body["tools"] = tools
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
        if req.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = req.parallel_tool_calls
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    for name in _SAMPLING:
        value = getattr(req, name)
        if value is not None and (send_defaults or not (name in DEFAULT_ONE and value == 1.0)):
            body[name] = value
    response_format = _response_format(req.text_format)
    if response_format is not None:
        body["response_format"] = response_format
    if req.top_logprobs is not None or LOGPROBS_INCLUDE in req.include:
        body["logprobs"] = True
        if req.top_logprobs:
            body["top_logprobs"] = req.top_logprobs
    if req.verbosity is not None:
        body["verbosity"] = req.verbosity  # OpenAI's Chat Completions parameter (GPT-5 family)
    effort = (req.reasoning or {}).get("effort")
    if isinstance(effort, str):
        body["reasoning_effort"] = effort
    if req.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    stop = native_stop(req)  # a Messages client's stop_sequences
    if stop:
        body["stop"] = stop  # type: ignore[typeddict-unknown-key]
    return body


# -- messages ---------------------------------------------------------------------------------
def build_messages(req: UpstreamRequest) -> list[ChatMessage]:
    """The transcript as chat messages; reasoning items are dropped (chat has no slot for them)."""
    out: list[ChatMessage] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    # Tool outputs may carry images, which a chat "tool" message cannot: they follow the run of
    # tool messages as one user message, so the tool messages stay adjacent to their call.
    pending_images: list[ChatContentPart] = []
    tool_calls_open: ChatMessage | None = None  # the assistant message that collects calls
    for item in req.items:
        kind = item.get("type", "message")
        if kind == "reasoning":
            continue  # transparent: calls after it still merge into the previous assistant turn
        if kind != "function_call_output" and pending_images:
            out.append({"role": "user", "content": pending_images})
            pending_images = []
        if kind == "message":
            msg = _message(item)
            if msg is None:
                continue
            out.append(msg)
            tool_calls_open = msg if msg["role"] == "assistant" else None
        elif kind == "function_call":
            call: ChatToolCall = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"},
            }
            if tool_calls_open is None:
                tool_calls_open = {"role": "assistant", "content": None}
                out.append(tool_calls_open)
            tool_calls_open.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            text, images = _tool_output(item.get("output"))
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
            pending_images += images
            tool_calls_open = None
        else:
            tool_calls_open = None  # an item kind chat cannot express; nothing to send
    if pending_images:
        out.append({"role": "user", "content": pending_images})
    return out


def _message(item: dict[str, Any]) -> ChatMessage | None:
    role = item.get("role", "user")
    content = item.get("content")
    # the replayed history's usual message, one text part: what the general paths below give
    if type(content) is list and len(content) == 1:
        part = content[0]
        kind = part.get("type") if type(part) is dict else None
        if kind in _TEXT_PARTS:
            return {"role": _ROLES.get(role, "user"), "content": part.get("text") or ""}
    if role == "assistant":
        text = _join_text(content, refusals=True)
        return {"role": "assistant", "content": text}
    if role in ("system", "developer"):
        return {"role": "system", "content": _join_text(content)}
    if isinstance(content, str):  # the common user message: what the parts path below gives
        return {"role": "user", "content": content}
    parts = _user_parts(content)
    if not parts:
        return {"role": "user", "content": ""}
    if all(p["type"] == "text" for p in parts):
        return {"role": "user", "content": "\n".join(p["text"] for p in parts)}
    return {"role": "user", "content": parts}


def _join_text(content: Any, *, refusals: bool = False) -> str:
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for part in content or []:
        t = part.get("type")
        if t in _TEXT_PARTS:
            texts.append(part.get("text") or "")
        elif t == "refusal" and refusals:
            texts.append(part.get("refusal") or "")
    return "\n".join(texts)


def _user_parts(content: Any) -> list[ChatContentPart]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts: list[ChatContentPart] = []
    for part in content or []:
        t = part.get("type")
        if t in _TEXT_PARTS:
            parts.append({"type": "text", "text": part.get("text") or ""})
        elif t == "input_image":
            parts.append(_image(part))
        elif t == "input_file":
            parts.append(_file(part))
        else:
            raise unsupported_content(t)
    return parts


def _image(part: dict[str, Any]) -> ChatContentPart:
    url = part.get("image_url")
    if not url:
        raise UpstreamRejected(
            "This model's provider needs images as a URL or data URL.", code=ErrorCode.UNSUPPORTED_CONTENT
        )
    image: ChatImageURL = {"url": url}
    if part.get("detail"):
        image["detail"] = part["detail"]
    return {"type": "image_url", "image_url": image}


def _file(part: dict[str, Any]) -> ChatContentPart:
    data = part.get("file_data")
    if not data:
        raise UpstreamRejected(
            "This model's provider accepts files only as inline file_data.",
            code=ErrorCode.UNSUPPORTED_CONTENT,
        )
    file: ChatFile = {"file_data": data}
    if part.get("filename"):
        file["filename"] = part["filename"]
    return {"type": "file", "file": file}


def _tool_output(output: Any) -> tuple[str, list[ChatContentPart]]:
    """The text of a tool output, and its images/files (as user content parts)."""
    if output is None:
        return "", []
    if isinstance(output, str):
        return output, []
    texts: list[str] = []
    media: list[ChatContentPart] = []
    for part in output:
        t = part.get("type")
        if t in _TEXT_PARTS:
            texts.append(part.get("text") or "")
        elif t == "input_image":
            media.append(_image(part))
        elif t == "input_file":
            media.append(_file(part))
    return "\n".join(texts), media


# -- tools ------------------------------------------------------------------------------------
def build_tools(
    tools: list[dict[str, Any]], tool_choice: str | dict[str, Any]
) -> tuple[list[ChatTool], ChatToolChoice | None]:
    """Chat ``tools`` and ``tool_choice`` (None: omit it). ``allowed_tools`` sends only the subset."""
    tc = parse_tool_choice(tool_choice)
    choice: ChatToolChoice
    choice = tc.mode if tc.name is None else {"type": "function", "function": {"name": tc.name}}
    out: list[ChatTool] = []
    for tool in function_tools(tools, tc.allowed):
        fn: ChatFunction = {"name": tool["name"]}
        for key in _FUNCTION_KEYS:
            if tool.get(key) is not None:
                fn[key] = tool[key]
        out.append({"type": "function", "function": fn})
    return out, (None if choice == "auto" else choice)


def _response_format(text_format: dict[str, Any] | None) -> ChatResponseFormat | None:
    if not text_format:
        return None
    kind = text_format.get("type")
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema: ChatJSONSchema = {"name": text_format.get("name") or "response"}
        if text_format.get("description") is not None:
            schema["description"] = text_format["description"]
        schema["schema"] = text_format.get("schema") or {}
        if text_format.get("strict") is not None:
            schema["strict"] = text_format["strict"]
        return {"type": "json_schema", "json_schema": schema}
    return None
