"""The Messages API request as :mod:`adapters.anthropic.request` builds it and the adapter sends
it: types only (plain dicts at runtime)."""

from __future__ import annotations

from typing import Any, Literal, Required, TypedDict

__all__ = [
    "MessagesMessage",
    "MessagesMetadata",
    "MessagesRequest",
    "MessagesThinking",
    "MessagesTool",
    "MessagesToolChoice",
]


class MessagesMessage(TypedDict):
    """One turn; ``content`` is its blocks (text, image, document, tool_use, tool_result, thinking)."""

    role: Literal["user", "assistant"]
    content: list[dict[str, Any]]


class MessagesThinking(TypedDict):
    type: Literal["enabled"]
    budget_tokens: int


class MessagesTool(TypedDict, total=False):
    name: Required[str]
    input_schema: Required[dict[str, Any]]
    description: str


class MessagesToolChoice(TypedDict, total=False):
    """``auto`` | ``any`` | ``none`` | ``tool`` (with ``name``)."""

    type: Required[str]
    name: str
    disable_parallel_tool_use: bool


class MessagesMetadata(TypedDict):
    user_id: str


class MessagesRequest(TypedDict, total=False):
    """The ``POST /v1/messages`` body; ``model``, ``max_tokens`` and ``messages`` are always set."""

    model: Required[str]
    max_tokens: Required[int]
    messages: Required[list[MessagesMessage]]
    system: str
    thinking: MessagesThinking
    tools: list[MessagesTool]
    tool_choice: MessagesToolChoice
    temperature: float
    top_p: float
    metadata: MessagesMetadata
    stream: bool
