"""The Messages API request as :mod:`adapters.anthropic.request` builds it and the adapter sends
it: types only (plain dicts at runtime)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, Required, TypedDict

__all__ = [
    "CacheControl",
    "ContentBlock",
    "DocumentBlock",
    "ImageBlock",
    "MessagesMessage",
    "MessagesMetadata",
    "MessagesRequest",
    "MessagesSampling",
    "MessagesThinking",
    "MessagesTool",
    "MessagesToolChoice",
    "RedactedThinkingBlock",
    "TextBlock",
    "ThinkingBlock",
    "ToolResultBlock",
    "ToolUseBlock",
]


class CacheControl(TypedDict):
    """A prompt-cache breakpoint: the prefix up to and including the block it marks is cached."""

    type: Literal["ephemeral"]


class TextBlock(TypedDict):
    type: Literal["text"]
    text: str
    cache_control: NotRequired[CacheControl]


class ImageBlock(TypedDict):
    """``source``: ``{"type": "base64", "media_type", "data"}`` or ``{"type": "url", "url"}``."""

    type: Literal["image"]
    source: dict[str, str]
    cache_control: NotRequired[CacheControl]


class DocumentBlock(TypedDict, total=False):
    """``source``: base64 (PDF), text, or url; ``title`` is the file's name when it has one."""

    type: Required[Literal["document"]]
    source: Required[dict[str, str]]
    title: str
    cache_control: CacheControl


class ToolUseBlock(TypedDict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: NotRequired[CacheControl]


class ToolResultBlock(TypedDict, total=False):
    type: Required[Literal["tool_result"]]
    tool_use_id: Required[str]
    content: str | list[ContentBlock]
    cache_control: CacheControl


class ThinkingBlock(TypedDict):
    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlock(TypedDict):
    type: Literal["redacted_thinking"]
    data: str


ContentBlock = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
)


class MessagesMessage(TypedDict):
    """One turn and its blocks."""

    role: Literal["user", "assistant"]
    content: list[ContentBlock]


class MessagesThinking(TypedDict):
    type: Literal["enabled"]
    budget_tokens: int


class MessagesTool(TypedDict, total=False):
    name: Required[str]
    input_schema: Required[dict[str, Any]]
    description: str
    cache_control: CacheControl


class MessagesToolChoice(TypedDict, total=False):
    """``auto`` | ``any`` | ``none`` | ``tool`` (with ``name``)."""

    type: Required[str]
    name: str
    disable_parallel_tool_use: bool


class MessagesMetadata(TypedDict):
    user_id: str


class MessagesSampling(TypedDict, total=False):
    temperature: float
    top_p: float


class MessagesRequest(TypedDict, total=False):
    """The ``POST /v1/messages`` body; ``model``, ``max_tokens`` and ``messages`` are always set."""

    model: Required[str]
    max_tokens: Required[int]
    messages: Required[list[MessagesMessage]]
    system: str | list[TextBlock]  # blocks when a cache breakpoint marks it
    thinking: MessagesThinking
    tools: list[MessagesTool]
    tool_choice: MessagesToolChoice
    temperature: float
    top_p: float
    metadata: MessagesMetadata
    stop_sequences: list[str]
    stream: bool
