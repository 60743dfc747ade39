"""A Messages request → the engine's own request (``CreateResponseBody``, built in Python, stateless)
plus the fields the engine has no place for (``NativeFields``), which the anthropic adapter sends on
unchanged and the other adapters map where they can (``stop_sequences``, ``top_k``).

Blocks map to the engine's items: text → ``input_text`` / ``output_text``, image → ``input_image``
(a data URL or the URL), document → ``input_file``, ``tool_use`` → ``function_call``,
``tool_result`` → ``function_call_output``, ``thinking`` → a reasoning item whose summary is the
thinking text and whose ``encrypted_content`` is the signature (``redacted_thinking``: its data,
prefixed as the anthropic adapter reads it back), so an anthropic upstream gets them byte-exact.
"""

from __future__ import annotations

import base64
from typing import Any, TypeVar

import orjson
from pydantic import TypeAdapter, ValidationError

from adapters.anthropic.request import REDACTED_PREFIX
from adapters.base import NativeFields
from gateway.api.messages.wire import (
    BLOCK_TAGS,
    COUNT_BODY,
    MESSAGES_BODY,
    CountTokensBody,
    DocumentBlock,
    ImageBlock,
    Message,
    MessagesBody,
    TextBlock,
    Thinking,
    Tool,
    ToolChoice,
    ToolResultBlock,
)
from gateway.engine.validate import MAX_MODEL_CHARS, _depth_over, deep_key, may_count_over, may_nest_over
from gateway.kernel.client_api import ClientApi
from gateway.kernel.errors import ErrorCode, InvalidRequest
from gateway.kernel.ids import new_id
from gateway.kernel.items import Item, message
from gateway.kernel.settings import Limits
from gateway.kernel.spec.request import (
    CreateResponseBody,
    FunctionTool,
    ReasoningParam,
    ToolChoiceFunction,
)
from gateway.kernel.spec.trusted import Trusted

T = TypeVar("T")

_TYPE_WORDS = frozenset({"str", "int", "float", "bool", "none", "dict", "list", "is-instance"})
# the keys every request has, read before the others (a body of just these maps nothing more)
_READ_FIRST = ("model", "messages", "max_tokens")
_USER_PARTS = frozenset({"text", "image", "document"})
# budget_tokens → the smallest reasoning effort whose budget covers it (adapters/anthropic/request.py)
_EFFORTS = (("minimal", 1024), ("low", 2048), ("medium", 8192), ("high", 24576))


def field_path(loc: tuple[Any, ...]) -> str:
    """``('messages', 0, 'content', 'list[...]', 1, 'image', 'source')`` → ``messages.0.content.1.source``:
    Anthropic's way of naming a field in its error messages."""
    out: list[str] = []
    prev_int = False
    for part in loc:
        if isinstance(part, int):
            out.append(str(part))
            prev_int = True
            continue
        name = str(part)
        if "[" in name or "-" in name or name in _TYPE_WORDS or name[:1].isupper():
            continue
        if prev_int and name in BLOCK_TAGS:
            prev_int = False
            continue
        out.append(name)
        prev_int = False
    return ".".join(out)


def invalid(path: str, message: str, code: ErrorCode = ErrorCode.INVALID_VALUE) -> InvalidRequest:
    return InvalidRequest(f"{path}: {message}" if path else message, param=path or None, code=code)


def _validated(shape: TypeAdapter[T], data: Any) -> T:
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.", code=ErrorCode.INVALID_JSON)
    try:  # the validator called straight: no wrapper's keywords on the hot path
        return shape.validator.validate_python(data, strict=True)  # type: ignore[no-any-return]
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False)
        best = max(errors, key=lambda e: len(e["loc"]))
        path = field_path(tuple(best["loc"]))
        if best["type"] == "missing":
            raise invalid(path, "Field required", ErrorCode.MISSING_REQUIRED_PARAMETER) from None
        raise invalid(path, str(best["msg"])) from None


def _elements(data: dict[str, Any]) -> int:
    messages, tools = data.get("messages"), data.get("tools")
    count = len(tools) if isinstance(tools, list) else 0
    if isinstance(messages, list):
        count += len(messages)
        for msg in messages:
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, list):
                count += len(content)
    return count


def _check_size(data: Any, limits: Limits) -> None:
    if isinstance(data, dict) and (n := _elements(data)) > limits.max_input_elements:
        raise InvalidRequest(
            f"messages: the request has {n} messages, content blocks and tools; this gateway accepts "
            f"at most {limits.max_input_elements}.",
            param="messages",
            code=ErrorCode.TOO_MANY_INPUT_ITEMS,
        )


