"""Deltas that arrive together go out together (``adapters.streaming.merge_ready``, the provider's
``merge_deltas``): adjacent pieces of one text decoded from one upstream read become one delta, with
the same concatenated text and logprobs; nothing is ever held back to wait for more input."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
from pydantic import SecretStr

from adapters.base import UpstreamRequest
from adapters.deltas import (
    Delta,
    Finish,
    ItemDone,
    ReasoningDelta,
    ReasoningSummaryDelta,
    RefusalDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
from adapters.openai_chat import OpenAIChatAdapter
from adapters.streaming import merge_ready
from gateway.kernel.errors import UpstreamError
from gateway.kernel.settings import ProviderSettings

LP = [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]
LP2 = [{"token": "b", "logprob": -1.5, "bytes": [98], "top_logprobs": []}]


# == the rule ====================================================================================
def test_runs_of_one_text_merge_with_their_logprobs_in_order() -> None:
    out = merge_ready([TextDelta("a", LP), TextDelta("-"), TextDelta("b", LP2), Usage(1, 2), Finish("stop")])
    assert out == [TextDelta("a-b", LP + LP2), Usage(1, 2), Finish("stop")]
    assert merge_ready([TextDelta("x"), TextDelta("y")]) == [TextDelta("xy", None)]


def test_other_deltas_end_a_run() -> None:
    deltas: list[Delta] = [
        ReasoningSummaryDelta("s", 0),
        ReasoningSummaryDelta("t", 0),
        ReasoningSummaryDelta("u", 1),  # another summary part
        ReasoningDelta("r"),
        ReasoningDelta("s"),
        TextDelta("a"),
        RefusalDelta("no"),
        RefusalDelta("pe"),
        TextDelta("b"),
        ItemDone(),
        TextDelta("c"),
        ToolCallStart(0, "f"),
        ToolCallArgsDelta(0, '{"a"'),
        ToolCallArgsDelta(0, ":1}"),
        ToolCallStart(1, "g"),
        ToolCallArgsDelta(1, "{}"),
        ToolCallArgsDelta(0, ""),  # another call's key
    ]
    assert merge_ready(deltas) == [
        ReasoningSummaryDelta("st", 0),
        ReasoningSummaryDelta("u", 1),
        ReasoningDelta("rs"),
        TextDelta("a"),
        RefusalDelta("nope"),
        TextDelta("b"),
        ItemDone(),
        TextDelta("c"),
        ToolCallStart(0, "f"),
        ToolCallArgsDelta(0, '{"a":1}'),
        ToolCallStart(1, "g"),
        ToolCallArgsDelta(1, "{}"),
        ToolCallArgsDelta(0, ""),
    ]


def test_merging_reads_separately_then_together_is_merging_once() -> None:
    deltas: list[Delta] = [TextDelta(c) for c in "hello"]
    deltas.append(ToolCallStart(0, "f"))
    deltas += [ToolCallArgsDelta(0, c) for c in "{}"] + [Finish("tool_calls")]
    for cut in range(len(deltas) + 1):
        parts = merge_ready(deltas[:cut]) + merge_ready(deltas[cut:])
        assert merge_ready(parts) == merge_ready(deltas)
    assert merge_ready([]) == [] and merge_ready([TextDelta("a")]) == [TextDelta("a")]


# == over the wire ===============================================================================
def _chunk(delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> bytes:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    if logprobs is not None:
        choice["logprobs"] = {"content": logprobs}
    return (
        b"data: "
        + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "choices": [choice]})
        + b"\n\n"
    )


PIECES = [f"w{i} " for i in range(40)]
WHOLE = b"".join(_chunk({"content": p}, [{"token": p, "logprob": -0.1 * i}]) for i, p in enumerate(PIECES))
END = _chunk({}, finish="stop") + b"data: [DONE]\n\n"


@contextlib.asynccontextmanager
async def raw_upstream(script: Callable[[asyncio.StreamWriter], Any]) -> AsyncIterator[str]:
    """A loopback HTTP/1.1 server answering every request with a chunked SSE stream that
    ``script(writer)`` writes (a whole stream in one write, or in steps)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
            b"connection: close\r\n\r\n"
        )
        with contextlib.suppress(ConnectionError):
            await script(writer)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/v1"


