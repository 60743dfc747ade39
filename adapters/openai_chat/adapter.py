"""The ``openai-chat`` adapter: one streamed ``POST {base_url}/chat/completions`` per generation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import httpx
import orjson

from adapters.base import UpstreamRequest
from adapters.deltas import Delta
from adapters.http import create_client, open_stream
from adapters.openai_chat.request import build_body
from adapters.openai_chat.stream import ChatStreamTranslator
from gateway.errors import UpstreamError
from gateway.settings import ProviderSettings

__all__ = ["OpenAIChatAdapter"]


class OpenAIChatAdapter:
    """Streams deltas from an OpenAI-compatible Chat Completions server.

    ``client`` lets a caller share or inject an ``httpx.AsyncClient``; by default the adapter owns
    one pooled client (closed by :meth:`aclose`).
    """

    def __init__(self, settings: ProviderSettings, *, client: httpx.AsyncClient | None = None) -> None:
        self.settings = settings
        self._client = client if client is not None else create_client(settings)
        self._owns_client = client is None
        self._url = settings.resolved_base_url() + "/chat/completions"
        headers = {"accept": "text/event-stream"}
        key = settings.resolved_api_key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        headers.update(settings.headers)
        self._headers = headers

    async def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
        """Send ``request``; yield its deltas. Raises ``UpstreamError`` (and subclasses)."""
        body = build_body(request)
        translator = ChatStreamTranslator()
        async with open_stream(
            self._client,
            "POST",
            self._url,
            json_body=body,
            headers=self._headers,
            total_timeout=self.settings.timeouts.total,
        ) as upstream:
            if upstream.headers.get("content-type", "").startswith("application/json"):
                # A server that ignored "stream": one whole completion (or an error) as JSON.
                whole = await upstream.read_json()
                if not isinstance(whole, dict):
                    raise UpstreamError("The upstream provider sent a malformed response.")
                for delta in translator.feed(whole):
                    yield delta
                for delta in translator.end(done=True):
                    yield delta
                return
            done = False
            async with aclosing(upstream.events()) as events:
                async for event in events:
                    data = event.data
                    if not data:
                        continue
                    if data == "[DONE]":
                        done = True
                        break
                    try:
                        chunk = orjson.loads(data)
                    except orjson.JSONDecodeError:
                        raise UpstreamError("The upstream provider sent malformed stream data.") from None
                    if isinstance(chunk, dict):
                        for delta in translator.feed(chunk):
                            yield delta
            if done:
                await upstream.drain()  # the body's end is normally right behind [DONE]: reuse the socket
        for delta in translator.end(done=done):
            yield delta

    async def aclose(self) -> None:
        """Close the connection pool (when the adapter owns it)."""
        if self._owns_client:
            await self._client.aclose()
