"""The ``openai-responses`` adapter: one ``POST {base_url}/responses`` per generation
(streamed, or one unstreamed response object when ``request.stream`` is False)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from adapters.base import UpstreamRequest
from adapters.deltas import Delta
from adapters.openai_responses.request import build_body
from adapters.openai_responses.stream import ResponsesStreamTranslator
from adapters.openai_responses.wire import ResponsesRequest
from adapters.streaming import HTTPStreamAdapter, json_object

__all__ = ["OpenAIResponsesAdapter"]


class OpenAIResponsesAdapter(HTTPStreamAdapter[ResponsesStreamTranslator]):
    """Streams deltas from a Responses API server (OpenAI, Azure OpenAI, vLLM, Ollama...), bearer token.

    Some servers name the event only in the SSE ``event:`` line, or end with ``data: [DONE]``; a
    server that ignored ``"stream"`` answers the whole response object as JSON.
    """

    path = "/responses"
    done_marker = True
    named_events = True

    def body(self, request: UpstreamRequest) -> ResponsesRequest:
        return build_body(request, send_defaults=self.send_defaults)

    def translator(self) -> ResponsesStreamTranslator:
        return ResponsesStreamTranslator()

    def unstreamed_deltas(self, translator: ResponsesStreamTranslator, body: Any) -> Iterable[Delta]:
        return translator.unstreamed_deltas(json_object(body))
