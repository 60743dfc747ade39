"""Wire models of a Chat Completions request (``POST /v1/chat/completions``), as OpenAI's API defines
it: what the ingress (gateway/api/chat/) validates before it builds the engine's request.

Fields the engine has no place for (``seed``, ``stop``, ``logit_bias``, vendor extensions …) are not
modelled beyond their type: the ingress hands them on as they came (``adapters.base.NativeFields``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gateway.kernel.spec.request import MAX_TEXT, TOOL_NAME, Metadata, ShortStr

Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# -- content parts -------------------------------------------------------------------------------
class ChatText(_Wire):
    type: Literal["text"]
    text: Text


class ChatImageURL(_Wire):
    url: str
    detail: Literal["low", "high", "auto"] | None = None


class ChatImage(_Wire):
    type: Literal["image_url"]
    image_url: ChatImageURL


class ChatFileRef(_Wire):
    file_data: str | None = None
    file_id: str | None = None
    filename: str | None = None


class ChatFile(_Wire):
    type: Literal["file"]
    file: ChatFileRef


class ChatAudioData(_Wire):
    data: str
    format: str


class ChatAudio(_Wire):
    type: Literal["input_audio"]
    input_audio: ChatAudioData


class ChatRefusal(_Wire):
    type: Literal["refusal"]
    refusal: str


ChatPart = Annotated[ChatText | ChatImage | ChatFile | ChatAudio | ChatRefusal, Field(discriminator="type")]


# -- messages -------------------------------------------------------------------------------------
class ChatCallFunction(_Wire):
    name: TOOL_NAME
    arguments: str


class ChatToolCall(_Wire):
    id: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    type: Literal["function"]
    function: ChatCallFunction


class ChatMessage(_Wire):
    """One message of any role; which fields a role may carry is checked by the ingress, naming
    the field (``messages[2].tool_call_id``)."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Text | list[ChatPart] | None = None
    name: str | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None


# -- tools and controls ---------------------------------------------------------------------------
class ChatFunctionDef(_Wire):
    name: TOOL_NAME
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatFunctionTool(_Wire):
    type: Literal["function"]
    function: ChatFunctionDef


class ChatNamedFunction(_Wire):
    name: TOOL_NAME


class ChatToolChoiceFunction(_Wire):
    type: Literal["function"]
    function: ChatNamedFunction


class ChatAllowedTool(_Wire):
    type: Literal["function"]
    function: ChatNamedFunction


class ChatAllowedTools(_Wire):
    mode: Literal["auto", "required"]
    tools: Annotated[list[ChatAllowedTool], Field(min_length=1, max_length=128)]


class ChatToolChoiceAllowed(_Wire):
    type: Literal["allowed_tools"]
    allowed_tools: ChatAllowedTools


ChatToolChoice = (
    Literal["none", "auto", "required"]
    | Annotated[ChatToolChoiceFunction | ChatToolChoiceAllowed, Field(discriminator="type")]
)


class ChatFormatText(_Wire):
    type: Literal["text"]


class ChatFormatJsonObject(_Wire):
    type: Literal["json_object"]


class ChatJsonSchema(_Wire):
    name: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ChatFormatJsonSchema(_Wire):
    type: Literal["json_schema"]
    json_schema: ChatJsonSchema


ChatResponseFormat = Annotated[
    ChatFormatText | ChatFormatJsonObject | ChatFormatJsonSchema, Field(discriminator="type")
]


class ChatStreamOptions(_Wire):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ChatCompletionBody(_Wire):
    model: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[ChatFunctionTool] | None = None
    tool_choice: ChatToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ChatResponseFormat | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    seed: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    logit_bias: dict[str, float] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    user: str | None = None
    safety_identifier: ShortStr | None = None
    prompt_cache_key: ShortStr | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "default", "flex", "priority", "scale"] | None = None
    store: bool | None = None
    n: int | None = Field(default=None, ge=1, le=128)
    stream: bool | None = None
    stream_options: ChatStreamOptions | None = None
