"""The ``anthropic`` adapter: one streamed ``POST {base_url}/v1/messages`` per generation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import httpx
import orjson

from adapters.anthropic.request import build_body
from adapters.anthropic.stream import MessagesStreamTranslator
from adapters.base import UpstreamRequest
from adapters.deltas import Delta
from adapters.http import create_client, open_stream
from gateway.errors import UpstreamError
from gateway.settings import ProviderSettings

__all__ = ["AnthropicAdapter"]


class AnthropicAdapter:
    """Streams deltas from the Anthropic Messages API (``x-api-key`` + ``anthropic-version``).

    ``client`` lets a caller share or inject an ``httpx.AsyncClient``; by default the adapter owns
    one pooled client (closed by :meth:`aclose`).
    """

    def __init__(self, settings: ProviderSettings, *, client: httpx.AsyncClient | None = None) -> None:
        self.settings = settings
        self._client = client if client is not None else create_client(settings)
        self._owns_client = client is None
        self._url = settings.resolved_base_url() + "/v1/messages"
        headers = {"accept": "text/event-stream", "anthropic-version": settings.anthropic_version}
        key = settings.resolved_api_key()
        if key:
            headers["x-api-key"] = key
        headers.update(settings.headers)
        self._headers = headers

    async def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
        """Send ``request``; yield its deltas. Raises ``UpstreamError`` (and subclasses)."""
        translator = MessagesStreamTranslator()
        body = build_body(request, default_max_tokens=self.settings.default_max_tokens)
        async with open_stream(
            self._client,
            "POST",
            self._url,
            json_body=body,
            headers=self._headers,
            total_timeout=self.settings.timeouts.total,
        ) as upstream:
            async with aclosing(upstream.events()) as events:
                async for event in events:
                    if not event.data:
                        continue
                    try:
                        data = orjson.loads(event.data)
                    except orjson.JSONDecodeError:
                        raise UpstreamError("The upstream provider sent malformed stream data.") from None
                    if not isinstance(data, dict):
                        continue
                    for delta in translator.feed(data):
                        yield delta
                    if translator.done:
                        break
            if translator.done:
                await upstream.drain()  # the body's end is right behind: reuse the socket
        for delta in translator.end():
            yield delta

    async def aclose(self) -> None:
        """Close the connection pool (when the adapter owns it)."""
        if self._owns_client:
            await self._client.aclose()
