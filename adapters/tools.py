"""The offered tools as request builders send them (``tool_choice`` itself is read by
``gateway.kernel.tool_choice``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["function_tools"]


def function_tools(tools: list[dict[str, Any]], allowed: frozenset[str] | None) -> Iterator[dict[str, Any]]:
    """The function tools to send: only the ``allowed`` ones when an allowed_tools choice names them."""
    for tool in tools:
        if tool.get("type", "function") != "function":
            continue
        if allowed is not None and tool.get("name") not in allowed:
            continue
        yield tool
