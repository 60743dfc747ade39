"""The one validation entry for requests: JSON bytes or a decoded frame → a wire model, every failure
one 400 with a ``param`` path. HTTP and the WebSocket both call ``create_request``; compaction calls
``compact_request``; context assembly calls ``check_call_ids`` once the history is known."""

from __future__ import annotations

import re
from typing import Any, TypeVar, overload

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from gateway.kernel.errors import ErrorCode, InvalidRequest
from gateway.kernel.items import call_ids
from gateway.kernel.settings import Limits
from gateway.kernel.spec.chat import CHAT_BODY, ChatCompletionBody
from gateway.kernel.spec.request import (
    ITEM_TAGS,
    PART_TAGS,
    TOOL_TAGS,
    CompactRequestBody,
    CreateResponseBody,
)

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
MAX_MODEL_CHARS = 256
_MODEL_NAME = re.compile(r"[\x21-\x7e]+")
_TYPE_WORDS = frozenset({"str", "int", "float", "bool", "none", "dict", "list", "is-instance"})


def _param(loc: tuple[Any, ...], tags: frozenset[str] = ITEM_TAGS | PART_TAGS | TOOL_TAGS) -> str:
    """``('input', 'list[...]', 0, 'message', 'content')`` → ``input[0].content``. A union
    member's tag followed by the field of the same name (Chat Completions'
    ``('response_format', 'json_schema', 'json_schema', 'name')``) is that field once."""
    out: list[str] = []
    prev_int = False
    for n, part in enumerate(loc):
        if n + 1 < len(loc) and isinstance(part, str) and loc[n + 1] == part:
            prev_int = False  # the field that follows is the tag's own, not a list element's tag
            continue
        if isinstance(part, int):
            out.append(f"[{part}]")
            prev_int = True
            continue
        name = str(part)
        if "[" in name or "-" in name or name in _TYPE_WORDS or name[:1].isupper():
            continue  # a union member's description, not a field
        if prev_int and name in tags:
            prev_int = False  # the discriminator tag of a list element
            continue
        out.append(("." if out else "") + name)
        prev_int = False
    return "".join(out)


def _best_error(
    exc: ValidationError, tags: frozenset[str] = ITEM_TAGS | PART_TAGS | TOOL_TAGS
) -> tuple[str, str]:
    errors = exc.errors(include_url=False, include_context=False)
    best = max(errors, key=lambda e: len(e["loc"]))
    param = _param(tuple(best["loc"]), tags)
    msg = best["msg"]
    if best["type"] == "missing":
        msg = f"Missing required parameter: '{param}'."
    else:
        msg = f"Invalid value for '{param}': {msg}." if param else f"Invalid request: {msg}."
    return param, msg


def parse_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest("The request body is not valid JSON.", code=ErrorCode.INVALID_JSON) from None


def _elements(data: dict[str, Any], items_key: str = "input") -> int:
    items = data.get(items_key)
    tools = data.get("tools")
    count = len(tools) if isinstance(tools, list) else 0
    if isinstance(items, list):
        count += len(items)
        for item in items:
            content = item.get("content") if isinstance(item, dict) else None
            if isinstance(content, list):
                count += len(content)
    return count


@overload
def parse_model(
    model: type[M],
    data: Any,
    *,
    max_elements: int | None = ...,
    items_key: str = ...,
    tags: frozenset[str] = ...,
) -> M: ...


@overload
def parse_model(
    model: TypeAdapter[T],
    data: Any,
    *,
    max_elements: int | None = ...,
    items_key: str = ...,
    tags: frozenset[str] = ...,
) -> T: ...


def parse_model(
    model: type[BaseModel] | TypeAdapter[Any],
    data: Any,
    *,
    max_elements: int | None = None,
    items_key: str = "input",
    tags: frozenset[str] = ITEM_TAGS | PART_TAGS | TOOL_TAGS,
) -> Any:
    """``data`` validated strictly as ``model``, a model or a ``TypeAdapter`` (no coercion:
    ``"stream": "yes"`` is an error, as on OpenAI's API). ``max_elements`` bounds input items +
    content parts + tools, counted before validation: validating holds the event loop (a few µs an
    element), so one request of 250,000 tiny items would otherwise stall every other request for
    about a second.
    ``items_key``: the field of the items (Chat Completions' ``messages``); ``tags``: the union
    members' tags a ``param`` path leaves out."""
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.", code=ErrorCode.INVALID_JSON)
    if max_elements is not None and (n := _elements(data, items_key)) > max_elements:
        raise InvalidRequest(
            f"The request has {n} input items, content parts and tools; this gateway accepts at most "
            f"{max_elements}."
            + (
                " Compact the conversation (POST /v1/responses/compact) or continue it "
                "with previous_response_id."
                if items_key == "input"
                else ""
            ),
            param=items_key,
            code=ErrorCode.TOO_MANY_INPUT_ITEMS,
        )
    try:
        if isinstance(model, TypeAdapter):  # its validator called straight: no wrapper's keywords
            return model.validator.validate_python(data, strict=True)
        return model.model_validate(data, strict=True)
    except ValidationError as exc:
        param, msg = _best_error(exc, tags)
        code = ErrorCode.MISSING_REQUIRED_PARAMETER if "Missing required" in msg else ErrorCode.INVALID_VALUE
        raise InvalidRequest(msg, param=param or None, code=code) from None


