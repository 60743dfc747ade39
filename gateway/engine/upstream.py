"""The provider-neutral UpstreamRequest of a turn, derived from the request's echoes and its
assembled context (never from the raw body twice)."""

from __future__ import annotations

from typing import Any

from adapters.base import UpstreamRequest
from gateway.engine.context import Context
from gateway.engine.hosted import upstream_items
from gateway.engine.resource import Echoes
from gateway.kernel.spec.request import CreateResponseBody


def upstream_request(
    body: CreateResponseBody,
    echoes: Echoes,
    model: str,
    ctx: Context,
    *,
    stream: bool = True,
    request_id: str | None = None,
) -> UpstreamRequest:
    fmt: dict[str, Any] | None = echoes.text["format"]
    if fmt is not None and fmt.get("type") == "text":
        fmt = None
    tools = echoes.tools
    if any(t["type"] != "function" for t in tools):  # hosted tools go as functions (Turn.use_hosted)
        tools = [t for t in tools if t["type"] == "function"]
    return UpstreamRequest(
        model=model,
        items=upstream_items(ctx.transcript),
        instructions=body.instructions,
        tools=tools,
        tool_choice=echoes.tool_choice,
        max_output_tokens=body.max_output_tokens,
        temperature=echoes.temperature,
        top_p=echoes.top_p,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        parallel_tool_calls=body.parallel_tool_calls,
        text_format=fmt,
        verbosity=echoes.text.get("verbosity"),
        reasoning=body.reasoning.model_dump(exclude_none=True) if body.reasoning else None,
        max_tool_calls=body.max_tool_calls,
        top_logprobs=body.top_logprobs,
        service_tier=body.service_tier,
        safety_identifier=body.safety_identifier,
        prompt_cache_key=body.prompt_cache_key,
        metadata=body.metadata,
        include=list(body.include or ()),
        stream=stream,
        request_id=request_id,
    )
