"""The ``openai-responses`` adapter: one streamed ``POST {base_url}/responses`` per generation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import httpx
import orjson

from adapters.base import UpstreamRequest
from adapters.deltas import Delta
from adapters.http import create_client, open_stream
from adapters.openai_responses.request import build_body
from adapters.openai_responses.stream import ResponsesStreamTranslator
from gateway.errors import UpstreamError
from gateway.settings import ProviderSettings

__all__ = ["OpenAIResponsesAdapter"]


class OpenAIResponsesAdapter:
    """Streams deltas from a Responses API server (OpenAI, Azure OpenAI, vLLM, Ollama...).

    ``client`` lets a caller share or inject an ``httpx.AsyncClient``; by default the adapter owns
    one pooled client (closed by :meth:`aclose`).
    """

    def __init__(self, settings: ProviderSettings, *, client: httpx.AsyncClient | None = None) -> None:
        self.settings = settings
        self._client = client if client is not None else create_client(settings)
        self._owns_client = client is None
        self._url = settings.resolved_base_url() + "/responses"
        headers = {"accept": "text/event-stream"}
        key = settings.resolved_api_key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        headers.update(settings.headers)
        self._headers = headers

    async def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
        """Send ``request``; yield its deltas. Raises ``UpstreamError`` (and subclasses)."""
        translator = ResponsesStreamTranslator()
        async with open_stream(
            self._client,
            "POST",
            self._url,
            json_body=build_body(request),
            headers=self._headers,
            total_timeout=self.settings.timeouts.total,
        ) as upstream:
            if upstream.headers.get("content-type", "").startswith("application/json"):
                whole = await upstream.read_json()  # a server that ignored "stream"
                if not isinstance(whole, dict):
                    raise UpstreamError("The upstream provider sent a malformed response.")
                for delta in translator.whole(whole):
                    yield delta
                return
            async with aclosing(upstream.events()) as events:
                async for event in events:
                    if not event.data or event.data == "[DONE]":
                        continue
                    try:
                        data = orjson.loads(event.data)
                    except orjson.JSONDecodeError:
                        raise UpstreamError("The upstream provider sent malformed stream data.") from None
                    if not isinstance(data, dict):
                        continue
                    if "type" not in data and event.event:
                        data["type"] = event.event
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
