"""The ``openai-chat`` provider: any OpenAI-compatible Chat Completions server (OpenAI, vLLM,
Ollama, llama.cpp, OpenRouter, Groq...)."""

from adapters.openai_chat.adapter import OpenAIChatAdapter

__all__ = ["OpenAIChatAdapter"]
