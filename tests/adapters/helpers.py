"""What the adapter tests share: normalized transcript items, running a stream translator or an
adapter to the end, and checking that an upstream error leaks nothing of the upstream's body, key or
address (the fixtures that serve a fake upstream are ``tests.helpers.fake_fixtures``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import orjson

from adapters.base import Adapter, UpstreamRequest
from adapters.deltas import Delta, TextDelta
from gateway.kernel.errors import UpstreamError

__all__ = [
    "MARKER",
    "SECRET",
    "assert_clean",
    "assistant",
    "call",
    "collector",
    "openai_error",
    "output",
    "text_of",
    "translator_run",
    "user",
]

SECRET = "sk-live-SECRET-0123456789"  # an upstream key
MARKER = "RAW-UPSTREAM-BODY-MARKER"  # text of an upstream error body


def user(*texts: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": t} for t in texts]}


def assistant(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
        **extra,
    }


def call(call_id: str, name: str = "f", args: str = "{}") -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": args}


def output(call_id: str, out: Any = "ok") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": out}


def text_of(deltas: Iterable[Delta]) -> str:
    return "".join(d.text for d in deltas if isinstance(d, TextDelta))


class _Translator(Protocol):
    def feed(self, chunk: dict[str, Any], /) -> list[Delta]: ...

    def end(self) -> list[Delta]: ...


def translator_run(make: Callable[[], _Translator]) -> Callable[[Iterable[dict[str, Any]]], list[Delta]]:
    """``translate(chunks)``: every delta a fresh translator makes of ``chunks``, the final ones too."""

    def translate(chunks: Iterable[dict[str, Any]]) -> list[Delta]:
        t = make()
        out = [d for c in chunks for d in t.feed(c)]
        return out + t.end()

    return translate


def collector(default: Callable[[], UpstreamRequest]) -> Callable[..., Awaitable[list[Delta]]]:
    """``collect(adapter, request=None)``: all deltas of one generation (``default()`` when no
    request is given), within 10 seconds."""

    async def collect(adapter: Adapter, request: UpstreamRequest | None = None) -> list[Delta]:
        async with asyncio.timeout(10):
            return [d async for d in adapter.stream(request or default())]

    return collect


def openai_error(
    code: str | None, message: str = "fake refusal", type_: str = "invalid_request_error"
) -> bytes:
    """An OpenAI-style error body, with ``MARKER`` beside its message (only the message, scrubbed,
    may reach a client)."""
    error = {"message": message, "type": type_, "param": None, "code": code}
    return orjson.dumps({"error": error, "debug": MARKER})


def assert_clean(err: UpstreamError) -> None:
    """No rendering of ``err`` carries the upstream body beyond its message (``MARKER`` stands for
    the rest), the key or the upstream's address."""
    text = repr((str(err), err.message, err.error_object(), err.http_body(), err.stream_event(0)))
    for bad in (MARKER, SECRET, "127.0.0.1", "http://"):
        assert bad not in text
