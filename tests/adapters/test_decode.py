"""The stream loop's fast paths (``adapters.streaming.EventReader``: whole-event SSE reads, plain
text read from a chunk's JSON without parsing it once its shape is known, a run's texts joined at
once) give exactly what the general path gives: each read's deltas, the same ones, merged the same
way (or, with ``merge_deltas: false``, one per upstream event), the same errors after the same
deltas. Checked over random streams of the four providers' events, cut at random points."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.anthropic.stream import MessagesStreamTranslator
from adapters.deltas import Delta, Finish, TextDelta, ToolCallArgsDelta, Usage
from adapters.gemini.stream import GeminiStreamTranslator
from adapters.openai_chat.stream import ChatStreamTranslator
from adapters.openai_responses.stream import ResponsesStreamTranslator
from adapters.sse import SSEDecoder
from adapters.streaming import EventReader, StreamTranslator, merge_ready
from adapters.transport import UpstreamCall
from gateway.kernel.errors import UpstreamError

HOLE = "HOLEHOLE"  # replaced, unescaped, by raw text: what a server could send, valid JSON or not

# a piece of text: mostly the usual tokens (so that a chunk's shape is learnt and used), sometimes
# anything, quotes, backslashes, control characters and non-ASCII included
_TOKENS = st.sampled_from(["tok ", "Hello", " world", "é", "😀 x", "a b", "text", "0"])
_ANY_TEXT = st.text(max_size=6)
_TEXT = st.one_of(_TOKENS, _TOKENS, _TOKENS, _ANY_TEXT)
# raw text inside a chunk's JSON string: no line break (the SSE line would end), anything else
_SURROGATES: tuple[Literal["Cs"]] = ("Cs",)
_NO_BREAK = st.characters(exclude_categories=_SURROGATES, exclude_characters="\r\n")
_RAW = st.text(
    st.one_of(
        st.sampled_from('ab "\\\t\x00}{:,/\u00a0\u2028é'),
        _NO_BREAK,
    ),
    max_size=8,
)


class Provider:
    """One provider's stream shape: its events, how they are framed, its translator and flags."""

    def __init__(
        self,
        translator: Callable[[], StreamTranslator],
        events: st.SearchStrategy[dict[str, Any]],
        text_event: Callable[[str], dict[str, Any]],
        last: list[dict[str, Any] | str],
        *,
        done_marker: bool = False,
        named: bool = False,
        crlf: bool = False,
    ) -> None:
        self.translator = translator
        self.events = events
        self.text_event = text_event
        self.last = last
        self.done_marker = done_marker
        self.named = named
        self.crlf = crlf


# == OpenAI Chat Completions =====================================================================
_CHAT_BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def _chat(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {**_CHAT_BASE, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def _chat_text(text: str) -> dict[str, Any]:
    return _chat({"content": text})


def _chat_logprobs(text: str) -> dict[str, Any]:
    chunk = _chat({"content": text})
    chunk["choices"][0]["logprobs"] = {"content": [{"token": text, "logprob": -0.5, "top_logprobs": []}]}
    return chunk


def _chat_call(index: int) -> dict[str, Any]:
    call = {
        "index": index,
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": "f", "arguments": ""},
    }
    return _chat({"role": "assistant", "tool_calls": [call]})


_CHAT = Provider(
    ChatStreamTranslator,
    st.one_of(
        _TEXT.map(_chat_text),
        _TEXT.map(_chat_text),
        _TEXT.map(_chat_logprobs),
        _TEXT.map(lambda t: _chat({"content": t}, obfuscation=t + "x")),  # another field changes too
        _TEXT.map(lambda t: _chat({"reasoning_content": t})),
        _TEXT.map(lambda t: _chat({"content": t}, "stop")),
        st.integers(0, 1).map(_chat_call),
        st.tuples(st.integers(0, 1), _TEXT).map(
            lambda p: _chat({"tool_calls": [{"index": p[0], "function": {"arguments": p[1]}}]})
        ),
        st.just(_chat({"role": "assistant", "content": ""})),
        st.just({**_CHAT_BASE, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}}),
        st.just({"error": {"message": "boom", "code": 500}}),
    ),
    _chat_text,
    [_chat({}, "stop"), "[DONE]"],
    done_marker=True,
)


# == OpenAI Responses ============================================================================
def _responses_text(text: str, seq: int | None = None, **extra: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "response.output_text.delta"}
    if seq is not None:
        event["sequence_number"] = seq
    return {**event, "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": text, **extra}


_RESPONSES = Provider(
    ResponsesStreamTranslator,
    st.one_of(
        _TEXT.map(_responses_text),
        _TEXT.map(_responses_text),
        st.tuples(_TEXT, st.integers(0, 3)).map(lambda p: _responses_text(p[0], p[1], logprobs=[])),
        _TEXT.map(lambda t: _responses_text(t, logprobs=[{"token": t, "logprob": -1.0, "bytes": []}])),
        _TEXT.map(lambda t: _responses_text(t, output_index=3)),
        _TEXT.map(lambda t: {"delta": t, "output_index": 0}),  # no "type": the SSE event name's
        st.just(
            {
                "type": "response.output_item.added",
                "output_index": 1,
                "item": {"type": "function_call", "name": "f", "call_id": "c1", "arguments": ""},
            }
        ),
        _TEXT.map(
            lambda t: {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": t}
        ),
        _TEXT.map(lambda t: {"type": "response.reasoning_summary_text.delta", "output_index": 2, "delta": t}),
        st.just({"type": "response.in_progress", "response": {}}),
    ),
    _responses_text,
    [{"type": "response.completed", "response": {"status": "completed", "usage": {"input_tokens": 1}}}],
    done_marker=True,
    named=True,
)


# == Anthropic Messages ==========================================================================
def _anthropic_text(text: str, index: int = 0) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}


_ANTHROPIC = Provider(
    MessagesStreamTranslator,
    st.one_of(
        _TEXT.map(_anthropic_text),
        _TEXT.map(_anthropic_text),
        _TEXT.map(lambda t: _anthropic_text(t, 2)),
        st.just({"type": "message_start", "message": {"usage": {"input_tokens": 4, "output_tokens": 1}}}),
        st.just({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        st.just(
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
            }
        ),
        _TEXT.map(
            lambda t: {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": t},
            }
        ),
        _TEXT.map(
            lambda t: {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": t},
            }
        ),
        st.integers(0, 1).map(lambda i: {"type": "content_block_stop", "index": i}),
        st.just(
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}}
        ),
        st.just({"type": "ping"}),
        st.just({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}),
    ),
    _anthropic_text,
    [{"type": "message_stop"}],
    named=False,
)


