"""The SSE decoder: line endings, fields, comments, limits, and any split of the bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.sse import SSEDecodeError, SSEDecoder, SSEEvent


def decode_all(chunks: list[bytes]) -> list[SSEEvent]:
    dec = SSEDecoder()
    out: list[SSEEvent] = []
    for c in chunks:
        out.extend(dec.feed(c))
    out.extend(dec.flush())
    return out


def test_basic_data_events() -> None:
    evs = decode_all([b'data: {"a":1}\n\ndata: [DONE]\n\n'])
    assert [e.data for e in evs] == ['{"a":1}', "[DONE]"]
    assert evs[0].event is None


@pytest.mark.parametrize("nl", [b"\n", b"\r\n", b"\r"])
def test_line_endings(nl: bytes) -> None:
    raw = b"event: delta" + nl + b"data: one" + nl + b"data: two" + nl + nl + b"data: x" + nl + nl
    evs = decode_all([raw])
    assert evs == [SSEEvent("one\ntwo", "delta"), SSEEvent("x")]


def test_comments_unknown_fields_and_no_space() -> None:
    raw = b": keep-alive\n\n: OPENROUTER PROCESSING\nfoo: bar\ndata:no-space\ndata:  two-spaces\n\n"
    assert decode_all([raw]) == [SSEEvent("no-space\n two-spaces")]


def test_field_without_colon_and_empty_data() -> None:
    assert decode_all([b"data\n\n"]) == [SSEEvent("")]
    assert decode_all([b"data:\ndata:\n\n"]) == [SSEEvent("\n")]


def test_event_without_data_is_dispatched() -> None:
    assert decode_all([b"event: ping\n\n"]) == [SSEEvent("", "ping")]


def test_id_persists_and_retry() -> None:
    evs = decode_all([b"id: 7\nretry: 1500\ndata: a\n\ndata: b\n\nretry: x\ndata: c\n\n"])
    assert evs == [SSEEvent("a", None, "7", 1500), SSEEvent("b", None, "7"), SSEEvent("c", None, "7")]


def test_bom_is_stripped_even_split() -> None:
    raw = b"\xef\xbb\xbfdata: hi\n\n"
    assert decode_all([raw]) == [SSEEvent("hi")]
    assert decode_all([raw[:1], raw[1:2], raw[2:3], raw[3:]]) == [SSEEvent("hi")]
    assert decode_all([raw[:3], raw[3:]]) == [SSEEvent("hi")]


def test_crlf_split_between_chunks() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: a\r") == []
    assert dec.feed(b"\n\r") == [SSEEvent("a")]
    assert dec.feed(b"\ndata: b\r\n\r\n") == [SSEEvent("b")]


def test_multibyte_split() -> None:
    raw = "data: héllo 世界 🎉\n\n".encode()
    chunks = [raw[i : i + 1] for i in range(len(raw))]
    assert decode_all(chunks) == [SSEEvent("héllo 世界 🎉")]


def test_flush_dispatches_unterminated_event() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: [DONE]") == []
    assert dec.flush() == [SSEEvent("[DONE]")]
    assert dec.flush() == []


def test_limits() -> None:
    dec = SSEDecoder(max_event_bytes=16)
    with pytest.raises(SSEDecodeError):
        dec.feed(b"data: " + b"x" * 32)
    dec = SSEDecoder(max_event_bytes=16)
    with pytest.raises(SSEDecodeError):
        dec.feed(b"data: 0123456789\ndata: 0123456789\n")


def _reference(raw: bytes) -> list[SSEEvent]:
    """A slow, obviously-correct parse of the whole stream at once."""
    text = raw.decode("utf-8", "replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    events, data, event, last_id, retry, any_field = [], [], None, None, None, False
    for line in lines:
        if line == "":
            if data or any_field:
                events.append(SSEEvent("\n".join(data), event, last_id, retry))
            data, event, retry, any_field = [], None, None, False
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event, any_field = value, True
        elif name == "id" and "\0" not in value:
            last_id, any_field = value, True
        elif name == "retry" and value.isdigit():
            retry, any_field = int(value), True
    if data or any_field:
        events.append(SSEEvent("\n".join(data), event, last_id, retry))
    return events


_line = st.one_of(
    st.text(min_size=0, max_size=12).map(lambda t: "data: " + t),
    st.text(min_size=0, max_size=12).map(lambda t: "data:" + t),
    st.sampled_from(["event: delta", "event: ping", ": comment", "id: 3", "retry: 10", "", "", "data"]),
).map(lambda s: s.replace("\r", "").replace("\n", ""))
_nl = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def _streams(draw: st.DrawFn) -> bytes:
    parts = draw(st.lists(st.tuples(_line, _nl), max_size=25))
    return "".join(line + nl for line, nl in parts).encode()


@settings(max_examples=200, deadline=None)
@given(raw=_streams(), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_any_split_yields_same_events(raw: bytes, cuts: list[int]) -> None:
    whole = decode_all([raw])
    assert whole == _reference(raw)
    points = sorted({c % (len(raw) + 1) for c in cuts})
    chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert decode_all(chunks) == whole
    assert decode_all([raw[i : i + 1] for i in range(len(raw))]) == whole


@st.composite
def _lf_streams(draw: st.DrawFn) -> bytes:
    parts = draw(st.lists(_line, max_size=40))
    return "".join(line + "\n" for line in parts).encode()


@settings(max_examples=300, deadline=None)
@given(raw=_lf_streams(), cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=12))
def test_lf_streams_any_split_yields_same_events(raw: bytes, cuts: list[int]) -> None:
    """LF-only streams (the decoder's whole-events fast path) against the reference, at any split."""
    whole = decode_all([raw])
    assert whole == _reference(raw)
    points = sorted({c % (len(raw) + 1) for c in cuts})
    chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert decode_all(chunks) == whole
