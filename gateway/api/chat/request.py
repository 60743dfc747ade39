"""A validated Chat Completions request → the engine's own request (``CreateResponseBody``, built
in Python, stateless) and the native fields an openai-chat upstream gets as the client sent them.

Messages become input items (system, developer, user with text, image and file parts, assistant
with text, refusal and ``tool_calls``, tool results); the controls map onto the engine's fields.
Everything else the client sent (``seed``, ``stop``, ``logit_bias``, vendor extensions) travels in
``NativeFields`` only: an openai-chat adapter sends the client's body on, the others map what they
can (adapters/*/request.py).
"""

from __future__ import annotations

from typing import Any

from adapters.base import NativeFields
from gateway.kernel.client_api import ClientApi
from gateway.kernel.errors import ErrorCode, InvalidRequest
from gateway.kernel.ids import new_id
from gateway.kernel.items import Item, message
from gateway.kernel.spec.chat import (
    ChatCompletionBody,
    ChatFile,
    ChatFormatJsonObject,
    ChatFormatJsonSchema,
    ChatImage,
    ChatMessage,
    ChatRefusal,
    ChatText,
    ChatToolChoiceAllowed,
    ChatToolChoiceFunction,
)
from gateway.kernel.spec.request import (
    AllowedToolRef,
    CreateResponseBody,
    FunctionTool,
    ReasoningParam,
    TextFormatJsonObject,
    TextFormatJsonSchema,
    TextParam,
    ToolChoiceAllowed,
    ToolChoiceFunction,
)
from gateway.kernel.spec.trusted import Trusted

__all__ = ["LOGPROBS", "engine_request", "native_fields"]

LOGPROBS = "message.output_text.logprobs"
# what the gateway itself decides on its way upstream: the route's model, and streaming
_NOT_NATIVE = frozenset({"model", "stream", "stream_options"})
_MAX_USER = 64  # the engine's safety_identifier


# The engine's request, built from the validated wire model's values without validating them again
# (gateway/kernel/spec/trusted.py): every value is within the engine model's own bounds.
_BODY = Trusted(CreateResponseBody, model="m", input="hi", store=False)
_TOOL = Trusted(FunctionTool, type="function", name="f", parameters={"type": "object"})
MAKERS = (_BODY, _TOOL)


def native_fields(raw: dict[str, Any]) -> NativeFields:
    """The client's body as it came, but for what the gateway decides (model, streaming)."""
    return NativeFields(ClientApi.CHAT, {k: v for k, v in raw.items() if k not in _NOT_NATIVE})


def engine_request(body: ChatCompletionBody) -> CreateResponseBody:
    """The engine's request of ``body``: never stored, no chain, no background."""
    text: TextParam | None = None
    fmt = body.response_format
    if isinstance(fmt, ChatFormatJsonSchema):
        schema = fmt.json_schema
        text = TextParam(
            format=TextFormatJsonSchema(
                type="json_schema",
                name=schema.name,
                description=schema.description,
                schema_=schema.schema_ or {},
                strict=schema.strict,
            ),
            verbosity=body.verbosity,
        )
    elif isinstance(fmt, ChatFormatJsonObject):
        text = TextParam(format=TextFormatJsonObject(type="json_object"), verbosity=body.verbosity)
    elif body.verbosity is not None:
        text = TextParam(verbosity=body.verbosity)
    values: dict[str, Any] = {
        "model": body.model,
        "input": _input(body.messages),
        "stream": bool(body.stream),
        "store": False,
    }
    # The engine's bounds are Chat Completions' but for max_output_tokens, whose floor of 16 is not
    # this client's error.
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is not None:
        values["max_output_tokens"] = max_tokens
    if text is not None:
        values["text"] = text
    if body.tools:
        values["tools"] = [
            _TOOL.build(
                type="function",
                name=t.function.name,
                description=t.function.description,
                parameters=t.function.parameters,
                strict=t.function.strict,
            )
            for t in body.tools
        ]
    if body.tool_choice is not None:
        values["tool_choice"] = _tool_choice(body)
    if body.logprobs:
        values["include"] = [LOGPROBS]
        if body.top_logprobs is not None:
            values["top_logprobs"] = body.top_logprobs
    if body.reasoning_effort:
        values["reasoning"] = ReasoningParam(effort=body.reasoning_effort)
    if body.parallel_tool_calls is not None:
        values["parallel_tool_calls"] = body.parallel_tool_calls
    if body.temperature is not None:
        values["temperature"] = body.temperature
    if body.top_p is not None:
        values["top_p"] = body.top_p
    if body.presence_penalty is not None:
        values["presence_penalty"] = body.presence_penalty
    if body.frequency_penalty is not None:
        values["frequency_penalty"] = body.frequency_penalty
    user = body.safety_identifier or (body.user if body.user and len(body.user) <= _MAX_USER else None)
    if user:
        values["safety_identifier"] = user
    if body.prompt_cache_key is not None:
        values["prompt_cache_key"] = body.prompt_cache_key
    if body.metadata is not None:
        values["metadata"] = body.metadata
    if body.service_tier is not None and body.service_tier != "scale":
        values["service_tier"] = body.service_tier
    return _BODY.build(**values)