def _check_tools(tools: list[Tool] | None, limit: int | None, *, client_only: bool) -> None:
    """Each tool's schema nested within ``limit`` (``None``: the body can't be too deep);
    ``client_only``: a client tool (``custom``)."""
    for n, tool in enumerate(tools or ()):
        if client_only and tool.get("type") not in (None, "custom"):
            raise invalid(f"tools.{n}.type", "only client tools (custom) are supported by this gateway")
        if limit is not None and _depth_over(tool["input_schema"], limit):
            raise invalid(
                f"tools.{n}.input_schema", f"nested more than {limit} levels deep", ErrorCode.NESTING_TOO_DEEP
            )


def _check_messages(messages: list[Message], limit: int | None, *, rules: bool) -> None:
    """In one pass: each tool_use's input nested within ``limit`` (``None``: the body can't be too
    deep); ``rules``, Anthropic's own rules the engine relies on: tool_use ids unique, each
    tool_result answering a tool_use of the assistant turn just before it, and no message empty
    but an optional final assistant one."""
    seen: set[str] = set()
    pending: set[str] = set()  # the tool_use ids of the assistant turn just before
    last = len(messages) - 1
    for n, msg in enumerate(messages):
        content = msg["content"]
        assistant = msg["role"] == "assistant"
        if rules and not content and not (n == last and assistant):
            raise invalid(
                f"messages.{n}",
                "all messages must have non-empty content except for the optional final assistant message",
            )
        if isinstance(content, str):
            pending = set()
            continue
        answered, pending = pending, set()
        for k, block in enumerate(content):
            if block["type"] == "tool_use":
                if limit is not None and _depth_over(block["input"], limit):
                    raise invalid(
                        f"messages.{n}.content.{k}.input",
                        f"nested more than {limit} levels deep",
                        ErrorCode.NESTING_TOO_DEEP,
                    )
                if rules and assistant:
                    use_id = block["id"]
                    if use_id in seen:
                        raise invalid(
                            f"messages.{n}.content.{k}.id",
                            f"tool_use ids must be unique ('{use_id}')",
                            ErrorCode.DUPLICATE_CALL_ID,
                        )
                    seen.add(use_id)
                    pending.add(use_id)
            elif rules and not assistant and block["type"] == "tool_result":
                result_id = block["tool_use_id"]
                if result_id not in answered:
                    raise invalid(
                        f"messages.{n}.content.{k}.tool_use_id",
                        f"unexpected `tool_use_id` found in `tool_result` blocks: {result_id}. "
                        "Each `tool_result` block must have a corresponding `tool_use` block in the "
                        "previous message.",
                        ErrorCode.INVALID_FUNCTION_CALL_OUTPUT,
                    )


def _check_model(model: str) -> None:
    if (
        not model
        or len(model) > MAX_MODEL_CHARS
        or not model.isascii()
        or not model.isprintable()
        or " " in model
    ):
        raise invalid(
            "model", f"a model name is 1 to {MAX_MODEL_CHARS} printable ASCII characters, without spaces"
        )


def parse_count(data: Any, limits: Limits) -> CountTokensBody:
    """A ``count_tokens`` body validated."""
    _check_size(data, limits)
    body = _validated(COUNT_BODY, data)
    _check_model(body["model"])
    _check_tools(body.get("tools"), limits.max_json_depth, client_only=False)
    _check_messages(body["messages"], limits.max_json_depth, rules=False)
    return body


def parse_messages(data: Any, limits: Limits, *, sent: bytes | None = None) -> MessagesBody:
    """A ``POST /v1/messages`` body validated: the element limit, the wire model, the nesting of
    its JSON, the model's name, and the rules of Anthropic's own API the engine relies on (tool
    results answer a tool_use of the turn before; thinking's budget below max_tokens).

    Nesting: the free-form fields the engine reads (tool schemas, tool_use inputs) are named in an
    error; then every field, as the anthropic adapter sends a Messages client's body on as it came,
    unknown fields and blocks' unknown keys too. ``sent``: the JSON ``data`` was decoded from, if at
    hand: a body too small to be over a limit is not counted or walked (gateway/engine/validate.py
    ``may_count_over``, ``may_nest_over``)."""
    if may_count_over(sent, limits.max_input_elements):
        _check_size(data, limits)
    body = _validated(MESSAGES_BODY, data)
    limit = limits.max_json_depth if may_nest_over(sent, limits.max_json_depth) else None
    _check_model(body["model"])
    thinking = body.get("thinking")
    if thinking is not None and thinking["type"] == "enabled":
        budget = thinking.get("budget_tokens")
        if budget is None:
            raise invalid(
                "thinking.enabled.budget_tokens", "Field required", ErrorCode.MISSING_REQUIRED_PARAMETER
            )
        if budget >= body["max_tokens"]:
            raise invalid("max_tokens", "must be greater than thinking.budget_tokens")
    tools = body.get("tools")
    if tools:
        _check_tools(tools, limit, client_only=True)
    choice = body.get("tool_choice")
    if choice is not None and choice["type"] == "tool" and not choice.get("name"):
        raise invalid("tool_choice.tool.name", "Field required", ErrorCode.MISSING_REQUIRED_PARAMETER)
    _check_messages(body["messages"], limit, rules=True)
    if limit is not None and (key := deep_key(data, limit)) is not None:
        raise invalid(key, f"nested more than {limit} levels deep", ErrorCode.NESTING_TOO_DEEP)
    return body


