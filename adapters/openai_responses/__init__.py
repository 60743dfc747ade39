"""The ``openai-responses`` provider: servers that speak the Responses API themselves (OpenAI,
Azure OpenAI, vLLM, Ollama, other Open Responses servers)."""

from adapters.openai_responses.adapter import OpenAIResponsesAdapter

__all__ = ["OpenAIResponsesAdapter"]