def _tool_choice(body: ChatCompletionBody) -> Any:
    tc = body.tool_choice
    if tc is None or isinstance(tc, str):
        return tc
    if isinstance(tc, ChatToolChoiceFunction):
        return ToolChoiceFunction(type="function", name=tc.function.name)
    if isinstance(tc, ChatToolChoiceAllowed):
        allowed = tc.allowed_tools
        return ToolChoiceAllowed(
            type="allowed_tools",
            tools=[AllowedToolRef(name=t.function.name) for t in allowed.tools],
            mode=allowed.mode,
        )
    return None


# -- messages -------------------------------------------------------------------------------------
def _input(messages: list[ChatMessage]) -> str | list[Any]:
    """The input items; one plain user message is its text alone, as a Responses client sends it."""
    if len(messages) == 1:
        only = messages[0]
        if only.role == "user" and isinstance(only.content, str):
            return only.content
    return _items(messages)


def _items(messages: list[ChatMessage]) -> list[Item]:
    """The input items of ``messages``, in the engine's normalized form (gateway/kernel/items.py), as
    ``normalize`` would make them of the corresponding wire items."""
    items: list[Item] = []
    for n, msg in enumerate(messages):
        at = f"messages[{n}]"
        role = msg.role
        if role == "function":
            raise InvalidRequest(
                f"Invalid value for '{at}.role': the deprecated 'function' role is not supported; "
                "send a 'tool' message with tool_call_id.",
                param=f"{at}.role",
                code=ErrorCode.UNSUPPORTED_PARAMETER,
            )
        if role == "tool":
            if not msg.tool_call_id:
                raise InvalidRequest(
                    f"Missing required parameter: '{at}.tool_call_id'.",
                    param=f"{at}.tool_call_id",
                    code=ErrorCode.MISSING_REQUIRED_PARAMETER,
                )
            output = _text_of(msg, at)
            items.append(
                {
                    "type": "function_call_output",
                    "id": new_id("fco"),
                    "call_id": msg.tool_call_id,
                    "output": output,
                }
            )
        elif role == "assistant":
            items += _assistant(msg, at)
        elif role in ("system", "developer"):
            items.append(message(role, _text_of(msg, at)))
        else:
            content = _user_content(msg, at)
            if isinstance(content, str):
                items.append(message("user", content))
            else:
                items.append({"type": "message", "id": new_id("msg"), "role": "user", "content": content})
    return items


def _content(msg: ChatMessage, at: str) -> Any:
    """The message's content, which its role requires."""
    if msg.content is None:
        raise InvalidRequest(
            f"Missing required parameter: '{at}.content'.",
            param=f"{at}.content",
            code=ErrorCode.MISSING_REQUIRED_PARAMETER,
        )
    return msg.content


def _text_of(msg: ChatMessage, at: str) -> str:
    """The text of a message whose role takes text only (system, developer, tool)."""
    content = _content(msg, at)
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for k, part in enumerate(content):
        if not isinstance(part, ChatText):
            raise _part_refused(f"{at}.content[{k}]", part.type, msg.role)
        texts.append(part.text)
    return "\n".join(texts)


def _user_content(msg: ChatMessage, at: str) -> str | list[Any]:
    content = _content(msg, at)
    if isinstance(content, str):
        return content
    parts: list[Any] = []
    for k, part in enumerate(content):
        if isinstance(part, ChatText):
            parts.append({"type": "input_text", "text": part.text})
        elif isinstance(part, ChatImage):
            image = part.image_url
            picture: Item = {"type": "input_image", "image_url": image.url}
            if image.detail is not None:
                picture["detail"] = image.detail
            parts.append(picture)
        elif isinstance(part, ChatFile):
            ref = part.file
            if not ref.file_data and not ref.file_id:
                raise InvalidRequest(
                    f"Missing required parameter: '{at}.content[{k}].file.file_data'.",
                    param=f"{at}.content[{k}].file.file_data",
                    code=ErrorCode.MISSING_REQUIRED_PARAMETER,
                )
            given = (("filename", ref.filename), ("file_data", ref.file_data), ("file_id", ref.file_id))
            parts.append({"type": "input_file", **{k: v for k, v in given if v is not None}})
        else:
            raise _part_refused(f"{at}.content[{k}]", part.type, "user")
    return parts


def _assistant(msg: ChatMessage, at: str) -> list[Any]:
    out: list[Any] = []
    parts: list[Any] = []
    content = msg.content
    if isinstance(content, str):
        if content:
            parts.append({"type": "output_text", "text": content})
    elif content is not None:
        for k, part in enumerate(content):
            if isinstance(part, ChatText):
                parts.append({"type": "output_text", "text": part.text})
            elif isinstance(part, ChatRefusal):
                parts.append({"type": "refusal", "refusal": part.refusal})
            else:
                raise _part_refused(f"{at}.content[{k}]", part.type, "assistant")
    if msg.refusal:
        parts.append({"type": "refusal", "refusal": msg.refusal})
    if parts:
        out.append({"type": "message", "id": new_id("msg"), "role": "assistant", "content": parts})
    for call in msg.tool_calls or ():
        fn = call.function
        out.append(
            {
                "type": "function_call",
                "id": new_id("fc"),
                "call_id": call.id,
                "name": fn.name,
                "arguments": fn.arguments,
            }
        )
    if not out:  # an empty turn, as clients replay one: kept, so the roles still alternate
        out.append(message("assistant", ""))
    return out


def _part_refused(param: str, kind: str, role: str) -> InvalidRequest:
    return InvalidRequest(
        f"Invalid value for '{param}.type': a {role} message cannot carry '{kind}' content here.",
        param=f"{param}.type",
        code=ErrorCode.INVALID_VALUE,
    )
