"""What the MCP client hands the engine: a resolved server, its tools, and a call's result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.kernel.allow_list import AllowEntry


@dataclass(frozen=True, slots=True)
class McpServer:
    """A request's server, resolved and allowed: ``headers`` hold its secrets (the request's
    ``headers`` and ``authorization``, or an operator's), which no repr shows."""

    label: str
    url: str
    headers: dict[str, str] = field(repr=False)
    description: str | None = None
    sse: bool = False  # the SSE transport (else streamable HTTP)
    # the tenant's allow-list, checked again with the addresses at connect time; None: a server
    # the operator declared (wherever it is)
    allow: tuple[AllowEntry, ...] | None = field(default=(), repr=False)
    param: str = "tools"  # the request's field that named it, for a refusal

    def __repr__(self) -> str:
        return f"McpServer(label={self.label!r})"


@dataclass(frozen=True, slots=True)
class McpTool:
    name: str
    description: str | None
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None  # as the server gave them (readOnlyHint …)


@dataclass(frozen=True, slots=True)
class McpCallResult:
    """A call's result as text, or the reason it failed: exactly one is set."""

    output: str | None
    error: str | None
