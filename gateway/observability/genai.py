"""The GenAI attributes of the spans (OpenTelemetry's ``gen_ai.*`` conventions, beside the
gateway's own ``gateway.*``): an upstream attempt's span and a finished turn's. Ids, names,
counts, codes and timings only: never message content.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.engine.telemetry import Attr

if TYPE_CHECKING:
    from gateway.engine.routing import Deployment, Route
    from gateway.engine.turn import TurnResult


def provider_system(kind: str) -> str:
    """``gen_ai.provider.name`` (OpenTelemetry's well-known values) of an adapter kind."""
    return _SYSTEMS.get(kind, kind)


_SYSTEMS = {
    "openai_chat": "openai",
    "openai_responses": "openai",
    "openai-chat": "openai",
    "openai-responses": "openai",
    "anthropic": "anthropic",
    "gemini": "gcp.gemini",
}


def route_system(target: Deployment | Route) -> str:
    """``gen_ai.provider.name`` of a deployment's (or a route's first deployment's) adapter: its
    provider's kind."""
    settings = getattr(target.adapter, "settings", None)
    return provider_system(str(getattr(settings, "kind", target.provider)))


def call_span(
    route: Route, deployment: Deployment, number: int, *, fallback: bool
) -> tuple[str, dict[str, Attr | None]]:
    """The name and attributes of an upstream call's span (``number``: 0 for the first try on
    ``route``; ``fallback``: ``route`` is a fallback's); its ``gateway.attempt`` counts from 1."""
    return f"chat {deployment.upstream_model}", {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": route_system(deployment),
        "gen_ai.request.model": deployment.upstream_model,
        "gateway.model": route.model,
        "gateway.provider": deployment.provider,
        "gateway.deployment": deployment.name,
        "gateway.attempt": number + 1,
        "gateway.fallback": fallback,
    }


def turn_attributes(result: TurnResult) -> dict[str, Attr | None]:
    """The GenAI attributes of a finished turn (only computed for a recording span)."""
    resource = result.resource
    attrs: dict[str, Attr | None] = {
        "gen_ai.response.id": resource.get("id"),
        "gen_ai.response.model": resource.get("model"),
        "gateway.provider": result.provider,
        "gen_ai.provider.name": _system_of(result),
        "gateway.response.status": result.status,
    }
    usage: Mapping[str, Any] | None = result.usage
    if usage:
        attrs["gen_ai.usage.input_tokens"] = usage.get("input_tokens")
        attrs["gen_ai.usage.output_tokens"] = usage.get("output_tokens")
    reasons = _finish_reasons(resource, result.status)
    if reasons:
        attrs["gen_ai.response.finish_reasons"] = reasons
    if result.error is not None:
        attrs["error.type"] = result.error.code or type(result.error).__name__
    return attrs


def _system_of(result: TurnResult) -> str | None:
    """The answering provider's ``gen_ai.provider.name``: the primary route's or a fallback's."""
    primary = result.route
    for route in (primary, *primary.fallbacks):
        for target in route.deployments:
            if target.name == result.deployment:
                return route_system(target)
    return None


def _finish_reasons(resource: Mapping[str, Any], status: str) -> list[str]:
    if status == "incomplete":
        details = resource.get("incomplete_details") or {}
        return [str(details.get("reason") or "incomplete")]
    if status == "completed":
        calls = any(i.get("type") == "function_call" for i in resource.get("output", ()))
        return ["tool_calls" if calls else "stop"]
    return [status] if status in ("failed", "cancelled") else []
