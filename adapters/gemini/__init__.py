"""The ``gemini`` provider: the Gemini API (Generative Language API, ``streamGenerateContent``)."""

from adapters.gemini.adapter import GeminiAdapter

__all__ = ["GeminiAdapter"]
