"""Wire models of a request (``CreateResponseBody``, its items, tools and controls).

Pydantic at the edge: parse once, then the rest of the gateway works on plain dicts.
Unknown extra fields are ignored (schemas are not sealed); a wrong type is a 400 whose
``param`` names the field path (see ``gateway/engine/validate.py``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StringConstraints, Tag

TOOL_NAME = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]
CALL_ID = Annotated[str, StringConstraints(min_length=1, max_length=64)]
MAX_TEXT = 10 * 1024 * 1024


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# -- content parts -------------------------------------------------------------------------------
class InputText(_Wire):
    type: Literal["input_text", "text"]
    text: str


class InputImage(_Wire):
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["low", "high", "auto"] | None = None


class InputFile(_Wire):
    type: Literal["input_file"]
    filename: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    file_id: str | None = None


class InputVideo(_Wire):
    type: Literal["input_video"]
    video_url: str


class OutputText(_Wire):
    type: Literal["output_text"]
    text: str
    annotations: list[dict[str, Any]] | None = None
    logprobs: list[dict[str, Any]] | None = None


class Refusal(_Wire):
    type: Literal["refusal"]
    refusal: str


ContentPart = Annotated[
    InputText | InputImage | InputFile | InputVideo | OutputText | Refusal, Field(discriminator="type")
]
OutputPart = Annotated[InputText | InputImage | InputFile | InputVideo, Field(discriminator="type")]


# -- items ----------------------------------------------------------------------------------------
class MessageItem(_Wire):
    type: Literal["message"] | None = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Annotated[str, StringConstraints(max_length=MAX_TEXT)] | list[ContentPart]
    id: str | None = None
    status: str | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallItem(_Wire):
    type: Literal["function_call"]
    call_id: CALL_ID
    name: TOOL_NAME
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Wire):
    type: Literal["function_call_output"]
    call_id: CALL_ID
    output: Annotated[str, StringConstraints(max_length=MAX_TEXT)] | list[OutputPart]
    id: str | None = None
    status: str | None = None


class SummaryText(_Wire):
    type: Literal["summary_text"] = "summary_text"
    text: str


class ReasoningText(_Wire):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(_Wire):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: str | None = None


class ItemReference(_Wire):
    type: Literal["item_reference"] | None = "item_reference"
    id: str


class CompactionItem(_Wire):
    type: Literal["compaction"]
    encrypted_content: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT)]
    id: str | None = None
    created_by: str | None = None


# -- hosted-tool receipts (OpenAI's MCP items: gateway/engine/hosted.py) ---------------------------
LABEL = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]
MCP_NAME = Annotated[str, StringConstraints(min_length=1, max_length=128)]


class McpListedTool(_Wire):
    name: MCP_NAME
    input_schema: dict[str, Any]
    description: str | None = None
    annotations: dict[str, Any] | None = None


class McpListToolsItem(_Wire):
    type: Literal["mcp_list_tools"]
    id: str
    server_label: LABEL
    tools: Annotated[list[McpListedTool], Field(max_length=1024)]
    error: str | None = None
    status: str | None = None


class McpCallItem(_Wire):
    type: Literal["mcp_call"]
    id: str
    server_label: LABEL
    name: MCP_NAME
    arguments: str
    output: Annotated[str, StringConstraints(max_length=MAX_TEXT)] | None = None
    error: dict[str, Any] | str | None = None
    approval_request_id: str | None = None
    status: str | None = None


class McpApprovalRequestItem(_Wire):
    type: Literal["mcp_approval_request"]
    id: str
    server_label: LABEL
    name: MCP_NAME
    arguments: str
    status: str | None = None


class McpApprovalResponseItem(_Wire):
    type: Literal["mcp_approval_response"]
    approval_request_id: str
    approve: bool
    id: str | None = None
    reason: str | None = None


def _item_tag(value: Any) -> str | None:
    if isinstance(value, dict):
        tag = value.get("type")
        if tag is None:
            return "message" if "role" in value else "item_reference"
        return tag if isinstance(tag, str) else None
    return getattr(value, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[ItemReference, Tag("item_reference")]
    | Annotated[CompactionItem, Tag("compaction")]
    | Annotated[McpListToolsItem, Tag("mcp_list_tools")]
    | Annotated[McpCallItem, Tag("mcp_call")]
    | Annotated[McpApprovalRequestItem, Tag("mcp_approval_request")]
    | Annotated[McpApprovalResponseItem, Tag("mcp_approval_response")],
    Discriminator(_item_tag),
]
MCP_ITEM_TAGS = frozenset({"mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response"})
_CORE_TAGS = {"message", "function_call", "function_call_output", "reasoning", "item_reference", "compaction"}
ITEM_TAGS = frozenset(_CORE_TAGS) | MCP_ITEM_TAGS
PART_TAGS = frozenset(
    {"input_text", "text", "input_image", "input_file", "input_video", "output_text", "refusal"}
)


# -- tools and controls -------------------------------------------------------------------------
class FunctionTool(_Wire):
    type: Literal["function"]
    name: TOOL_NAME
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class McpToolFilter(_Wire):
    """Which of a server's tools a rule covers: by name, and/or by its ``readOnlyHint``."""

    tool_names: Annotated[list[MCP_NAME], Field(max_length=1024)] | None = None
    read_only: bool | None = None


