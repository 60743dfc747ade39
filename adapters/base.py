"""The adapter seam: one async-generator method from a normalized request to normalized deltas."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from adapters.deltas import Delta
from gateway.kernel.client_api import ClientApi


class NativeFields(NamedTuple):
    """The fields of a request in another client API (``api``: Chat Completions, Messages) that the
    engine's request has no place for (``seed``, ``stop``, ``top_k``, ``logit_bias`` …), as the
    client sent them. An adapter of the same API sends them on unchanged (no lossy round trip);
    another maps those it can express and leaves the rest. A tuple: built once a request, on the
    ingress's hot path (a quarter of a frozen dataclass's cost)."""

    api: ClientApi
    fields: dict[str, Any]
    # the client's headers of that API an adapter of the same API sends on (Messages: anthropic-beta)
    headers: dict[str, str] | None = None


@dataclass(slots=True)
class UpstreamRequest:
    """Everything an adapter needs for one generation, provider-neutral.

    ``items`` is the effective transcript in normalized form (gateway/engine/context.py):
      - ``{"type":"message","role":"user"|"system"|"developer"|"assistant","content":[part...]}``
        (+ ``"phase"`` on assistant messages when the client sent one). Parts are always typed:
        user: ``input_text{text}``, ``input_image{image_url, detail}``,
        ``input_file{filename?, file_data?, file_url?}``; system/developer: ``input_text``;
        assistant: ``output_text{text}``, ``refusal{refusal}``.
      - ``{"type":"function_call","call_id","name","arguments"}``
      - ``{"type":"function_call_output","call_id","output": str | [input_text|input_image|input_file]}``
      - ``{"type":"reasoning","summary":[{"type":"summary_text","text"}],
        "content"?: [{"type":"reasoning_text","text"}], "encrypted_content"?: str}``
    Compaction items arrive already opened into a readable message; item references resolved.

    ``tools`` are ``{"type":"function","name","description","parameters","strict"}``.
    ``tool_choice`` is ``"auto"|"none"|"required"``, ``{"type":"function","name"}`` or
    ``{"type":"allowed_tools","tools":[{"type":"function","name"}],"mode"}``.
    The gateway enforces allowed_tools itself (it drops disallowed calls); adapters should still
    steer the provider toward the allowed subset where the provider can express it.
    """

    model: str
    items: list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    max_output_tokens: int | None = None
    # The sampling the response states (the client's or the spec's 1.0): sent as is, or, where the
    # provider cannot take it, replaced by what the adapter applies (``Applies``).
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    parallel_tool_calls: bool | None = None
    text_format: dict[str, Any] | None = None
    verbosity: str | None = None  # text.verbosity: "low" | "medium" | "high"
    reasoning: dict[str, Any] | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    metadata: dict[str, str] | None = None
    include: list[str] = field(default_factory=list)
    # False: the client waits for the whole answer (non-streaming HTTP, compaction), so an adapter
    # may ask its provider for one unstreamed reply: fewer bytes and events to translate.
    stream: bool = True
    # The request's id (the client's X-Request-Id, else the gateway's): forwarded upstream as
    # X-Request-Id so the provider's logs can be matched with ours.
    request_id: str | None = None
    # The W3C trace context (traceparent, tracestate) of the upstream attempt's span, sent with the
    # call when tracing is on; None otherwise.
    trace_headers: dict[str, str] | None = None
    # When the whole request must be over (time.monotonic()), retries and fallbacks included: an
    # adapter bounds its call by what is left of it as well as by its own total timeout.
    deadline: float | None = None
    # A Chat Completions or Messages ingress's own fields (None for an Open Responses request).
    native: NativeFields | None = None

    def seconds_left(self, cap: float) -> float:
        """``cap``, or less when the request's deadline comes sooner (never below a millisecond)."""
        if self.deadline is None:
            return cap
        return max(0.001, min(cap, self.deadline - time.monotonic()))


class Adapter(Protocol):
    """A provider. ``stream`` is an async generator of deltas; it bounds its network work by
    ``request.seconds_left(...)`` (the turn's deadline, retries included); it raises
    ``gateway.kernel.errors.UpstreamError`` (or a subclass) for provider failures and must stop its
    network work when the generator is closed (client gone, cancellation)."""

    def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]: ...

    async def aclose(self) -> None: ...


class Applies(Protocol):
    """An adapter's ``applied`` method, where its provider does not apply every value the response
    states (its sampling, its ``top_logprobs``): it names the resource fields it applies otherwise,
    with what it applies (the turn corrects the resource before ``response.created``). An adapter
    without one applies the request as stated."""

    def __call__(self, request: UpstreamRequest) -> dict[str, Any]: ...
