"""The ``anthropic`` provider: the Anthropic Messages API (``POST /v1/messages``)."""

from adapters.anthropic.adapter import AnthropicAdapter

__all__ = ["AnthropicAdapter"]
