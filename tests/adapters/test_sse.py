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
    data: list[str] = []
    events, event, last_id, retry, any_field = [], None, None, None, False
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


def _data_first(chunks: list[bytes], max_event_bytes: int = 16 * 1024 * 1024) -> list[tuple[str, str | None]]:
    """What the streaming shell sees: ``feed_data`` tried first on every chunk, ``feed`` when it
    declines; (data, event name) per event."""
    dec = SSEDecoder(max_event_bytes=max_event_bytes)
    out: list[tuple[str, str | None]] = []
    for c in chunks:
        fast = dec.feed_data(c, named=True)
        if fast is None:
            out += [(e.data, e.event) for e in dec.feed(c)]
        else:
            datas, names = fast
            labels: list[str | None] = list(names) if names else [None] * len(datas)
            out += zip(datas, labels, strict=True)
    out += [(e.data, e.event) for e in dec.flush()]
    return out


_raw_data = st.binary(max_size=10).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b""))


@st.composite
def _mixed_streams(draw: st.DrawFn) -> bytes:
    """Mostly one-line ``data: `` events (any bytes, invalid UTF-8 included), some other lines."""
    other = st.sampled_from(
        [b"event: ping\n", b": c\n", b"id: 7\n", b"\n", b"data:x\n", b"data: a\nb\n", b"event:\n", b"\r"]
    )
    data = _raw_data.map(lambda d: b"data: " + d + b"\n\n")
    named = st.tuples(_raw_data, _raw_data).map(lambda p: b"event: " + p[0] + b"\ndata: " + p[1] + b"\n\n")
    parts = draw(st.lists(st.one_of(data, named, other), max_size=30))
    raw = b"".join(parts)
    return raw.replace(b"\n", b"\r\n") if draw(st.booleans()) else raw  # CRLF endings, as Gemini's


@settings(max_examples=300, deadline=None)
@given(raw=_mixed_streams(), cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=8))
def test_feed_data_matches_feed(raw: bytes, cuts: list[int]) -> None:
    """The data-only fast path gives exactly the events' data ``feed`` gives, at any split."""
    points = sorted({c % (len(raw) + 1) for c in cuts})
    chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    expected = [(e.data, e.event) for e in decode_all(chunks)]
    assert _data_first(chunks) == expected
    assert _data_first([raw]) == [(e.data, e.event) for e in decode_all([raw])]


def test_feed_data_takes_whole_data_events_only() -> None:
    dec = SSEDecoder()
    assert dec.feed_data(b'data: {"a":1}\n\ndata: \xe2\x82\n\ndata: [DONE]\n\n') == (
        ['{"a":1}', "\ufffd", "[DONE]"],
        None,
    )
    assert dec.feed_data(b"data: a\r\n\r\ndata: b\r\n\r\n") == (["a", "b"], None)
    named = b"event: x\ndata: a\n\nevent: \ndata: b\n\n"
    assert dec.feed_data(named) == (["a", "b"], None)
    assert dec.feed_data(named, named=True) == (["a", "b"], ["x", ""])
    for declined in (
        b"data: a\n\ndata: b",  # an event half-read
        b"data: a\n\n\n\ndata: b\n\n",  # an extra blank line
        b"data: a\nb\n\n",  # a second line
        b"data: a\n\n\ndata: b\n\n",  # three LFs between events
        b"data: a\ndata: b\n\n",  # two data lines in one event
        b"data: a\n\ndata: b\n\ndata: c\nd\n\n",  # a second line in the last of several
        b"event: x\ndata: a\nid: 1\n\n",
        b"data: a\nevent: x\n\n",
        b"event: x\n\ndata: a\n\n",
        b"event: x\ndata: a\n\ndata: b\n\n",  # an event without a name among named ones
        b"data: a\r\n\r",  # a CR that may begin a CRLF
        b"data: a\r\rdata: b\n\n",  # CR endings
        b"\xef\xbb\xbfdata: a\n\n",  # a BOM
        b"data:a\n\n",
    ):
        assert SSEDecoder().feed_data(declined) is None, declined
    assert SSEDecoder(max_event_bytes=8).feed_data(b"data: 0123456789\n\n") is None
    half = SSEDecoder()
    assert half.feed(b"data: a") == []
    assert half.feed_data(b"\n\ndata: b\n\n") is None  # the half-read line comes first
