"""A fast fake OpenAI-compatible Chat Completions upstream for the benchmark.

A raw asyncio (uvloop) HTTP/1.1 server with keep-alive and the ``httptools`` C parser, so it costs
as little CPU per request as possible and is not the bottleneck of the measurement. It answers
``POST /v1/chat/completions`` (``GET /stats`` returns request counters; any other path gets 404):

* ``"stream": false`` → a fixed, small ``chat.completion`` JSON (pre-encoded).
* ``"stream": true`` → ``text/event-stream`` in chunked transfer encoding: one role chunk, N content
  chunks (``"tok "`` each), a finish chunk, a usage chunk, ``data: [DONE]``. The whole answer is
  pre-encoded per N and written at once.

N (the content-chunk count) comes from, first match wins: the ``x-fake-chunks`` request header;
a model name ``fake-<N>``; otherwise ``--chunks`` (default 16). ``max_tokens`` is deliberately
ignored so that the gateway's own translation of ``max_output_tokens`` does not change the load.

Agent mode (for the multi-turn benchmark): when the request offers ``tools`` and its last message
is a ``user`` message, the answer is one streamed ``lookup`` tool call (id ``call_<message count>``)
with ``finish_reason: tool_calls``; after a ``tool`` message it answers N text chunks as usual.

Run: ``python -m bench.upstream --port 9001`` (prints ``READY <port>`` on stdout when listening).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any, cast

import httptools
import orjson

DEFAULT_CHUNKS = 16
MAX_CHUNKS = 100_000
TOKEN = "tok "

_COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello! This is the fake upstream answering."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 8, "total_tokens": 17},
    }
)
_JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(
    _COMPLETION
)
_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
_BAD = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
_CHUNK_BASE: dict[str, Any] = {
    "id": "chatcmpl-bench",
    "object": "chat.completion.chunk",
    "created": 1_700_000_000,
    "model": "fake",
}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {**_CHUNK_BASE, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _frame(obj: Any) -> bytes:
    """One SSE event as one HTTP chunk."""
    data = b"data: " + (obj if isinstance(obj, bytes) else orjson.dumps(obj)) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _usage(completion_tokens: int) -> dict[str, Any]:
    return {
        **_CHUNK_BASE,
        "choices": [],
        "usage": {
            "prompt_tokens": 9,
            "completion_tokens": completion_tokens,
            "total_tokens": 9 + completion_tokens,
        },
    }


_END = _frame(b"[DONE]") + b"0\r\n\r\n"


def text_stream(n: int) -> bytes:
    parts = [_SSE_HEAD, _frame(_chunk({"role": "assistant", "content": ""}))]
    content = _frame(_chunk({"content": TOKEN}))
    parts.extend([content] * n)
    parts.append(_frame(_chunk({}, "stop")))
    parts.append(_frame(_usage(n)))
    parts.append(_END)
    return b"".join(parts)


def tool_stream(call_id: str) -> bytes:
    start = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"index": 0, "id": call_id, "type": "function", "function": {"name": "lookup", "arguments": ""}}
        ],
    }
    parts = [_SSE_HEAD, _frame(_chunk(start))]
    for piece in ('{"query": ', '"bench', 'mark"}'):
        parts.append(_frame(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})))
    parts.append(_frame(_chunk({}, "tool_calls")))
    parts.append(_frame(_usage(3)))
    parts.append(_END)
    return b"".join(parts)


class Upstream:
    """Shared state: the pre-encoded stream cache and counters."""

    def __init__(self, default_chunks: int) -> None:
        self.default_chunks = default_chunks
        self.streams: dict[int, bytes] = {}
        self.counts = {"requests": 0, "json": 0, "stream": 0, "tool_calls": 0}

    def stream_bytes(self, n: int) -> bytes:
        data = self.streams.get(n)
        if data is None:
            data = self.streams[n] = text_stream(n)
        return data

    def answer(self, path: bytes, headers: dict[bytes, bytes], body: bytes) -> bytes:
        counts = self.counts
        if path == b"/stats":
            stats = orjson.dumps(counts)
            return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
                len(stats),
                stats,
            )
        counts["requests"] += 1
        if not path.startswith(b"/v1/chat/completions"):
            return _NOT_FOUND
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError:
            return _BAD
        if not isinstance(req, dict):
            return _BAD
        if not req.get("stream"):
            counts["json"] += 1
            return _JSON_HEAD + _COMPLETION
        counts["stream"] += 1
        messages = req.get("messages") or []
        if req.get("tools") and messages and messages[-1].get("role") == "user":
            counts["tool_calls"] += 1
            return tool_stream(f"call_{len(messages)}")
        return self.stream_bytes(self._chunks(headers, req))

    def _chunks(self, headers: dict[bytes, bytes], req: dict[str, Any]) -> int:
        raw = headers.get(b"x-fake-chunks")
        if raw is not None and raw.isdigit():
            return min(int(raw), MAX_CHUNKS)
        model = req.get("model")
        if isinstance(model, str) and model.startswith("fake-") and model[5:].isdigit():
            return min(int(model[5:]), MAX_CHUNKS)
        return self.default_chunks


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; requests are answered in order."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(_BAD)
                self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(self.upstream.answer(self.url, self.headers, b"".join(self.body)))
        if not self.parser.should_keep_alive():
            transport.close()


async def serve(host: str, port: int, chunks: int) -> None:
    upstream = Upstream(chunks)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Connection(upstream), host, port, backlog=2048, reuse_address=True
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"READY {bound}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fake OpenAI-compatible Chat Completions upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--chunks", type=int, default=DEFAULT_CHUNKS, help="default content chunks per stream"
    )
    args = parser.parse_args(argv)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(serve(args.host, args.port, args.chunks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
