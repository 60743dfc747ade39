"""A validated Chat Completions request → the engine's own request (``CreateResponseBody``, built
in Python, stateless) and the native fields an openai-chat upstream gets as the client sent them.

Messages become input items (system, developer, user with text, image and file parts, assistant
with text, refusal and ``tool_calls``, tool results); the controls map onto the engine's fields.
Everything else the client sent (``seed``, ``stop``, ``logit_bias``, vendor extensions) travels in
``NativeFields`` only: an openai-chat adapter sends the client's body on, the others map what they
can (adapters/*/request.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from adapters.base import NativeFields
from gateway.kernel.client_api import ClientApi
from gateway.kernel.errors import ErrorCode, InvalidRequest
from gateway.kernel.ids import new_id
from gateway.kernel.items import Item, message
from gateway.kernel.spec.chat import ChatCompletionBody, ChatFunctionDef, ChatMessage
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
_MAX_USER = 64  # the engine's safety_identifier
# the keys read before the others (model, stream) or not read (handed on in NativeFields only)
_DECIDED = frozenset({"model", "stream", "stream_options", "store", "n", "seed", "stop", "logit_bias"})
# the controls the engine takes as they came, under the same name
_SAME = frozenset(
    {
        "parallel_tool_calls",
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "prompt_cache_key",
        "metadata",
    }
)


# The engine's request, built from the validated wire values without validating them again
# (gateway/kernel/spec/trusted.py): every value is within the engine model's own bounds.
_BODY = Trusted(CreateResponseBody, model="m", input="hi", store=False)
_TOOL = Trusted(FunctionTool, type="function", name="f", parameters={"type": "object"})
MAKERS = (_BODY, _TOOL)


def native_fields(raw: dict[str, Any]) -> NativeFields:
    """The client's body as it came. What the gateway decides (the model, streaming) an adapter
    of the same API sets in place of the client's (adapters/openai_chat/request.py)."""
    return NativeFields(ClientApi.CHAT, raw)


def engine_request(body: ChatCompletionBody) -> CreateResponseBody:
    """The engine's request of ``body``: never stored, no chain, no background. Only the keys the
    client sent are read; the controls the engine takes as they came are copied in the one pass,
    the rest mapped after it (``_mapped``)."""
    values: dict[str, Any] = {
        "model": body.get("model"),
        "stream": body.get("stream") is True,
        "store": False,
    }
    others = False
    sent: Iterable[tuple[str, Any]] = body.items()
    for key, value in sent:
        if key == "messages":
            values["input"] = _input(value)
        elif key in _SAME:
            if value is not None:  # null: as if not sent
                values[key] = value
        elif key not in _DECIDED:
            others = True
    if others:
        _mapped(body, values)
    return _BODY.build(**values)


def _mapped(body: ChatCompletionBody, values: dict[str, Any]) -> None:
    """Into ``values``, the engine's fields of what ``body`` says in other names and shapes."""
    tools = body.get("tools")
    if tools:
        values["tools"] = [_tool(t["function"]) for t in tools]
    tool_choice = body.get("tool_choice")
    if tool_choice is not None:
        values["tool_choice"] = _tool_choice(tool_choice)
    if body.get("logprobs"):
        values["include"] = [LOGPROBS]
        top = body.get("top_logprobs")
        if top is not None:
            values["top_logprobs"] = top
    effort = body.get("reasoning_effort")
    if effort:
        values["reasoning"] = ReasoningParam(effort=effort)
    tier = body.get("service_tier")
    if tier is not None and tier != "scale":
        values["service_tier"] = tier
    # The engine's bounds are Chat Completions' but for max_output_tokens, whose floor of 16 is not
    # this client's error.
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is not None:
        values["max_output_tokens"] = max_tokens
    user = body.get("safety_identifier") or body.get("user")
    if user and len(user) <= _MAX_USER:
        values["safety_identifier"] = user
    text = _text(body)
    if text is not None:
        values["text"] = text


def _tool(fn: ChatFunctionDef) -> FunctionTool:
    return _TOOL.build(
        type="function",
        name=fn["name"],
        description=fn.get("description"),
        parameters=fn.get("parameters"),
        strict=fn.get("strict"),
    )


def _text(body: ChatCompletionBody) -> TextParam | None:
    """The engine's text settings: the response format and the verbosity."""
    fmt, verbosity = body.get("response_format"), body.get("verbosity")
    if fmt and fmt["type"] == "json_schema":
        schema = fmt["json_schema"]
        return TextParam(
            format=TextFormatJsonSchema(
                type="json_schema",
                name=schema["name"],
                description=schema.get("description"),
                schema_=schema.get("schema") or {},
                strict=schema.get("strict"),
            ),
            verbosity=verbosity,
        )
    if fmt and fmt["type"] == "json_object":
        return TextParam(format=TextFormatJsonObject(type="json_object"), verbosity=verbosity)
    if verbosity is not None:
        return TextParam(verbosity=verbosity)
    return None


