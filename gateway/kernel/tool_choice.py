"""The one reader of a ``tool_choice``: the engine enforces it, adapters translate it, the mock obeys it.

``tool_choice`` arrives in its echoed (normalized) form: ``"auto" | "none" | "required"``,
``{"type": "function", "name"}`` or ``{"type": "allowed_tools", "tools": [...], "mode"}``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["ToolChoice", "parse_tool_choice"]


class ToolChoice(NamedTuple):
    """A ``tool_choice`` read once: ``mode`` is auto | none | required (or what the client sent),
    ``name`` the one function forced, ``allowed`` the ``allowed_tools`` subset (None: all)."""

    mode: str
    name: str | None = None
    allowed: frozenset[str] | None = None

    def permitted(self, tools: list[dict[str, Any]]) -> frozenset[str]:
        """The names a call may use, given the offered ``tools``."""
        if self.mode == "none":
            return frozenset()
        if self.name is not None:
            return frozenset({self.name})
        if self.allowed is not None:
            return self.allowed
        return frozenset(name for t in tools if isinstance(name := t.get("name"), str))


def parse_tool_choice(tool_choice: str | dict[str, Any] | None) -> ToolChoice:
    if isinstance(tool_choice, dict):
        kind = tool_choice.get("type")
        if kind == "function":
            return ToolChoice("required", tool_choice["name"])
        if kind == "allowed_tools":
            allowed = frozenset(
                name for t in tool_choice.get("tools") or [] if isinstance(name := t.get("name"), str)
            )
            return ToolChoice(tool_choice.get("mode") or "auto", None, allowed)
        return ToolChoice("auto")
    return ToolChoice(tool_choice or "auto")
