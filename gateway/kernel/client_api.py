"""The client APIs the gateway serves on one engine: Open Responses, and the Chat Completions and
Anthropic Messages ingresses (codecs at the app edge, gateway/api/)."""

from __future__ import annotations

from enum import StrEnum


class ClientApi(StrEnum):
    """Which API a request came in by: the ``api`` label of metrics, spans and log lines."""

    RESPONSES = "responses"
    CHAT = "chat"
    MESSAGES = "messages"
