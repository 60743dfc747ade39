"""The ``anthropic`` adapter: one ``POST {base_url}/v1/messages`` per generation
(streamed, or one unstreamed Messages reply when ``request.stream`` is False)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from adapters.anthropic.request import applied, build_body
from adapters.anthropic.stream import MessagesStreamTranslator
from adapters.anthropic.wire import MessagesRequest
from adapters.base import UpstreamRequest
from adapters.deltas import Delta
from adapters.streaming import HTTPStreamAdapter, json_object
from gateway.kernel.client_api import ClientApi

__all__ = ["AnthropicAdapter"]


class AnthropicAdapter(HTTPStreamAdapter[MessagesStreamTranslator]):
    """Streams deltas from the Anthropic Messages API (``x-api-key`` + ``anthropic-version``)."""

    path = "/v1/messages"

    def provider_headers(self, key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": self.settings.anthropic_version}
        if key:
            headers["x-api-key"] = key
        return headers

    def request_headers(self, request: UpstreamRequest) -> dict[str, str] | None:
        """A Messages client's ``anthropic-beta``, sent on with its request (its betas enable the
        fields it sends)."""
        native = request.native
        if native is not None and native.api is ClientApi.MESSAGES and native.headers:
            return native.headers
        return None

    def body(self, request: UpstreamRequest) -> MessagesRequest:
        settings = self.settings
        caching = settings.prompt_caching == "auto"
        return build_body(
            request,
            default_max_tokens=settings.default_max_tokens,
            caching=caching,
            send_defaults=self.send_defaults,
        )

    def applied(self, request: UpstreamRequest) -> dict[str, Any]:
        settings = self.settings
        return applied(
            request,
            default_max_tokens=settings.default_max_tokens,
            send_defaults=self.send_defaults,
        )

    def translator(self) -> MessagesStreamTranslator:
        return MessagesStreamTranslator()

    def unstreamed_deltas(self, translator: MessagesStreamTranslator, body: Any) -> Iterable[Delta]:
        return translator.unstreamed_deltas(json_object(body))