def _http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _adapter(base_url: str, merge: bool = True) -> OpenAIChatAdapter:
    return OpenAIChatAdapter(
        ProviderSettings(kind="openai-chat", base_url=base_url, api_key=SecretStr("sk-x"), merge_deltas=merge)
    )


def _req() -> UpstreamRequest:
    return UpstreamRequest(
        model="m", items=[{"type": "message", "role": "user", "content": "hi"}], top_logprobs=1
    )


async def _collect(adapter: OpenAIChatAdapter) -> list[Delta]:
    try:
        async with asyncio.timeout(10):
            return [d async for d in adapter.stream(_req())]
    finally:
        await adapter.aclose()


def _texts(deltas: list[Delta]) -> list[TextDelta]:
    return [d for d in deltas if isinstance(d, TextDelta)]


async def _whole(writer: asyncio.StreamWriter) -> None:
    writer.write(_http_chunk(WHOLE + END))  # one write: the gateway reads it at once
    await writer.drain()


async def test_a_stream_read_at_once_is_fewer_deltas_with_the_same_text_and_logprobs() -> None:
    async with raw_upstream(_whole) as url:
        merged = await _collect(_adapter(url))
        apart = await _collect(_adapter(url, merge=False))
    assert len(_texts(apart)) == len(PIECES)  # merge_deltas: false: one delta per upstream chunk
    assert len(_texts(merged)) < len(PIECES) // 2
    for out in (merged, apart):
        assert "".join(d.text for d in _texts(out)) == "".join(PIECES)
        logprobs = [lp for d in _texts(out) for lp in d.logprobs or ()]
        assert [lp["token"] for lp in logprobs] == PIECES
        assert [lp["logprob"] for lp in logprobs] == pytest.approx([-0.1 * i for i in range(len(PIECES))])
        assert out[-1] == Finish("stop")


async def test_nothing_is_held_back_for_more_input() -> None:
    """The upstream sends one piece and waits until the client has it: a delta held back to be
    merged with the next would never arrive (the test would time out)."""
    got_first = asyncio.Event()

    async def stepwise(writer: asyncio.StreamWriter) -> None:
        writer.write(_http_chunk(_chunk({"content": "first "})))
        await writer.drain()
        await asyncio.wait_for(got_first.wait(), 10)
        writer.write(_http_chunk(_chunk({"content": "second"}) + END))
        await writer.drain()

    async with raw_upstream(stepwise) as url:
        adapter = _adapter(url)
        out: list[Delta] = []
        try:
            async with asyncio.timeout(10):
                async for d in adapter.stream(_req()):
                    out.append(d)
                    if d == TextDelta("first "):
                        got_first.set()
        finally:
            await adapter.aclose()
    assert _texts(out) == [TextDelta("first "), TextDelta("second")]


async def test_deltas_before_an_error_in_the_same_read_still_come_first() -> None:
    error = b'data: {"error": {"message": "boom", "code": 500}}\n\n'

    async def then_error(writer: asyncio.StreamWriter) -> None:
        writer.write(_http_chunk(_chunk({"content": "a"}) + _chunk({"content": "b"}) + error))
        await writer.drain()

    async with raw_upstream(then_error) as url:
        adapter = _adapter(url)
        out: list[Delta] = []
        with pytest.raises(UpstreamError):
            try:
                async with asyncio.timeout(10):
                    async for d in adapter.stream(_req()):
                        out.append(d)
            finally:
                await adapter.aclose()
    assert "".join(d.text for d in _texts(out)) == "ab"