# == Gemini ======================================================================================
def _gemini_text(text: str, tokens: int = 1, **part: Any) -> dict[str, Any]:
    return {
        "candidates": [{"content": {"parts": [{"text": text, **part}], "role": "model"}, "index": 0}],
        "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": tokens},
        "modelVersion": "m",
        "responseId": "resp-1",
    }


def _gemini_logprobs(text: str) -> dict[str, Any]:
    chunk = _gemini_text(text)
    chunk["candidates"][0]["logprobsResult"] = {
        "chosenCandidates": [{"token": text, "logProbability": -0.25}],
        "topCandidates": [],
    }
    return chunk


_GEMINI = Provider(
    GeminiStreamTranslator,
    st.one_of(
        _TEXT.map(_gemini_text),
        _TEXT.map(_gemini_text),
        st.tuples(_TEXT, st.integers(1, 3)).map(lambda p: _gemini_text(p[0], p[1])),  # usage changes
        st.tuples(_TEXT, st.integers(1, 3)).map(lambda p: _gemini_text(p[0], p[1], thought=True)),
        _TEXT.map(lambda t: _gemini_text(t, thoughtSignature="c2ln")),
        _TEXT.map(_gemini_logprobs),
        st.just(
            {
                "candidates": [
                    {"content": {"parts": [{"functionCall": {"name": "f", "args": {"a": 1}}}]}, "index": 0}
                ]
            }
        ),
        st.just({"error": {"code": 503, "status": "UNAVAILABLE", "message": "busy"}}),
    ),
    _gemini_text,
    # the last chunk without usage: the usage of the chunks before stands
    [{"candidates": [{"content": {"parts": []}, "finishReason": "STOP", "index": 0}]}],
    crlf=True,
)

PROVIDERS = {"openai-chat": _CHAT, "openai-responses": _RESPONSES, "anthropic": _ANTHROPIC, "gemini": _GEMINI}


# == the stream, its reads, and the general path ===================================================
@st.composite
def _streams(draw: st.DrawFn, provider: Provider) -> bytes:
    """A provider's SSE body: random events, some with raw text in place of a text's JSON string
    (malformed JSON included), some serialized with spaces and ASCII escapes, a comment now and then."""
    events: list[dict[str, Any] | str] = [*draw(st.lists(provider.events, max_size=30)), *provider.last]
    out = []
    for event in events:
        how = draw(st.sampled_from(["compact", "compact", "compact", "spaced", "raw", "comment"]))
        if isinstance(event, str):
            data = event
        elif how == "raw":
            data = orjson.dumps(provider.text_event(HOLE)).decode().replace(HOLE, draw(_RAW))
        elif how == "spaced":
            data = json.dumps(event)
        else:
            data = orjson.dumps(event).decode()
        name = event.get("type") if isinstance(event, dict) else None
        if how == "comment":
            out.append(b": keep-alive\n\n")
        if provider.named and isinstance(event, dict) and "type" not in event:
            name = "response.output_text.delta"
        block = (
            f"event: {name}\n" if name and (provider.named or provider is _ANTHROPIC) else ""
        ) + f"data: {data}\n\n"
        out.append(block.encode())
    body = b"".join(out)
    return body.replace(b"\n", b"\r\n") if provider.crlf else body


