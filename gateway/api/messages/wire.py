"""Wire shapes of an Anthropic Messages request (``POST /v1/messages``, ``/v1/messages/count_tokens``).

``TypedDict`` s validated strictly by one ``TypeAdapter`` each (:data:`MESSAGES_BODY`,
:data:`COUNT_BODY`), like the rest of the gateway's requests: a wrong type is a 400 whose message
names the field the way Anthropic's API does (``messages.0.content.1.source: ...``). A validated
request is the client's JSON as plain dicts with the known keys only (half what models of the same
fields cost to validate); a key left out is absent. The client's body itself, unknown fields and
all, is what an anthropic upstream gets (``adapters.base.NativeFields``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Required

from pydantic import ConfigDict, Field, StringConstraints, TypeAdapter, with_config
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from gateway.kernel.spec.request import MAX_TEXT, TOOL_NAME

_Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]
_Id = Annotated[str, StringConstraints(min_length=1, max_length=64)]
_WIRE = ConfigDict(extra="ignore")


class _Block(TypedDict, total=False):
    """What every content block may carry."""

    cache_control: dict[str, Any] | None


@with_config(_WIRE)
class TextBlock(_Block, total=False):
    type: Required[Literal["text"]]
    text: Required[_Text]
    citations: list[dict[str, Any]] | None


@with_config(_WIRE)
class Base64Source(TypedDict):
    type: Literal["base64"]
    media_type: str
    data: str


@with_config(_WIRE)
class UrlSource(TypedDict):
    type: Literal["url"]
    url: str


@with_config(_WIRE)
class TextSource(TypedDict, total=False):
    type: Required[Literal["text"]]
    media_type: str
    data: Required[_Text]


@with_config(_WIRE)
class ImageBlock(_Block, total=False):
    type: Required[Literal["image"]]
    source: Required[Annotated[Base64Source | UrlSource, Field(discriminator="type")]]


@with_config(_WIRE)
class DocumentBlock(_Block, total=False):
    type: Required[Literal["document"]]
    source: Required[Annotated[Base64Source | UrlSource | TextSource, Field(discriminator="type")]]
    title: str | None


@with_config(_WIRE)
class ToolUseBlock(_Block, total=False):
    type: Required[Literal["tool_use"]]
    id: Required[_Id]
    name: Required[TOOL_NAME]
    input: Required[dict[str, Any]]


ResultPart = Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]


@with_config(_WIRE)
class ToolResultBlock(_Block, total=False):
    type: Required[Literal["tool_result"]]
    tool_use_id: Required[_Id]
    content: _Text | list[ResultPart] | None
    is_error: bool | None


@with_config(_WIRE)
class ThinkingBlock(_Block, total=False):
    type: Required[Literal["thinking"]]
    thinking: Required[_Text]
    signature: Required[str]


@with_config(_WIRE)
class RedactedThinkingBlock(_Block, total=False):
    type: Required[Literal["redacted_thinking"]]
    data: Required[str]


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


@with_config(_WIRE)
class Message(TypedDict):
    role: Literal["user", "assistant"]
    content: _Text | list[Block]


@with_config(_WIRE)
class Tool(TypedDict, total=False):
    """A client tool (``type`` omitted or ``custom``); server tools are refused by name."""

    type: Literal["custom"] | None
    name: Required[TOOL_NAME]
    description: str | None
    input_schema: Required[dict[str, Any]]


@with_config(_WIRE)
class ToolChoice(TypedDict, total=False):
    type: Required[Literal["auto", "any", "tool", "none"]]
    name: TOOL_NAME | None
    disable_parallel_tool_use: bool | None


@with_config(_WIRE)
class Thinking(TypedDict, total=False):
    type: Required[Literal["enabled", "disabled", "adaptive"]]
    budget_tokens: Annotated[int, Field(ge=1024)] | None
    display: Literal["summarized", "omitted"] | None


@with_config(_WIRE)
class Metadata(TypedDict, total=False):
    user_id: Annotated[str, StringConstraints(max_length=256)] | None


@with_config(_WIRE)
class CountTokensBody(TypedDict, total=False):
    """``POST /v1/messages/count_tokens``: a Messages request without ``max_tokens``."""

    model: Required[str]
    messages: Required[Annotated[list[Message], Field(min_length=1)]]
    system: _Text | list[TextBlock] | None
    tools: list[Tool] | None
    tool_choice: ToolChoice | None
    thinking: Thinking | None


@with_config(_WIRE)
class MessagesBody(CountTokensBody, total=False):
    max_tokens: Required[Annotated[int, Field(ge=1)]]
    stop_sequences: (
        Annotated[list[Annotated[str, StringConstraints(min_length=1)]], Field(max_length=8192)] | None
    )
    stream: bool | None
    temperature: Annotated[float, Field(ge=0, le=1)] | None
    top_p: Annotated[float, Field(ge=0, le=1)] | None
    top_k: Annotated[int, Field(ge=0)] | None
    metadata: Metadata | None
    service_tier: Literal["auto", "standard_only"] | None


MESSAGES_BODY: TypeAdapter[MessagesBody] = TypeAdapter(MessagesBody)
COUNT_BODY: TypeAdapter[CountTokensBody] = TypeAdapter(CountTokensBody)
