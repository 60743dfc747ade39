"""A create request read once into its echoes (the effective tools, tool_choice and text settings),
and the ResponseResource a turn starts with: every one of the 31 required fields, echoing the
effective values (the spec's defaults where the client sent none). The upstream request is derived
from the same echoes (``gateway/engine/upstream.py``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gateway.kernel.spec.request import (
    CreateResponseBody,
    McpApprovalFilter,
    McpTool,
    McpToolFilter,
    ToolChoiceAllowed,
    ToolChoiceFunction,
)


def tools_echo(body: CreateResponseBody) -> list[dict[str, Any]]:
    """The tools as the resource states them, in the client's order: an MCP tool without its
    secrets (``headers``, ``authorization``)."""
    out: list[dict[str, Any]] = []
    for t in body.tools or ():
        if isinstance(t, McpTool):
            out.append(mcp_echo(t))
        else:
            out.append(
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                    "strict": t.strict,
                }
            )
    return out


def mcp_echo(t: McpTool) -> dict[str, Any]:
    allowed: Any = t.allowed_tools
    if isinstance(allowed, McpToolFilter):
        allowed = allowed.model_dump(exclude_none=True)
    approval: Any = t.require_approval or "always"
    if isinstance(approval, McpApprovalFilter):
        approval = approval.model_dump(exclude_none=True)
    return {
        "type": "mcp",
        "server_label": t.server_label,
        "server_url": t.server_url,
        "server_description": t.server_description,
        "allowed_tools": allowed,
        "require_approval": approval,
    }


def tool_choice_echo(body: CreateResponseBody) -> str | dict[str, Any]:
    tc = body.tool_choice
    if tc is None:
        return "auto"
    if isinstance(tc, str):
        return tc
    if isinstance(tc, ToolChoiceFunction):
        return {"type": "function", "name": tc.name}
    if isinstance(tc, ToolChoiceAllowed):
        return {
            "type": "allowed_tools",
            "tools": [{"type": "function", "name": t.name} for t in tc.tools],
            "mode": tc.mode,
        }
    return "auto"


def text_echo(body: CreateResponseBody) -> dict[str, Any]:
    fmt: dict[str, Any] = {"type": "text"}
    verbosity = None
    if body.text is not None:
        verbosity = body.text.verbosity
        f = body.text.format
        if f is not None:
            if f.type == "json_schema":
                fmt = {
                    "type": "json_schema",
                    "name": f.name,
                    "description": f.description,
                    "schema": f.schema_,
                    "strict": bool(f.strict),
                }
            else:
                fmt = {"type": f.type}
    out: dict[str, Any] = {"format": fmt}
    if verbosity is not None:
        out["verbosity"] = verbosity
    return out


@dataclass(slots=True, frozen=True)
class Echoes:
    """The normalized forms both the resource and the upstream request are made from."""

    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]
    text: dict[str, Any]
    # The sampling the resource states: the client's, else the spec's default (1.0). The upstream
    # request carries the same numbers, and each adapter sends them (or, where its provider cannot
    # take one, says what it applies instead: ``adapters.base.Applies``).
    temperature: float = 1.0
    top_p: float = 1.0

    @classmethod
    def of(cls, body: CreateResponseBody) -> Echoes:
        return cls(
            tools=tools_echo(body),
            tool_choice=tool_choice_echo(body),
            text=text_echo(body),
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
        )


def new_resource(
    body: CreateResponseBody, *, response_id: str, model: str, store: bool, echoes: Echoes | None = None
) -> dict[str, Any]:
    if echoes is None:
        echoes = Echoes.of(body)
    reasoning = body.reasoning
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "completed_at": None,
        "status": "in_progress",
        "incomplete_details": None,
        "model": model,
        "previous_response_id": body.previous_response_id,
        "instructions": body.instructions,
        "output": [],
        "error": None,
        "tools": echoes.tools,
        "tool_choice": echoes.tool_choice,
        "truncation": body.truncation or "disabled",
        "parallel_tool_calls": True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        "text": echoes.text,
        "top_p": echoes.top_p,
        "temperature": echoes.temperature,
        "presence_penalty": 0.0 if body.presence_penalty is None else body.presence_penalty,
        "frequency_penalty": 0.0 if body.frequency_penalty is None else body.frequency_penalty,
        "top_logprobs": body.top_logprobs or 0,
        "reasoning": {
            "effort": reasoning.effort if reasoning else None,
            "summary": reasoning.summary if reasoning else None,
        },
        "usage": None,
        "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": body.max_tool_calls,
        "store": store,
        "background": bool(body.background),
        "service_tier": body.service_tier or "default",
        "metadata": body.metadata or {},
        "safety_identifier": body.safety_identifier,
        "prompt_cache_key": body.prompt_cache_key,
    }