def _check_model(model: str | None) -> None:
    """A model is named, and its name can be one: 1 to ``MAX_MODEL_CHARS`` printable ASCII characters
    without spaces (``provider/model``, ``:``, ``.``, ``@``, ``-``, ``_`` and the like are fine). The
    name is not repeated in the message: it may hold anything."""
    if not model:
        raise InvalidRequest(
            "Missing required parameter: 'model'.", param="model", code=ErrorCode.MISSING_REQUIRED_PARAMETER
        )
    if len(model) > MAX_MODEL_CHARS or not _MODEL_NAME.fullmatch(model):
        raise InvalidRequest(
            f"Invalid value for 'model': a model name is 1 to {MAX_MODEL_CHARS} printable ASCII "
            "characters, without spaces or control characters.",
            param="model",
            code=ErrorCode.INVALID_VALUE,
        )


def create_request(data: Any, limits: Limits) -> CreateResponseBody:
    """A ``POST /v1/responses`` body or a WebSocket ``response.create`` (its envelope keys already
    removed) validated: the input-element limit, the wire model, the nesting of its free-form
    JSON, a model named, and a background response stored (``no_background``: the WebSocket's
    refusal of ``background``)."""
    body = parse_model(CreateResponseBody, data, max_elements=limits.max_input_elements)
    _check_depth(body, limits.max_json_depth)
    if body.background and body.store is False:
        raise InvalidRequest(
            "A background response must be stored: send store: true (or omit it) with background: true.",
            param="background",
            code=ErrorCode.INVALID_VALUE,
        )
    _check_model(body.model)
    _check_context_management(body)
    return body


def no_background(body: CreateResponseBody) -> None:
    """The WebSocket's rule: a turn there is never ``background`` (the spec forbids it)."""
    if body.background:
        raise InvalidRequest(
            "Background responses are not supported on the WebSocket: use POST /v1/responses.",
            param="background",
            code=ErrorCode.UNSUPPORTED_PARAMETER,
        )


def _check_context_management(body: CreateResponseBody) -> None:
    """One ``compaction`` entry at most (the wire model checks each entry's shape)."""
    entries = body.context_management
    if entries and len(entries) > 1:
        raise InvalidRequest(
            "Invalid value for 'context_management[1]': at most one 'compaction' entry is allowed.",
            param="context_management[1]",
            code=ErrorCode.INVALID_VALUE,
        )


def compact_request(data: Any, limits: Limits) -> CompactRequestBody:
    """A ``POST /v1/responses/compact`` body validated."""
    body = parse_model(CompactRequestBody, data, max_elements=limits.max_input_elements)
    _check_parts_depth(body.input, limits.max_json_depth)
    _check_model(body.model)
    return body