def _tool_choice(tc: Any) -> Any:
    if isinstance(tc, str):
        return tc
    if tc["type"] == "function":
        return ToolChoiceFunction(type="function", name=tc["function"]["name"])
    allowed = tc["allowed_tools"]
    return ToolChoiceAllowed(
        type="allowed_tools",
        tools=[AllowedToolRef(name=t["function"]["name"]) for t in allowed["tools"]],
        mode=allowed["mode"],
    )


# -- messages -------------------------------------------------------------------------------------
def _input(messages: list[ChatMessage]) -> str | list[Any]:
    """The input items; one plain user message is its text alone, as a Responses client sends it."""
    if len(messages) == 1:
        only = messages[0]
        content = only.get("content")
        if only["role"] == "user" and isinstance(content, str):
            return content
    return _items(messages)


def _items(messages: list[ChatMessage]) -> list[Item]:
    """The input items of ``messages``, in the engine's normalized form (gateway/kernel/items.py), as
    ``normalize`` would make them of the corresponding wire items."""
    items: list[Item] = []
    for n, msg in enumerate(messages):
        at = f"messages[{n}]"
        role = msg["role"]
        if role == "function":
            raise InvalidRequest(
                f"Invalid value for '{at}.role': the deprecated 'function' role is not supported; "
                "send a 'tool' message with tool_call_id.",
                param=f"{at}.role",
                code=ErrorCode.UNSUPPORTED_PARAMETER,
            )
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if not call_id:
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
                    "call_id": call_id,
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
    content = msg.get("content")
    if content is None:
        raise InvalidRequest(
            f"Missing required parameter: '{at}.content'.",
            param=f"{at}.content",
            code=ErrorCode.MISSING_REQUIRED_PARAMETER,
        )
    return content


def _text_of(msg: ChatMessage, at: str) -> str:
    """The text of a message whose role takes text only (system, developer, tool)."""
    content = _content(msg, at)
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for k, part in enumerate(content):
        if part["type"] != "text":
            raise _part_refused(f"{at}.content[{k}]", part["type"], msg["role"])
        texts.append(part["text"])
    return "\n".join(texts)


def _user_content(msg: ChatMessage, at: str) -> str | list[Any]:
    content = _content(msg, at)
    if isinstance(content, str):
        return content
    parts: list[Any] = []
    for k, part in enumerate(content):
        kind = part["type"]
        if kind == "text":
            parts.append({"type": "input_text", "text": part["text"]})
        elif kind == "image_url":
            image = part["image_url"]
            picture: Item = {"type": "input_image", "image_url": image["url"]}
            detail = image.get("detail")
            if detail is not None:
                picture["detail"] = detail
            parts.append(picture)
        elif kind == "file":
            ref = part["file"]
            if not ref.get("file_data") and not ref.get("file_id"):
                raise InvalidRequest(
                    f"Missing required parameter: '{at}.content[{k}].file.file_data'.",
                    param=f"{at}.content[{k}].file.file_data",
                    code=ErrorCode.MISSING_REQUIRED_PARAMETER,
                )
            given = {name: ref.get(name) for name in ("filename", "file_data", "file_id")}
            parts.append({"type": "input_file", **{name: v for name, v in given.items() if v is not None}})
        else:
            raise _part_refused(f"{at}.content[{k}]", kind, "user")
    return parts


def _assistant(msg: ChatMessage, at: str) -> list[Any]:
    out: list[Any] = []
    parts: list[Any] = []
    content = msg.get("content")
    if isinstance(content, str):
        if content:
            parts.append({"type": "output_text", "text": content})
    elif content is not None:
        for k, part in enumerate(content):
            if part["type"] == "text":
                parts.append({"type": "output_text", "text": part["text"]})
            elif part["type"] == "refusal":
                parts.append({"type": "refusal", "refusal": part["refusal"]})
            else:
                raise _part_refused(f"{at}.content[{k}]", part["type"], "assistant")
    refusal = msg.get("refusal")
    if refusal:
        parts.append({"type": "refusal", "refusal": refusal})
    if parts:
        out.append({"type": "message", "id": new_id("msg"), "role": "assistant", "content": parts})
    for call in msg.get("tool_calls") or ():
        fn = call["function"]
        out.append(
            {
                "type": "function_call",
                "id": new_id("fc"),
                "call_id": call["id"],
                "name": fn["name"],
                "arguments": fn["arguments"],
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
