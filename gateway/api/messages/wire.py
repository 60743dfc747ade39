"""Wire models of an Anthropic Messages request (``POST /v1/messages``, ``/v1/messages/count_tokens``).

Pydantic at the edge, strict like the rest of the gateway's requests: a wrong type is a 400 whose
message names the field the way Anthropic's API does (``messages.0.content.1.source: ...``). Unknown
top-level fields are kept (``extra="allow"``): an anthropic upstream gets them back unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gateway.kernel.spec.request import MAX_TEXT, TOOL_NAME

_Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]
_Id = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class _Block(BaseModel):
    model_config = ConfigDict(extra="ignore")
    cache_control: dict[str, Any] | None = None


class TextBlock(_Block):
    type: Literal["text"]
    text: _Text
    citations: list[dict[str, Any]] | None = None


class Base64Source(BaseModel):
    type: Literal["base64"]
    media_type: str
    data: str


class UrlSource(BaseModel):
    type: Literal["url"]
    url: str


class TextSource(BaseModel):
    type: Literal["text"]
    media_type: str = "text/plain"
    data: _Text


class ImageBlock(_Block):
    type: Literal["image"]
    source: Annotated[Base64Source | UrlSource, Field(discriminator="type")]


class DocumentBlock(_Block):
    type: Literal["document"]
    source: Annotated[Base64Source | UrlSource | TextSource, Field(discriminator="type")]
    title: str | None = None


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: _Id
    name: TOOL_NAME
    input: dict[str, Any]


ResultPart = Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: _Id
    content: _Text | list[ResultPart] | None = None
    is_error: bool | None = None


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: _Text
    signature: str


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock,
    Field(discriminator="type"),
]
BLOCK_TAGS = frozenset(
    {"text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking", "base64", "url"}
)


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant"]
    content: _Text | list[Block]


class Tool(BaseModel):
    """A client tool (``type`` omitted or ``custom``); server tools are refused by name."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["custom"] | None = None
    name: TOOL_NAME
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["auto", "any", "tool", "none"]
    name: TOOL_NAME | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=1024)
    display: Literal["summarized", "omitted"] | None = None


class Metadata(BaseModel):
    model_config = ConfigDict(extra="ignore")
    user_id: Annotated[str, StringConstraints(max_length=256)] | None = None


class CountTokensBody(BaseModel):
    """``POST /v1/messages/count_tokens``: a Messages request without ``max_tokens``."""

    model_config = ConfigDict(extra="allow")
    model: str
    messages: Annotated[list[Message], Field(min_length=1)]
    system: _Text | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesBody(CountTokensBody):
    max_tokens: int = Field(ge=1)
    stop_sequences: (
        Annotated[list[Annotated[str, StringConstraints(min_length=1)]], Field(max_length=8192)] | None
    ) = None
    stream: bool | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
