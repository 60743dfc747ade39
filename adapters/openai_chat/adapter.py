"""The ``openai-chat`` adapter: one ``POST {base_url}/chat/completions`` per generation
(streamed, or one unstreamed completion when ``request.stream`` is False)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from adapters.base import UpstreamRequest
from adapters.deltas import Delta
from adapters.openai_chat.request import build_body
from adapters.openai_chat.stream import ChatStreamTranslator
from adapters.openai_chat.wire import ChatRequest
from adapters.streaming import HTTPStreamAdapter, json_object

__all__ = ["OpenAIChatAdapter"]


class OpenAIChatAdapter(HTTPStreamAdapter[ChatStreamTranslator]):
    """Streams deltas from an OpenAI-compatible Chat Completions server (bearer token).

    The stream ends with ``data: [DONE]``; a server that ignored ``"stream"`` answers one whole
    completion (or an error) as JSON.
    """

    path = "/chat/completions"
    done_marker = True

    def body(self, request: UpstreamRequest) -> ChatRequest:
        return build_body(request, send_defaults=self.send_defaults)

    def translator(self) -> ChatStreamTranslator:
        return ChatStreamTranslator()

    def unstreamed_deltas(self, translator: ChatStreamTranslator, body: Any) -> Iterable[Delta]:
        return translator.feed(json_object(body)) + translator.end(done=True)

    def finish(self, translator: ChatStreamTranslator, ended: bool) -> list[Delta]:
        return translator.end(done=ended)
