"""The Responses API request as :mod:`adapters.openai_responses.request` builds it and the adapter
sends it: types only (plain dicts at runtime)."""

from __future__ import annotations

from typing import Any, Literal, Required, TypedDict

__all__ = [
    "PassThroughKey",
    "ResponsesFunctionCall",
    "ResponsesFunctionCallOutput",
    "ResponsesInputItem",
    "ResponsesMessage",
    "ResponsesReasoning",
    "ResponsesRequest",
    "ResponsesText",
]

# the request fields sent upstream as the client gave them
PassThroughKey = Literal[
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "parallel_tool_calls",
    "max_output_tokens",
    "max_tool_calls",
    "top_logprobs",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "metadata",
]


class ResponsesMessage(TypedDict, total=False):
    """A message input item; ``content`` parts are the transcript's, ``None`` values dropped."""

    type: Required[Literal["message"]]
    role: Required[str]
    content: Required[list[dict[str, Any]]]
    phase: str


class ResponsesFunctionCall(TypedDict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class ResponsesFunctionCallOutput(TypedDict):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[dict[str, Any]]


class ResponsesReasoning(TypedDict, total=False):
    """A reasoning input item: it carries ``encrypted_content`` or ``content`` (else it is dropped)."""

    type: Required[Literal["reasoning"]]
    summary: Required[list[dict[str, Any]]]
    encrypted_content: str
    content: list[dict[str, Any]]
    id: str


ResponsesInputItem = (
    ResponsesMessage | ResponsesFunctionCall | ResponsesFunctionCallOutput | ResponsesReasoning
)


class ResponsesText(TypedDict, total=False):
    format: dict[str, Any]
    verbosity: str


class ResponsesRequest(TypedDict, total=False):
    """The ``POST /responses`` body; ``model``, ``input``, ``stream`` and ``store`` are always set."""

    model: Required[str]
    input: Required[list[ResponsesInputItem]]
    stream: Required[bool]
    store: Required[bool]
    instructions: str
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]
    temperature: float
    top_p: float
    presence_penalty: float
    frequency_penalty: float
    parallel_tool_calls: bool
    max_output_tokens: int
    max_tool_calls: int
    top_logprobs: int
    service_tier: str
    safety_identifier: str
    prompt_cache_key: str
    metadata: dict[str, str]
    text: ResponsesText
    reasoning: dict[str, Any]
    include: list[str]