# -- mapping --------------------------------------------------------------------------------------
# The engine's request, built from the validated wire model's values without validating them again
# (gateway/kernel/spec/trusted.py): every value below is within the engine model's own bounds. Its
# input items are in the engine's normalized form already (gateway/kernel/items.py), as
# ``normalize`` would make them of the corresponding wire items.
_BODY = Trusted(CreateResponseBody, model="m", input="hi", store=False)
_REASONING_PARAM = Trusted(ReasoningParam, effort="low")
_CHOICE = Trusted(ToolChoiceFunction, type="function", name="f")
_TOOL = Trusted(FunctionTool, type="function", name="f", parameters={"type": "object"})
MAKERS = (_BODY, _REASONING_PARAM, _CHOICE, _TOOL)


def system_text(system: str | list[TextBlock] | None) -> str | None:
    if system is None:
        return None
    text = system if isinstance(system, str) else "\n".join(b["text"] for b in system)
    return text or None


def _data_url(media_type: str, data: str) -> str:
    return f"data:{media_type};base64,{data}"


def _image(block: ImageBlock) -> Item:
    src = block["source"]
    url = src["url"] if src["type"] == "url" else _data_url(src["media_type"], src["data"])
    return {"type": "input_image", "image_url": url}


def _document(block: DocumentBlock) -> Item:
    src = block["source"]
    title = block.get("title")
    out: Item = {"type": "input_file"}
    if src["type"] == "text":
        out["filename"] = title or "document.txt"
        out["file_data"] = _data_url("text/plain", base64.b64encode(src["data"].encode()).decode())
        return out
    if title is not None:
        out["filename"] = title
    if src["type"] == "url":
        out["file_url"] = src["url"]
    else:
        out["file_data"] = _data_url(src["media_type"], src["data"])
    return out


def _user_part(block: Any) -> Item:
    kind = block["type"]
    if kind == "text":
        return {"type": "input_text", "text": block["text"]}
    if kind == "image":
        return _image(block)
    return _document(block)


def _tool_output(block: ToolResultBlock) -> Item:
    content = block.get("content")
    output: str | list[Any]
    if content is None or isinstance(content, str):
        output = content or ""
    else:
        output = [_user_part(b) for b in content]
    return {
        "type": "function_call_output",
        "id": new_id("fco"),
        "call_id": block["tool_use_id"],
        "output": output,
    }


def _user_items(msg: Message) -> list[Item]:
    content = msg["content"]
    if isinstance(content, str):
        return [message("user", content)]
    items: list[Item] = []
    parts: list[Item] = []
    for block in content:
        if block["type"] == "tool_result":
            if parts:
                items.append({"type": "message", "id": new_id("msg"), "role": "user", "content": parts})
                parts = []
            items.append(_tool_output(block))
        elif block["type"] in _USER_PARTS:
            parts.append(_user_part(block))
        else:
            raise invalid("messages.content", f"a user message cannot carry a {block['type']} block")
    if parts:
        items.append({"type": "message", "id": new_id("msg"), "role": "user", "content": parts})
    return items


