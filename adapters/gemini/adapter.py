"""The ``gemini`` adapter: one ``POST {base_url}/models/{model}:streamGenerateContent?alt=sse``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from adapters.base import UpstreamRequest
from adapters.deltas import Delta
from adapters.gemini.request import build_body, model_path
from adapters.gemini.stream import GeminiStreamTranslator
from adapters.gemini.wire import GeminiRequest
from adapters.streaming import HTTPStreamAdapter

__all__ = ["GeminiAdapter"]


class GeminiAdapter(HTTPStreamAdapter[GeminiStreamTranslator]):
    """Streams deltas from the Gemini API (Generative Language API, ``x-goog-api-key``);
    ``:generateContent`` when the request need not stream."""

    def provider_headers(self, key: str | None) -> dict[str, str]:
        return {"x-goog-api-key": key} if key else {}

    def url(self, request: UpstreamRequest) -> str:
        if request.stream:
            return f"{self._base}/{model_path(request.model)}:streamGenerateContent?alt=sse"
        return f"{self._base}/{model_path(request.model)}:generateContent"

    def body(self, request: UpstreamRequest) -> GeminiRequest:
        return build_body(request)

    def translator(self) -> GeminiStreamTranslator:
        return GeminiStreamTranslator()

    def unstreamed_deltas(self, translator: GeminiStreamTranslator, body: Any) -> Iterator[Delta]:
        # Without alt=sse (some proxies) the stream is one JSON array of chunks.
        for chunk in body if isinstance(body, list) else [body]:
            if isinstance(chunk, dict):
                yield from translator.feed(chunk)
        yield from translator.end()
