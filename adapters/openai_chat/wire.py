"""The Chat Completions request as :mod:`adapters.openai_chat.request` builds it and the adapter
sends it: types only (plain dicts at runtime)."""

from __future__ import annotations

from typing import Any, Literal, Required, TypedDict

__all__ = [
    "ChatCallFunction",
    "ChatContentPart",
    "ChatFile",
    "ChatFunction",
    "ChatImageURL",
    "ChatJSONSchema",
    "ChatMessage",
    "ChatRequest",
    "ChatResponseFormat",
    "ChatStreamOptions",
    "ChatTool",
    "ChatToolCall",
    "ChatToolChoice",
    "SamplingKey",
]

SamplingKey = Literal["temperature", "top_p", "presence_penalty", "frequency_penalty"]


class ChatCallFunction(TypedDict):
    name: str
    arguments: str


class ChatToolCall(TypedDict):
    """A call on an assistant message."""

    id: str
    type: Literal["function"]
    function: ChatCallFunction


class ChatImageURL(TypedDict, total=False):
    url: Required[str]
    detail: str


class ChatFile(TypedDict, total=False):
    file_data: Required[str]
    filename: str


class ChatContentPart(TypedDict, total=False):
    """A user content part: ``text`` (with ``text``), ``image_url`` or ``file`` (with that field)."""

    type: Required[Literal["text", "image_url", "file"]]
    text: str
    image_url: ChatImageURL
    file: ChatFile


class ChatMessage(TypedDict, total=False):
    """A chat message: ``content`` is text, user content parts (text, image_url, file), or None on
    an assistant message that only calls tools; ``tool_call_id`` names what a tool message answers."""

    role: Required[Literal["system", "user", "assistant", "tool"]]
    content: Required[str | list[ChatContentPart] | None]
    tool_calls: list[ChatToolCall]
    tool_call_id: str


class ChatFunction(TypedDict, total=False):
    """A function tool's declaration."""

    name: Required[str]
    description: str
    parameters: dict[str, Any]
    strict: bool


class ChatTool(TypedDict):
    type: Literal["function"]
    function: ChatFunction


class ChatFunctionName(TypedDict):
    name: str


class ChatNamedToolChoice(TypedDict):
    """``tool_choice`` forcing one function."""

    type: Literal["function"]
    function: ChatFunctionName


ChatToolChoice = str | ChatNamedToolChoice  # "none" | "required" | one function


class ChatJSONSchema(TypedDict, total=False):
    name: Required[str]
    description: str
    schema: dict[str, Any]  # always set (after description, keeping the key order)
    strict: bool


class ChatResponseFormat(TypedDict, total=False):
    """``json_object``, or ``json_schema`` with its ``json_schema``."""

    type: Required[Literal["json_object", "json_schema"]]
    json_schema: ChatJSONSchema


class ChatStreamOptions(TypedDict):
    include_usage: bool


class ChatRequest(TypedDict, total=False):
    """The ``POST /chat/completions`` body; ``model`` and ``messages`` are always set."""

    model: Required[str]
    messages: Required[list[ChatMessage]]
    tools: list[ChatTool]
    tool_choice: ChatToolChoice
    parallel_tool_calls: bool
    max_tokens: int
    temperature: float
    top_p: float
    presence_penalty: float
    frequency_penalty: float
    response_format: ChatResponseFormat
    logprobs: bool
    top_logprobs: int
    verbosity: str
    reasoning_effort: str
    stream: bool
    stream_options: ChatStreamOptions
