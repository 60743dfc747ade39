"""Steering input: what a ``response.steer`` may carry (user messages only, as the openai SDK
documents: ``type`` "message" (optional), ``role`` "user", ``content`` a string or ``input_text`` /
``input_image`` / ``input_file`` parts) and where queued steering goes in the input of the
response that commits it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from gateway.kernel.errors import InvalidRequest
from gateway.kernel.spec.request import MAX_TEXT, InputFile, InputImage, InputText

Item = dict[str, Any]
# A client's tool results answer the parent's calls, so they stay right after those calls (chat and
# Anthropic upstreams refuse anything between a call and its result); queued steering follows them.
_RESULTS = frozenset({"function_call_output", "mcp_approval_response"})

SteerPart = Annotated[InputText | InputImage | InputFile, Field(discriminator="type")]


class _SteerMessage(BaseModel):
    """A steering message: exactly these fields (the SDK: "may contain only type, role, content")."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["message"] | None = None
    role: Literal["user"]
    content: Annotated[str, StringConstraints(max_length=MAX_TEXT)] | list[SteerPart]


def steer_items(value: Any, max_items: int) -> list[Item]:
    """A ``response.steer``'s ``input`` → input items (user messages), or ``InvalidRequest``."""
    if isinstance(value, str):
        if not value:
            raise InvalidRequest("Steering input must not be empty.", param="input")
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            "Steering input must be a string or a non-empty array of user messages.", param="input"
        )
    if len(value) > max_items:
        raise InvalidRequest(f"Steering input has more than {max_items} messages.", param="input")
    items: list[Item] = []
    for n, raw in enumerate(value):
        if not isinstance(raw, dict):
            raise InvalidRequest("Each steering input item must be a message object.", param=f"input[{n}]")
        kind = raw.get("type", "message")
        if kind != "message":
            raise InvalidRequest(
                f"Steering accepts only user messages, not '{str(kind)[:64]}' items.",
                param=f"input[{n}].type",
            )
        if raw.get("role") != "user":
            raise InvalidRequest(
                "Steering accepts only messages with the 'user' role.", param=f"input[{n}].role"
            )
        try:
            _SteerMessage.model_validate(raw, strict=True)
        except ValidationError as exc:
            err = exc.errors(include_url=False, include_context=False)[0]
            where = ".".join(str(p) for p in err["loc"] if not str(p)[:1].isupper() and "[" not in str(p))
            raise InvalidRequest(
                f"Invalid steering message input[{n}] ({where or 'message'}): {err['msg']}.",
                param=f"input[{n}]",
            ) from None
        items.append({"type": "message", "role": "user", "content": raw["content"]})
    return items


def with_steering(input_: str | list[Any] | None, steering: list[Item]) -> list[Any]:
    """A continuation's input with the queued ``steering`` put before its own (in submission order),
    after the tool results that open it."""
    own: list[Any]
    if input_ is None:
        own = []
    elif isinstance(input_, str):
        own = [{"type": "message", "role": "user", "content": input_}]
    else:
        own = list(input_)
    at = 0
    while at < len(own) and isinstance(own[at], dict) and own[at].get("type") in _RESULTS:
        at += 1
    return [*own[:at], *steering, *own[at:]]


def required_input(output: list[Item]) -> list[Item]:
    """The stubs of the client-owned results ``output`` waits for: its function calls' outputs,
    and the approvals of its hosted tools' calls (``mcp_approval_request``)."""
    stubs: list[Item] = []
    for o in output:
        kind = o.get("type")
        if kind == "function_call":
            stubs.append({"type": "function_call_output", "call_id": o["call_id"], "name": o["name"]})
        elif kind == "mcp_approval_request":
            stubs.append({"type": "mcp_approval_response", "approval_request_id": o["id"]})
    return stubs
