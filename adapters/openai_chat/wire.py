"""The Chat Completions request as :mod:`adapters.openai_chat.request` builds it and the adapter
sends it: types only (plain dicts at runtime)."""

from __future__ import annotations

from typing import Any, Literal, Required, TypedDict

__all__ = [
    "ChatFunction",
    "ChatRequest",
    "ChatStreamOptions",
    "ChatTool",
    "ChatToolChoice",
    "SamplingKey",
]

SamplingKey = Literal["temperature", "top_p", "presence_penalty", "frequency_penalty"]


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


class ChatStreamOptions(TypedDict):
    include_usage: bool


class ChatRequest(TypedDict, total=False):
    """The ``POST /chat/completions`` body; ``model`` and ``messages`` are always set."""

    model: Required[str]
    messages: Required[list[dict[str, Any]]]
    tools: list[ChatTool]
    tool_choice: ChatToolChoice
    parallel_tool_calls: bool
    max_tokens: int
    temperature: float
    top_p: float
    presence_penalty: float
    frequency_penalty: float
    response_format: dict[str, Any]
    logprobs: bool
    top_logprobs: int
    verbosity: str
    reasoning_effort: str
    stream: bool
    stream_options: ChatStreamOptions
