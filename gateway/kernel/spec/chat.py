"""Wire shapes of a Chat Completions request (``POST /v1/chat/completions``), as OpenAI's API defines
it: what the ingress (gateway/api/chat/) validates before it builds the engine's request.

They are ``TypedDict`` s validated by one ``TypeAdapter`` (:data:`CHAT_BODY`): a validated request
is the client's JSON with only the known keys kept, checked, as plain dicts. Validating them costs
half what models of the same fields cost (no instance per message, no defaults to fill), and the
ingress reads only the keys a client sent. A key a client left out is absent; one sent as ``null``
is ``None``, as the API allows.

Fields the engine has no place for (``seed``, ``stop``, ``logit_bias``, vendor extensions …) are not
modelled beyond their type: the ingress hands them on as they came (``adapters.base.NativeFields``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Required

from pydantic import ConfigDict, Field, StringConstraints, TypeAdapter, with_config
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from gateway.kernel.spec.request import MAX_TEXT, TOOL_NAME, Metadata, ShortStr

Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]
_WIRE = ConfigDict(extra="ignore")


# -- content parts -------------------------------------------------------------------------------
@with_config(_WIRE)
class ChatText(TypedDict):
    type: Literal["text"]
    text: Text


@with_config(_WIRE)
class ChatImageURL(TypedDict, total=False):
    url: Required[str]
    detail: Literal["low", "high", "auto"] | None


@with_config(_WIRE)
class ChatImage(TypedDict):
    type: Literal["image_url"]
    image_url: ChatImageURL


@with_config(_WIRE)
class ChatFileRef(TypedDict, total=False):
    file_data: str | None
    file_id: str | None
    filename: str | None


@with_config(_WIRE)
class ChatFile(TypedDict):
    type: Literal["file"]
    file: ChatFileRef


@with_config(_WIRE)
class ChatAudioData(TypedDict):
    data: str
    format: str


@with_config(_WIRE)
class ChatAudio(TypedDict):
    type: Literal["input_audio"]
    input_audio: ChatAudioData


@with_config(_WIRE)
class ChatRefusal(TypedDict):
    type: Literal["refusal"]
    refusal: str


ChatPart = Annotated[ChatText | ChatImage | ChatFile | ChatAudio | ChatRefusal, Field(discriminator="type")]


# -- messages -------------------------------------------------------------------------------------
@with_config(_WIRE)
class ChatCallFunction(TypedDict):
    name: TOOL_NAME
    arguments: str


@with_config(_WIRE)
class ChatToolCall(TypedDict):
    id: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    type: Literal["function"]
    function: ChatCallFunction


@with_config(_WIRE)
class ChatMessage(TypedDict, total=False):
    """One message of any role; which fields a role may carry is checked by the ingress, naming
    the field (``messages[2].tool_call_id``)."""

    role: Required[Literal["system", "developer", "user", "assistant", "tool", "function"]]
    content: Text | list[ChatPart] | None
    name: str | None
    tool_calls: list[ChatToolCall] | None
    tool_call_id: str | None
    refusal: str | None


# -- tools and controls ---------------------------------------------------------------------------
@with_config(_WIRE)
class ChatFunctionDef(TypedDict, total=False):
    name: Required[TOOL_NAME]
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool | None


@with_config(_WIRE)
class ChatFunctionTool(TypedDict):
    type: Literal["function"]
    function: ChatFunctionDef


@with_config(_WIRE)
class ChatNamedFunction(TypedDict):
    name: TOOL_NAME


@with_config(_WIRE)
class ChatToolChoiceFunction(TypedDict):
    type: Literal["function"]
    function: ChatNamedFunction


@with_config(_WIRE)
class ChatAllowedTool(TypedDict):
    type: Literal["function"]
    function: ChatNamedFunction


@with_config(_WIRE)
class ChatAllowedTools(TypedDict):
    mode: Literal["auto", "required"]
    tools: Annotated[list[ChatAllowedTool], Field(min_length=1, max_length=128)]


@with_config(_WIRE)
class ChatToolChoiceAllowed(TypedDict):
    type: Literal["allowed_tools"]
    allowed_tools: ChatAllowedTools


ChatToolChoice = (
    Literal["none", "auto", "required"]
    | Annotated[ChatToolChoiceFunction | ChatToolChoiceAllowed, Field(discriminator="type")]
)


@with_config(_WIRE)
class ChatFormatText(TypedDict):
    type: Literal["text"]


@with_config(_WIRE)
class ChatFormatJsonObject(TypedDict):
    type: Literal["json_object"]


@with_config(_WIRE)
class ChatJsonSchema(TypedDict, total=False):
    name: Required[Annotated[str, StringConstraints(min_length=1, max_length=64)]]
    description: str | None
    schema: dict[str, Any] | None
    strict: bool | None


@with_config(_WIRE)
class ChatFormatJsonSchema(TypedDict):
    type: Literal["json_schema"]
    json_schema: ChatJsonSchema


ChatResponseFormat = Annotated[
    ChatFormatText | ChatFormatJsonObject | ChatFormatJsonSchema, Field(discriminator="type")
]


@with_config(_WIRE)
class ChatStreamOptions(TypedDict, total=False):
    include_usage: bool | None
    include_obfuscation: bool | None


@with_config(_WIRE)
class ChatCompletionBody(TypedDict, total=False):
    model: str | None
    messages: Required[Annotated[list[ChatMessage], Field(min_length=1)]]
    tools: list[ChatFunctionTool] | None
    tool_choice: ChatToolChoice | None
    parallel_tool_calls: bool | None
    response_format: ChatResponseFormat | None
    max_tokens: Annotated[int, Field(ge=1)] | None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None
    temperature: Annotated[float, Field(ge=0, le=2)] | None
    top_p: Annotated[float, Field(ge=0, le=1)] | None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None
    stop: str | Annotated[list[str], Field(max_length=4)] | None
    seed: int | None
    logprobs: bool | None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None
    logit_bias: dict[str, float] | None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None
    verbosity: Literal["low", "medium", "high"] | None
    user: str | None
    safety_identifier: ShortStr | None
    prompt_cache_key: ShortStr | None
    metadata: Metadata | None
    service_tier: Literal["auto", "default", "flex", "priority", "scale"] | None
    store: bool | None
    n: Annotated[int, Field(ge=1, le=128)] | None
    stream: bool | None
    stream_options: ChatStreamOptions | None


CHAT_BODY: TypeAdapter[ChatCompletionBody] = TypeAdapter(ChatCompletionBody)