def _assistant_items(msg: Message) -> list[Item]:
    content = msg["content"]
    if isinstance(content, str):
        return [message("assistant", content)] if content else []
    items: list[Item] = []
    texts: list[Item] = []

    def flush() -> None:
        nonlocal texts
        if texts:
            items.append({"type": "message", "id": new_id("msg"), "role": "assistant", "content": texts})
            texts = []

    for block in content:
        if block["type"] == "text":
            texts.append({"type": "output_text", "text": block["text"]})
            continue
        flush()
        if block["type"] == "tool_use":
            args = orjson.dumps(block["input"]).decode()
            call = {"type": "function_call", "id": new_id("fc"), "call_id": block["id"]}
            items.append({**call, "name": block["name"], "arguments": args})
        elif block["type"] == "thinking":
            thinking = block["thinking"]
            summary = [{"type": "summary_text", "text": thinking}] if thinking else []
            thought: Item = {"type": "reasoning", "id": new_id("rs"), "summary": summary}
            if block["signature"]:
                thought["encrypted_content"] = block["signature"]
            items.append(thought)
        elif block["type"] == "redacted_thinking":
            data = REDACTED_PREFIX + block["data"]
            items.append({"type": "reasoning", "id": new_id("rs"), "summary": [], "encrypted_content": data})
        else:
            raise invalid("messages.content", f"an assistant message cannot carry a {block['type']} block")
    flush()
    return items


def _input(messages: list[Message]) -> str | list[Item]:
    """The engine's input; one plain user message is its text alone, as a Responses client sends it
    (and as the chat ingress maps it)."""
    if len(messages) == 1:
        only = messages[0]
        content = only["content"]
        if only["role"] == "user" and isinstance(content, str):
            return content
    return input_items(messages)


def input_items(messages: list[Message]) -> list[Item]:
    """The engine's input items of ``messages``, normalized."""
    items: list[Item] = []
    for msg in messages:
        items += _user_items(msg) if msg["role"] == "user" else _assistant_items(msg)
    return items


def _effort(thinking: Thinking) -> ReasoningParam:
    """``thinking`` as a reasoning effort (its budget's, adapters/anthropic/request.py's table) with
    a summary unless its display is ``omitted`` (Anthropic returns the summarized thinking)."""
    kind = thinking["type"]
    if kind == "disabled":
        return _REASONING_PARAM.build(effort="none")
    summary = None if thinking.get("display") == "omitted" else "auto"
    budget = thinking.get("budget_tokens")
    if kind == "adaptive" or budget is None:
        return _REASONING_PARAM.build(effort="medium", summary=summary)
    effort = next((name for name, top in _EFFORTS if budget <= top), "xhigh")
    return _REASONING_PARAM.build(effort=effort, summary=summary)


def _tool_choice(choice: ToolChoice) -> Any:
    kind = choice["type"]
    if kind == "tool":
        return _CHOICE.build(type="function", name=choice.get("name"))  # parse_messages checks it
    return {"auto": "auto", "any": "required", "none": "none"}[kind]


def engine_request(
    body: MessagesBody, raw: dict[str, Any], beta: str | None = None
) -> tuple[CreateResponseBody, NativeFields]:
    """The engine's request for ``body`` (stateless: ``store`` false, no chain, no truncation) and
    the client's own fields for the adapters (``raw``: the body as sent; the adapter sets the
    route's model in place of the client's). Only the keys the client sent are read."""
    values: dict[str, Any] = {
        "model": body["model"],
        "input": _input(body["messages"]),
        "stream": body.get("stream") is True,
        "store": False,
        "truncation": "disabled",
        # Messages' max_tokens may be below the 16 Open Responses requires
        "max_output_tokens": body["max_tokens"],
    }
    if len(body) > len(_READ_FIRST):
        _mapped(body, values)
    engine = _BODY.build(**values)
    native = NativeFields(ClientApi.MESSAGES, raw, {"anthropic-beta": beta} if beta else None)
    return engine, native


def _mapped(body: MessagesBody, values: dict[str, Any]) -> None:
    """Into ``values``, the engine's fields of the controls ``body`` sets."""
    system = body.get("system")
    if system is not None and (instructions := system_text(system)):
        values["instructions"] = instructions
    tools = body.get("tools")
    if tools:
        values["tools"] = [
            _TOOL.build(
                type="function",
                name=t["name"],
                description=t.get("description"),
                parameters=t["input_schema"],
            )
            for t in tools
        ]
    choice = body.get("tool_choice")
    if choice is not None:
        values["tool_choice"] = _tool_choice(choice)
        if choice.get("disable_parallel_tool_use"):
            values["parallel_tool_calls"] = False
    temperature, top_p = body.get("temperature"), body.get("top_p")
    if temperature is not None:
        values["temperature"] = temperature
    if top_p is not None:
        values["top_p"] = top_p
    thinking = body.get("thinking")
    if thinking is not None:
        values["reasoning"] = _effort(thinking)
    metadata = body.get("metadata")
    user_id = metadata.get("user_id") if metadata else None
    if user_id and len(user_id) <= 64:
        values["safety_identifier"] = user_id
