"""The ``gemini`` adapter: one ``POST {base_url}/models/{model}:streamGenerateContent?alt=sse``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import httpx
import orjson

from adapters.base import UpstreamRequest
from adapters.deltas import Delta
from adapters.gemini.request import build_body, model_path
from adapters.gemini.stream import GeminiStreamTranslator
from adapters.http import create_client, open_stream
from gateway.errors import UpstreamError
from gateway.settings import ProviderSettings

__all__ = ["GeminiAdapter"]


class GeminiAdapter:
    """Streams deltas from the Gemini API (Generative Language API, ``x-goog-api-key``).

    ``client`` lets a caller share or inject an ``httpx.AsyncClient``; by default the adapter owns
    one pooled client (closed by :meth:`aclose`).
    """

    def __init__(self, settings: ProviderSettings, *, client: httpx.AsyncClient | None = None) -> None:
        self.settings = settings
        self._client = client if client is not None else create_client(settings)
        self._owns_client = client is None
        self._base = settings.resolved_base_url()
        headers = {"accept": "text/event-stream"}
        key = settings.resolved_api_key()
        if key:
            headers["x-goog-api-key"] = key
        headers.update(settings.headers)
        self._headers = headers

    async def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
        """Send ``request``; yield its deltas. Raises ``UpstreamError`` (and subclasses)."""
        translator = GeminiStreamTranslator()
        url = f"{self._base}/{model_path(request.model)}:streamGenerateContent?alt=sse"
        async with open_stream(
            self._client,
            "POST",
            url,
            json_body=build_body(request),
            headers=self._headers,
            total_timeout=self.settings.timeouts.total,
        ) as upstream:
            if upstream.headers.get("content-type", "").startswith("application/json"):
                # Without alt=sse (some proxies) the stream is one JSON array of chunks.
                whole = await upstream.read_json()
                for chunk in whole if isinstance(whole, list) else [whole]:
                    if isinstance(chunk, dict):
                        for delta in translator.feed(chunk):
                            yield delta
            else:
                async with aclosing(upstream.events()) as events:
                    async for event in events:
                        if not event.data:
                            continue
                        try:
                            chunk = orjson.loads(event.data)
                        except orjson.JSONDecodeError:
                            raise UpstreamError("The upstream provider sent malformed stream data.") from None
                        if isinstance(chunk, dict):
                            for delta in translator.feed(chunk):
                                yield delta
        for delta in translator.end():
            yield delta

    async def aclose(self) -> None:
        """Close the connection pool (when the adapter owns it)."""
        if self._owns_client:
            await self._client.aclose()
