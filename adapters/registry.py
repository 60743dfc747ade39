"""Provider kind → adapter class, imported lazily so an unused provider costs nothing."""

from __future__ import annotations

import importlib

from adapters.base import Adapter
from gateway.kernel.settings import ProviderSettings

_KINDS: dict[str, str] = {
    "mock": "adapters.mock.adapter:MockAdapter",
    "openai-chat": "adapters.openai_chat.adapter:OpenAIChatAdapter",
    "openai-responses": "adapters.openai_responses.adapter:OpenAIResponsesAdapter",
    "anthropic": "adapters.anthropic.adapter:AnthropicAdapter",
    "gemini": "adapters.gemini.adapter:GeminiAdapter",
}


def create_adapter(settings: ProviderSettings) -> Adapter:
    module_name, _, cls_name = _KINDS[settings.kind].partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(settings)  # type: ignore[no-any-return]
