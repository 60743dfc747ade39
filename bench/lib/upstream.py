"""A fast fake LLM upstream for the benchmark, speaking four wire formats (chosen by request path).

A raw asyncio (uvloop) HTTP/1.1 server with keep-alive and the ``httptools`` C parser, so it costs
as little CPU per request as possible and is not the bottleneck of the measurement. Every answer is
pre-encoded (per format and chunk count) and written at once; streams are ``text/event-stream`` in
chunked transfer encoding, one SSE event per HTTP chunk.

* OpenAI Chat Completions, ``POST /v1/chat/completions``: ``"stream": false`` → a fixed, small
  ``chat.completion`` JSON; ``"stream": true`` → one role chunk, N content chunks (``"tok "`` each),
  a finish chunk, a usage chunk, ``data: [DONE]``.
* OpenAI Responses, ``POST /v1/responses``: ``"stream": true`` → ``event:``-named events
  ``response.created``, ``response.in_progress``, ``response.output_item.added``,
  ``response.content_part.added``, N × ``response.output_text.delta``, ``response.output_text.done``,
  ``response.content_part.done``, ``response.output_item.done``, ``response.completed`` (with usage);
  no ``[DONE]`` (like the real API). Otherwise a whole ``response`` object.
* Anthropic Messages, ``POST /v1/messages``: ``"stream": true`` → ``message_start``,
  ``content_block_start``, N × ``content_block_delta`` (``text_delta``), ``content_block_stop``,
  ``message_delta`` (``stop_reason: end_turn`` + usage), ``message_stop``. Otherwise a whole
  ``message``.
* Gemini, ``POST /v1beta/models/{model}:streamGenerateContent?alt=sse`` → ``data:`` lines (CRLF, like
  the real API): N chunks with one ``{"text": "tok "}`` part (and ``usageMetadata`` with the prompt
  count, as Gemini sends it on every chunk), then a last chunk with an empty text part,
  ``finishReason: STOP`` and the full ``usageMetadata``. Without ``alt=sse`` the same chunks as one
  JSON array; ``:generateContent`` → a whole ``GenerateContentResponse``. The model is in the path.

``GET /stats`` returns request counters; any other path gets 404. Request headers (API keys,
versions) are not checked.

N (the content-chunk count) comes from, first match wins: the ``x-fake-chunks`` request header;
a model name ``fake-<N>`` (Gemini: the model in the path); otherwise ``--chunks`` (default 16).
``max_tokens`` (and the other formats' equivalents) is deliberately ignored so that the gateway's own
translation of ``max_output_tokens`` does not change the load.

Agent mode (for the multi-turn benchmark, Chat Completions only): when the request offers ``tools``
and its last message is a ``user`` message, the answer is one streamed ``lookup`` tool call (id
``call_<message count>``) with ``finish_reason: tool_calls``; after a ``tool`` message it answers N
text chunks as usual.

Run: ``python -m bench upstream --port 9001`` (prints ``READY <port>`` on stdout when listening).
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
ANSWER = "Hello! This is the fake upstream answering."  # every non-streaming answer

_COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": ANSWER},
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


def _json_reply(obj: Any) -> bytes:
    body = orjson.dumps(obj)
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


def _named(event: str, obj: dict[str, Any]) -> bytes:
    """One SSE event with an ``event:`` line, as one HTTP chunk."""
    data = b"event: " + event.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


# --------------------------------------------------------------------------------------------
# OpenAI Responses
# --------------------------------------------------------------------------------------------


_RESP_ID = "resp_bench"
_MSG_ID = "msg_bench"


def _response(status: str, output: list[Any], usage: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": _RESP_ID,
        "object": "response",
        "created_at": 1_700_000_000,
        "status": status,
        "model": "fake",
        "output": output,
        "usage": usage,
        "error": None,
        "incomplete_details": None,
        "store": False,
    }


def _responses_usage(output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": 9,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 9 + output_tokens,
    }


def _message_item(status: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
    return {"id": _MSG_ID, "type": "message", "status": status, "role": "assistant", "content": content}


_RESPONSES_JSON = _json_reply(
    _response("completed", [_message_item("completed", ANSWER)], _responses_usage(8))
)


def responses_stream(n: int) -> bytes:
    seq = 0
    parts = [_SSE_HEAD]

    def emit(kind: str, **fields: Any) -> None:
        nonlocal seq
        parts.append(_named(kind, {"type": kind, "sequence_number": seq, **fields}))
        seq += 1

    text = TOKEN * n
    where = {"item_id": _MSG_ID, "output_index": 0, "content_index": 0}
    part = {"type": "output_text", "text": "", "annotations": []}
    emit("response.created", response=_response("in_progress", [], None))
    emit("response.in_progress", response=_response("in_progress", [], None))
    emit("response.output_item.added", output_index=0, item=_message_item("in_progress", None))
    emit("response.content_part.added", **where, part=part)
    for _ in range(n):
        emit("response.output_text.delta", **where, delta=TOKEN, logprobs=[])
    emit("response.output_text.done", **where, text=text, logprobs=[])
    emit("response.content_part.done", **where, part={**part, "text": text})
    item = _message_item("completed", text)
    emit("response.output_item.done", output_index=0, item=item)
    emit("response.completed", response=_response("completed", [item], _responses_usage(n)))
    parts.append(b"0\r\n\r\n")
    return b"".join(parts)


# --------------------------------------------------------------------------------------------
# Anthropic Messages
# --------------------------------------------------------------------------------------------


def _anthropic_message(content: list[Any], stop: str | None, output_tokens: int) -> dict[str, Any]:
    return {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": "fake",
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 9,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": output_tokens,
        },
    }


_MESSAGES_JSON = _json_reply(_anthropic_message([{"type": "text", "text": ANSWER}], "end_turn", 8))


def messages_stream(n: int) -> bytes:
    parts = [_SSE_HEAD]

    def emit(kind: str, **fields: Any) -> None:
        parts.append(_named(kind, {"type": kind, **fields}))

    emit("message_start", message=_anthropic_message([], None, 1))
    emit("content_block_start", index=0, content_block={"type": "text", "text": ""})
    delta = _named(
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": TOKEN}},
    )
    parts.extend([delta] * n)
    emit("content_block_stop", index=0)
    emit(
        "message_delta",
        delta={"stop_reason": "end_turn", "stop_sequence": None},
        usage={"output_tokens": n},
    )
    emit("message_stop")
    parts.append(b"0\r\n\r\n")
    return b"".join(parts)


# --------------------------------------------------------------------------------------------
# Gemini
# --------------------------------------------------------------------------------------------


def _gemini_chunk(text: str, final_tokens: int | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}
    usage: dict[str, Any] = {"promptTokenCount": 9}
    if final_tokens is not None:
        candidate["finishReason"] = "STOP"
        usage.update(candidatesTokenCount=final_tokens, totalTokenCount=9 + final_tokens)
    return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": "fake", "responseId": "bench"}


def _crlf_frame(obj: dict[str, Any]) -> bytes:
    data = b"data: " + orjson.dumps(obj) + b"\r\n\r\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


_GEMINI_JSON = _json_reply(_gemini_chunk(ANSWER, 8))


def gemini_stream(n: int) -> bytes:
    parts = [_SSE_HEAD]
    parts.extend([_crlf_frame(_gemini_chunk(TOKEN))] * n)
    parts.append(_crlf_frame(_gemini_chunk("", n)))
    parts.append(b"0\r\n\r\n")
    return b"".join(parts)


def gemini_array(n: int) -> bytes:
    """``:streamGenerateContent`` without ``alt=sse``: the chunks as one JSON array."""
    return _json_reply([_gemini_chunk(TOKEN) for _ in range(n)] + [_gemini_chunk("", n)])


_GEMINI_PREFIX = b"/v1beta/models/"
_BUILDERS = {
    "chat": text_stream,
    "responses": responses_stream,
    "anthropic": messages_stream,
    "gemini": gemini_stream,
    "gemini-array": gemini_array,
}


class Upstream:
    """Shared state: the pre-encoded stream cache and counters."""

    def __init__(self, default_chunks: int) -> None:
        self.default_chunks = default_chunks
        self.streams: dict[tuple[str, int], bytes] = {}
        self.counts: dict[str, Any] = {
            "requests": 0,
            "json": 0,
            "stream": 0,
            "tool_calls": 0,
            "by_format": {"chat": 0, "responses": 0, "anthropic": 0, "gemini": 0},
        }

    def stream_bytes(self, n: int, fmt: str = "chat") -> bytes:
        data = self.streams.get((fmt, n))
        if data is None:
            data = self.streams[fmt, n] = _BUILDERS[fmt](n)
        return data

    def answer(self, url: bytes, headers: dict[bytes, bytes], body: bytes) -> bytes:
        counts = self.counts
        path, _, query = url.partition(b"?")
        if path == b"/stats":
            return _json_reply(counts)
        counts["requests"] += 1
        if path == b"/v1/chat/completions":
            fmt = "chat"
        elif path == b"/v1/responses":
            fmt = "responses"
        elif path == b"/v1/messages":
            fmt = "anthropic"
        elif path.startswith(_GEMINI_PREFIX):
            return self._gemini(path[len(_GEMINI_PREFIX) :], query, headers)
        else:
            return _NOT_FOUND
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError:
            return _BAD
        if not isinstance(req, dict):
            return _BAD
        counts["by_format"][fmt] += 1
        if not req.get("stream"):
            counts["json"] += 1
            if fmt == "chat":
                return _JSON_HEAD + _COMPLETION
            return _RESPONSES_JSON if fmt == "responses" else _MESSAGES_JSON
        counts["stream"] += 1
        if fmt == "chat":
            messages = req.get("messages") or []
            if req.get("tools") and messages and messages[-1].get("role") == "user":
                counts["tool_calls"] += 1
                return tool_stream(f"call_{len(messages)}")
        return self.stream_bytes(self._chunks(headers, req.get("model")), fmt)

    def _gemini(self, rest: bytes, query: bytes, headers: dict[bytes, bytes]) -> bytes:
        """``{model}:generateContent`` or ``{model}:streamGenerateContent[?alt=sse]``."""
        model, _, method = rest.partition(b":")
        if method not in (b"generateContent", b"streamGenerateContent"):
            return _NOT_FOUND
        self.counts["by_format"]["gemini"] += 1
        if method == b"generateContent":
            self.counts["json"] += 1
            return _GEMINI_JSON
        self.counts["stream"] += 1
        n = self._chunks(headers, model.decode(errors="replace"))
        return self.stream_bytes(n, "gemini" if b"alt=sse" in query.split(b"&") else "gemini-array")

    def _chunks(self, headers: dict[bytes, bytes], model: Any) -> int:
        raw = headers.get(b"x-fake-chunks")
        if raw is not None and raw.isdigit():
            return min(int(raw), MAX_CHUNKS)
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
    parser = argparse.ArgumentParser(
        description="fake upstream: Chat Completions, Responses, Anthropic Messages, Gemini"
    )
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