def _depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests dicts and lists more than ``limit`` deep (iterative: no recursion
    limit to hit on the way)."""
    if not isinstance(value, dict | list):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]  # containers only
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                push((child, depth + 1))
    return False


def may_nest_over(sent: bytes | None, limit: int) -> bool:
    """Whether the JSON document ``sent`` may nest more than ``limit`` levels deep, by an upper
    bound: its opening brackets, counted in C (one inside a string only raises the bound), as each
    level opens with one of its own. ``None``: the document is not at hand, so it may."""
    return sent is None or sent.count(b"{") + sent.count(b"[") > limit


def may_count_over(sent: bytes | None, limit: int) -> bool:
    """Whether the JSON document ``sent`` may hold more than ``limit`` elements (items, content
    parts, tools): each starts at a byte of its own, so not if it is no longer than ``limit``."""
    return sent is None or len(sent) > limit


def deep_key(data: dict[str, Any], limit: int) -> str | None:
    """The first key of ``data`` whose value nests more than ``limit`` levels deep, if any: for a
    body whose fields an adapter sends upstream as they came, known or not."""
    for key, value in data.items():
        if isinstance(value, dict | list) and _depth_over(value, limit):
            return key
    return None


def _too_deep(param: str, limit: int) -> InvalidRequest:
    return InvalidRequest(
        f"Invalid value for '{param}': nested more than {limit} levels deep.",
        param=param,
        code=ErrorCode.NESTING_TOO_DEEP,
    )


def _check_depth(body: CreateResponseBody, limit: int) -> None:
    """The free-form JSON a request may carry (everything else has a fixed shape)."""
    if not body.tools and body.text is None and not isinstance(body.input, list):
        return  # nothing free-form to walk: the common plain request
    for n, tool in enumerate(body.tools or ()):
        parameters = getattr(tool, "parameters", None)  # an MCP tool's schemas come from its server
        if parameters is not None and _depth_over(parameters, limit):
            raise _too_deep(f"tools[{n}].parameters", limit)
    fmt = body.text.format if body.text is not None else None
    schema = getattr(fmt, "schema_", None)
    if schema is not None and _depth_over(schema, limit):
        raise _too_deep("text.format.schema", limit)
    _check_parts_depth(body.input, limit)


def _check_parts_depth(input_: Any, limit: int) -> None:
    if not isinstance(input_, list):
        return
    for n, item in enumerate(input_):
        content = getattr(item, "content", None)
        if not content or isinstance(content, str):
            continue  # a plain-text message: nothing free-form (and not a string's characters to walk)
        for k, part in enumerate(content):
            for name in ("annotations", "logprobs"):
                value = getattr(part, name, None)
                if value is not None and _depth_over(value, limit):
                    raise _too_deep(f"input[{n}].content[{k}].{name}", limit)


def check_call_ids(
    history: list[dict[str, Any]],
    new_items: list[dict[str, Any]],
    history_calls: frozenset[str] | None = None,
) -> frozenset[str]:
    """Every function_call_output must answer an earlier function_call; call ids are unique.
    Returns the call ids of history and new items (``history_calls``: the history's, if known)."""
    known = call_ids(history) if history_calls is None else history_calls
    calls: set[str] = set()  # the new items' own

    for index, item in enumerate(new_items):
        kind = item.get("type")
        if kind == "function_call":
            if (item["call_id"] in known or item["call_id"] in calls) and not _same_call(history, item):
                raise InvalidRequest(
                    f"Duplicate function call id '{item['call_id']}'.",
                    param=f"input[{index}].call_id",
                    code=ErrorCode.DUPLICATE_CALL_ID,
                )
            calls.add(item["call_id"])
        elif kind == "function_call_output" and item["call_id"] not in calls and item["call_id"] not in known:
            raise InvalidRequest(
                f"No tool call found for function call output with call_id '{item['call_id']}'.",
                param=f"input[{index}].call_id",
                code=ErrorCode.INVALID_FUNCTION_CALL_OUTPUT,
            )
    return known | calls if calls else known


def _same_call(history: list[dict[str, Any]], item: dict[str, Any]) -> bool:
    # A client replaying history may resend the very call it got back (same item id).
    return any(
        h.get("type") == "function_call"
        and h.get("id") == item.get("id")
        and h.get("call_id") == item["call_id"]
        for h in history
    )


_CHAT_TAGS = frozenset({"text", "image_url", "file", "input_audio", "refusal"})


def chat_request(data: Any, limits: Limits, *, sent: bytes | None = None) -> ChatCompletionBody:
    """A ``POST /v1/chat/completions`` body validated as Open Responses bodies are: the element
    limit (messages + content parts + tools), the wire shapes, the nesting of its free-form JSON
    (tool parameters, the response format's schema, and any field the engine hands on unread), a
    model named, and one choice only (``n`` > 1 is refused: the engine makes one answer a turn).

    ``sent``: the JSON ``data`` was decoded from, if at hand. Its size and its opening brackets
    bound what the counts could find (every element and every level of nesting takes a byte of its
    own), so a body too small to be over a limit is not counted or walked."""
    limit = limits.max_json_depth
    body = parse_model(
        CHAT_BODY,
        data,
        max_elements=limits.max_input_elements if may_count_over(sent, limits.max_input_elements) else None,
        items_key="messages",
        tags=_CHAT_TAGS,
    )
    n = body.get("n")
    if n is not None and n > 1:
        raise InvalidRequest(
            "Invalid value for 'n': this gateway generates one choice per request; send n: 1 or omit it.",
            param="n",
            code=ErrorCode.UNSUPPORTED_PARAMETER,
        )
    if may_nest_over(sent, limit) and (key := deep_key(data, limit)) is not None:
        raise _too_deep(key, limit)
    _check_model(body.get("model"))
    return body