class McpApprovalFilter(_Wire):
    always: McpToolFilter | None = None
    never: McpToolFilter | None = None


HeaderValue = Annotated[str, StringConstraints(max_length=8192)]


class McpTool(_Wire):
    """A remote MCP server the gateway runs for the model (OpenAI's ``type: "mcp"`` tool):
    ``headers`` and ``authorization`` are secrets (never echoed, logged or stored)."""

    type: Literal["mcp"]
    server_label: LABEL
    server_url: Annotated[str, StringConstraints(min_length=1, max_length=2048)] | None = None
    server_description: Annotated[str, StringConstraints(max_length=4096)] | None = None
    headers: Annotated[dict[str, HeaderValue], Field(max_length=32)] | None = None
    authorization: Annotated[str, StringConstraints(max_length=8192)] | None = None
    allowed_tools: Annotated[list[MCP_NAME], Field(max_length=1024)] | McpToolFilter | None = None
    require_approval: Literal["always", "never"] | McpApprovalFilter | None = None
    connector_id: str | None = None


Tool = Annotated[FunctionTool | McpTool, Field(discriminator="type")]
TOOL_TAGS = frozenset({"function", "mcp"})


class ToolChoiceFunction(_Wire):
    type: Literal["function"]
    name: TOOL_NAME


class AllowedToolRef(_Wire):
    type: Literal["function"] = "function"
    name: TOOL_NAME


class ToolChoiceAllowed(_Wire):
    type: Literal["allowed_tools"]
    tools: Annotated[list[AllowedToolRef], Field(min_length=1, max_length=128)]
    mode: Literal["none", "auto", "required"] = "auto"


ToolChoice = (
    Literal["none", "auto", "required"]
    | Annotated[ToolChoiceFunction | ToolChoiceAllowed, Field(discriminator="type")]
)


class TextFormatText(_Wire):
    type: Literal["text"]


class TextFormatJsonObject(_Wire):
    type: Literal["json_object"]


class TextFormatJsonSchema(_Wire):
    type: Literal["json_schema"]
    name: str
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class TextParam(_Wire):
    format: (
        Annotated[TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")]
        | None
    ) = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningParam(_Wire):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["concise", "detailed", "auto"] | None = None


class StreamOptions(_Wire):
    include_obfuscation: bool | None = None


Metadata = Annotated[
    dict[Annotated[str, StringConstraints(max_length=64)], Annotated[str, StringConstraints(max_length=512)]],
    Field(max_length=16),
]
ShortStr = Annotated[str, StringConstraints(max_length=64)]


class ContextManagement(_Wire):
    """One ``context_management`` entry: compact the context before sampling once it exceeds
    ``compact_threshold`` estimated tokens (None: the gateway's default, see compact/inline.py)."""

    type: Literal["compaction"]
    compact_threshold: int | None = Field(default=None, ge=1)


class CreateResponseBody(_Wire):
    model: str | None = None
    input: Annotated[str, StringConstraints(max_length=MAX_TEXT)] | list[InputItem] | None = None
    previous_response_id: str | None = None
    include: list[Literal["reasoning.encrypted_content", "message.output_text.logprobs"]] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    metadata: Metadata | None = None
    text: TextParam | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    parallel_tool_calls: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    background: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=16)
    max_tool_calls: int | None = Field(default=None, ge=1)
    reasoning: ReasoningParam | None = None
    safety_identifier: ShortStr | None = None
    prompt_cache_key: ShortStr | None = None
    truncation: Literal["auto", "disabled"] | None = None
    instructions: Annotated[str, StringConstraints(max_length=MAX_TEXT)] | None = None
    store: bool | None = None
    service_tier: Literal["auto", "default", "flex", "priority"] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # OpenAI extensions (the openai SDK sends them on the WebSocket; over HTTP in extra_body)
    generate: bool | None = None  # false: keep the input as a turn, generate nothing (warm-up)
    context_management: Annotated[list[ContextManagement], Field(max_length=8)] | None = None


class CompactRequestBody(_Wire):
    model: str
    input: Annotated[str, StringConstraints(max_length=MAX_TEXT)] | list[InputItem] | None = None
    previous_response_id: str | None = None
    instructions: str | None = None
    prompt_cache_key: ShortStr | None = None