def _cut(body: bytes, points: list[int]) -> list[bytes]:
    cuts = sorted({p % (len(body) + 1) for p in points})
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True) if b > a]


Reads = list[list[Delta] | str]  # each read's deltas; an error's message last


def _fast(provider: Provider, chunks: list[bytes], merge: bool) -> tuple[Reads, str | None]:
    call = UpstreamCall("test", None)
    translator = provider.translator()
    reader = EventReader(
        translator, call, done_marker=provider.done_marker, named=provider.named, merge=merge
    )
    reads: Reads = []
    for chunk in [*chunks, None]:
        out: list[Delta] = []
        try:
            reader.read(chunk, out)
        except UpstreamError as exc:
            return [*reads, out, str(exc)], call.upstream_request_id
        reads.append(out)
        if reader.ended:
            break
    return [*reads, _end(translator, reader.ended)], call.upstream_request_id


def _general(provider: Provider, chunks: list[bytes], merge: bool) -> tuple[Reads, str | None]:
    """The reference: every event through ``SSEDecoder.feed``, ``orjson.loads`` and the
    translator's ``feed``; each read's deltas merged by ``merge_ready``."""
    call = UpstreamCall("test", None)
    translator = provider.translator()
    decoder = SSEDecoder()
    reads: Reads = []
    first = True
    for chunk in [*chunks, None]:
        ready: list[Delta] = []
        ended = False
        try:
            for event in decoder.feed(chunk) if chunk is not None else decoder.flush():
                if not event.data:
                    continue
                if provider.done_marker and event.data == "[DONE]":
                    ended = True
                    break
                try:
                    parsed = orjson.loads(event.data)
                except orjson.JSONDecodeError:
                    raise UpstreamError("The upstream provider sent malformed stream data.") from None
                if not isinstance(parsed, dict):
                    continue
                if first:
                    first = False
                    call.body_id(parsed.get("responseId"))
                if provider.named and "type" not in parsed and event.event:
                    parsed["type"] = event.event
                ready += translator.feed(parsed)
                if translator.done:
                    ended = True
                    break
        except UpstreamError as exc:
            return [*reads, merge_ready(ready) if merge else ready, str(exc)], call.upstream_request_id
        reads.append(merge_ready(ready) if merge else ready)
        if ended:
            break
    return [*reads, _end(translator, ended)], call.upstream_request_id


def _end(translator: StreamTranslator, ended: bool) -> list[Delta] | str:
    """The deltas held to the end (usage, finish), as the adapter's ``finish`` asks for them."""
    try:
        if isinstance(translator, ChatStreamTranslator):
            return translator.end(done=ended)
        return translator.end()
    except UpstreamError as exc:
        return str(exc)


def _summary(reads: Reads) -> tuple[Any, ...]:
    """What merging keeps: the text with its logprobs, each call's arguments, usage, finish, error."""
    deltas = [d for r in reads if isinstance(r, list) for d in r]
    texts = [d for d in deltas if isinstance(d, TextDelta)]
    args: dict[int | str, str] = {}
    for d in deltas:
        if isinstance(d, ToolCallArgsDelta):
            args[d.key] = args.get(d.key, "") + d.delta
    return (
        "".join(t.text for t in texts),
        [lp for t in texts for lp in t.logprobs or ()],
        args,
        [d for d in deltas if isinstance(d, Usage | Finish)],
        [r for r in reads if isinstance(r, str)],
    )


def _check(provider: Provider, body: bytes, points: list[int]) -> None:
    chunks = _cut(body, points)
    for merge in (True, False):
        assert _fast(provider, chunks, merge) == _general(provider, chunks, merge)
    # read at once or in pieces, merged or not: the same text, logprobs, arguments, usage, finish
    whole, _ = _fast(provider, [body], True)
    apart, _ = _fast(provider, chunks, False)
    assert _summary(whole) == _summary(apart)


_CUTS = st.lists(st.integers(min_value=0, max_value=20_000), max_size=12)


@settings(max_examples=250, deadline=None)
@given(data=st.data(), points=_CUTS)
def test_openai_chat_fast_paths_match_the_general_path(data: st.DataObject, points: list[int]) -> None:
    _check(_CHAT, data.draw(_streams(_CHAT)), points)


@settings(max_examples=250, deadline=None)
@given(data=st.data(), points=_CUTS)
def test_openai_responses_fast_paths_match_the_general_path(data: st.DataObject, points: list[int]) -> None:
    _check(_RESPONSES, data.draw(_streams(_RESPONSES)), points)


@settings(max_examples=250, deadline=None)
@given(data=st.data(), points=_CUTS)
def test_anthropic_fast_paths_match_the_general_path(data: st.DataObject, points: list[int]) -> None:
    _check(_ANTHROPIC, data.draw(_streams(_ANTHROPIC)), points)


@settings(max_examples=250, deadline=None)
@given(data=st.data(), points=_CUTS)
def test_gemini_fast_paths_match_the_general_path(data: st.DataObject, points: list[int]) -> None:
    _check(_GEMINI, data.draw(_streams(_GEMINI)), points)


# == examples ======================================================================================
def _sse(*datas: str) -> bytes:
    return b"".join(b"data: " + d.encode() + b"\n\n" for d in datas)


def _read_once(provider: Provider, body: bytes, merge: bool = True) -> tuple[Reads, str | None]:
    return _fast(provider, [body], merge)


def test_a_learnt_shape_reads_other_text_and_nothing_else() -> None:
    plain = orjson.dumps(_chat_text("a")).decode()
    shaped = [plain.replace('"a"', f'"{t}"') for t in ("b", "c d", "é😀", "\u00a0")]
    # escapes: the string decoded alone
    escaped = [plain.replace('"a"', raw) for raw in ('"x\\"y"', '"\\n"', '"\\u00e9\\\\"')]
    # the same shape, but text JSON would not take, or that changes the chunk's meaning
    odd = [plain.replace('"a"', raw) for raw in ('"x\ty"', '"x","finish_reason":"length"', '""', '"x\\"')]
    reads, _ = _read_once(_CHAT, _sse(plain, *shaped, *escaped, "[DONE]"))
    assert reads == [[TextDelta('abc dé😀\u00a0x"y\né\\')], [Finish("stop")]]
    for data in odd:
        assert _read_once(_CHAT, _sse(plain, data, "[DONE]")) == _general(
            _CHAT, [_sse(plain, data, "[DONE]")], True
        )
    assert _read_once(_CHAT, _sse(plain, odd[0]))[0] == [
        [TextDelta("a")],
        "The upstream provider sent malformed stream data.",
    ]


def test_malformed_json_mid_read_raises_after_the_deltas_before_it() -> None:
    plain = [orjson.dumps(_chat_text(t)).decode() for t in ("a", "b", "c")]
    body = _sse(plain[0], plain[1], '{"choices": [', plain[2])
    for merge, before in ((True, [TextDelta("ab")]), (False, [TextDelta("a"), TextDelta("b")])):
        reads, _ = _read_once(_CHAT, body, merge)
        assert reads == [before, "The upstream provider sent malformed stream data."]


def test_without_merging_each_event_is_its_own_delta() -> None:
    body = _sse(*[orjson.dumps(_chat_text(t)).decode() for t in "abcd"])
    reads, _ = _read_once(_CHAT, body, merge=False)
    assert reads[0] == [TextDelta(t) for t in "abcd"]


def test_the_first_chunk_names_the_call_id() -> None:
    body = b"".join(b"data: " + orjson.dumps(_gemini_text(t)) + b"\r\n\r\n" for t in ("a", "b"))
    reads, upstream_id = _read_once(_GEMINI, body)
    assert reads[:2] == [[TextDelta("ab")], []] and upstream_id == "resp-1"


def test_a_chunk_of_another_shape_ends_the_learnt_one() -> None:
    """A Gemini chunk's usage is part of its shape: a text chunk read by the shape of one before
    another chunk's usage must not leave that other usage standing."""
    one, two = _gemini_text("a", 1), _gemini_text("b", 2, thought=True)
    last = {"candidates": [{"content": {"parts": []}, "finishReason": "STOP", "index": 0}]}
    body = b"".join(b"data: " + orjson.dumps(c) + b"\r\n\r\n" for c in (one, two, _gemini_text("c", 1), last))
    reads, _ = _read_once(_GEMINI, body)
    assert reads == _general(_GEMINI, [body], True)[0]
    translator = GeminiStreamTranslator()
    EventReader(translator, UpstreamCall("test", None), done_marker=False, named=False, merge=True).read(
        body, []
    )
    assert translator.end()[0] == Usage(input_tokens=9, output_tokens=1)
