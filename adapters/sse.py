"""Incremental Server-Sent Events decoder: bytes in, whole events out.

Chunk boundaries may fall anywhere (mid-line, mid-``\\r\\n``, mid-UTF-8 character); lines end
with CRLF, LF or CR, as the WHATWG event-stream grammar allows.
"""

from __future__ import annotations

from itertools import repeat
from typing import NamedTuple

__all__ = ["SSEDecodeError", "SSEDecoder", "SSEEvent"]

_CR = 13  # b"\r"[0]
_LF = 10
_COLON = 58
_BOM = b"\xef\xbb\xbf"
_new_event = tuple.__new__


class SSEDecodeError(ValueError):
    """The stream broke a decoder limit (an unbounded line or event)."""


class SSEEvent(NamedTuple):
    """One dispatched event. ``event`` is None when the stream gave no ``event:`` field.
    (A NamedTuple: one is made per upstream event, and a tuple is the cheapest to make.)"""

    data: str
    event: str | None = None
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Feed raw bytes with :meth:`feed`, get complete events; call :meth:`flush` at end of stream.

    An event is dispatched on a blank line when it has data or an ``event:``/``id:``/``retry:``
    field (like openai-python). ``max_event_bytes`` bounds one line and one event's data so a
    misbehaving upstream cannot grow the buffer without limit.
    """

    __slots__ = (
        "_buf",
        "_buf_size",
        "_data",
        "_data_size",
        "_event",
        "_id",
        "_last_id",
        "_max",
        "_midway",
        "_retry",
        "_skip_lf",
        "_started",
    )

    def __init__(self, *, max_event_bytes: int = 16 * 1024 * 1024) -> None:
        self._max = max_event_bytes
        self._buf: list[bytes] = []  # pieces of an unterminated line
        self._buf_size = 0
        self._skip_lf = False  # the previous chunk ended with "\r": a leading "\n" belongs to it
        self._started = False  # the BOM check has run
        self._data: list[bytes] = []
        self._data_size = 0
        self._event: str | None = None
        self._id: str | None = None  # set by this event's "id:" field
        self._last_id: str | None = None  # the last-event-id buffer; persists across events
        self._retry: int | None = None
        self._midway = False  # a line or an event is half-read (or not known not to be)

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode ``chunk``; return the events it completes (often none or one)."""
        self._midway = True  # until known otherwise, as when a limit is broken
        events = self._feed(chunk)
        self._midway = bool(
            self._buf
            or self._skip_lf
            or self._data
            or self._event is not None
            or self._id is not None
            or self._retry is not None
        )
        return events

    def _feed(self, chunk: bytes) -> list[SSEEvent]:
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == _LF:
                chunk = chunk[1:]
                if not chunk:
                    return []
        if self._buf:
            if b"\n" not in chunk and b"\r" not in chunk:
                self._buf.append(chunk)  # still one unterminated line: no re-scan, no copy
                self._buf_size += len(chunk)
                if self._buf_size > self._max:
                    raise SSEDecodeError("server-sent event line exceeds the size limit")
                return []
            self._buf.append(chunk)
            data = b"".join(self._buf)
            self._buf = []
            self._buf_size = 0
        else:
            data = chunk
        if not self._started:
            if len(data) < 3 and _BOM.startswith(data):
                self._buf = [data]  # maybe a BOM split across chunks
                self._buf_size = len(data)
                return []
            self._started = True
            if data.startswith(_BOM):
                data = data[3:]
                if not data:
                    return []
        events: list[SSEEvent] = []
        if (
            b"\r" not in data
            and not self._data
            and self._event is None
            and self._id is None
            and self._retry is None
        ):
            # The common stream (LF endings, no event half-read): whole events are the blocks
            # before the last blank line; each lone "data: " line is an event at once.
            blocks = data.split(b"\n\n")
            data = blocks.pop()  # after the last blank line: the start of the next event, if any
            limit = self._max
            last_id = self._last_id
            append = events.append
            for block in blocks:
                if block.startswith(b"data: ") and b"\n" not in block:
                    if len(block) > limit:
                        raise SSEDecodeError("server-sent event data exceeds the size limit")
                    # SSEEvent(data, None, last_id, None), without NamedTuple's Python-level __new__
                    append(_new_event(SSEEvent, (block[6:].decode("utf-8", "replace"), None, last_id, None)))
                elif block:
                    if len(block) > limit:
                        raise SSEDecodeError("server-sent event data exceeds the size limit")
                    self._block(block, events)
                    last_id = self._last_id
            if not data:
                return events
        last = data[-1]
        lines = data.splitlines()  # bytes.splitlines splits on \r\n, \n and \r only
        if last == _CR:
            self._skip_lf = True
        elif last != _LF:
            tail = lines.pop()
            if len(tail) > self._max:
                raise SSEDecodeError("server-sent event line exceeds the size limit")
            self._buf = [tail]
            self._buf_size = len(tail)
        for line in lines:
            if not line:
                ev = self._dispatch()
                if ev is not None:
                    events.append(ev)
            elif line[:6] == b"data: " and not self._data:
                # the per-event hot path (one "data: " line per event): what _field does for it
                value = line[6:]
                self._data_size = size = len(value) + 1
                if size > self._max:
                    raise SSEDecodeError("server-sent event data exceeds the size limit")
                self._data.append(value)
            else:
                self._field(line)
        return events

    def feed_data(self, chunk: bytes, *, named: bool = False) -> tuple[list[str], list[str] | None] | None:
        """The events in ``chunk`` when it is nothing but whole two-field events (each one
        ``data: `` line, after one ``event: `` line or none; LF or CRLF endings) and no event is
        half-read: what :meth:`feed` would return, as the events' ``data`` and, with ``named``
        and ``event: `` lines, their names (each event has the stream's last id). None
        otherwise, with nothing consumed: call :meth:`feed` with the same chunk."""
        # the usual upstream read (issue 14): a few passes of C-level counting and one decode and
        # split, instead of a check, a slice, a decode and an event per event
        if self._midway or len(chunk) > self._max:
            return None
        if b"\r" in chunk:
            # CRLF endings (Gemini): the same lines as with LF endings, if no CR stands alone
            if chunk.count(b"\r") != chunk.count(b"\r\n"):
                return None
            chunk = chunk.replace(b"\r\n", b"\n")
        if not chunk.endswith(b"\n\n"):
            return None
        if chunk.startswith(b"data: "):  # also: no BOM
            if chunk.find(b"\n") == len(chunk) - 2:  # one event (the usual read)
                self._started = True
                return [chunk[6:-2].decode("utf-8", "replace")], None
            # UTF-8 errors are replaced per maximal invalid subpart, and the LFs between events
            # are ASCII: decoding the whole read gives each event's text as decoding it alone would.
            # Blocks of one "data: " line each: split at "\n\ndata: ", no piece holds another LF
            # (a "\n\n\n" or a second line would leave one). One split and a scan of the pieces
            # cost a third of counting the read's LFs in C three times (issue 14).
            datas = chunk[6:-2].decode("utf-8", "replace").split("\n\ndata: ")
            for data in datas:
                if "\n" in data:
                    return None
            self._started = True
            return datas, None
        if not chunk.startswith(b"event: "):
            return None
        first = chunk.find(b"\n")
        if chunk.find(b"\n", first + 1) == len(chunk) - 2 and chunk.startswith(b"data: ", first + 1):
            self._started = True  # one named event (the usual read)
            data = chunk[first + 7 : -2].decode("utf-8", "replace")
            return [data], [chunk[7:first].decode("utf-8", "replace")] if named else None
        # "event: X\ndata: Y\n\n" blocks (Anthropic, Responses): lines in threes, the third empty
        lines = chunk[:-1].decode("utf-8", "replace").split("\n")
        if len(lines) % 3:
            return None
        names = lines[0::3]
        datas = lines[1::3]
        if (
            any(lines[2::3])
            or not all(map(str.startswith, names, repeat("event: ")))
            or not all(map(str.startswith, datas, repeat("data: ")))
        ):
            return None
        self._started = True
        return [d[6:] for d in datas], [e[7:] for e in names] if named else None

    def flush(self) -> list[SSEEvent]:
        """End of stream: treat an unterminated last line and event as complete (lenient)."""
        events: list[SSEEvent] = []
        if self._buf:
            line = b"".join(self._buf)
            self._buf = []
            self._buf_size = 0
            if not self._started:
                self._started = True
                if line.startswith(_BOM):
                    line = line[3:]
            if line:
                self._field(line)
        self._skip_lf = False
        ev = self._dispatch()
        if ev is not None:
            events.append(ev)
        self._midway = False
        return events

    # -- internals --------------------------------------------------------------------------
    def _block(self, block: bytes, events: list[SSEEvent]) -> None:
        """A whole event's lines (LF-separated, the blank line that ends it already cut off)."""
        for line in block.split(b"\n"):
            if line:
                self._field(line)
            else:  # a blank line of its own (three or more LFs in a row)
                ev = self._dispatch()
                if ev is not None:
                    events.append(ev)
        ev = self._dispatch()
        if ev is not None:
            events.append(ev)

    def _field(self, line: bytes) -> None:
        if line[0] == _COLON:
            return  # a comment (keep-alive, "OPENROUTER PROCESSING"...)
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data_size += len(value) + 1
            if self._data_size > self._max:
                raise SSEDecodeError("server-sent event data exceeds the size limit")
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id":
            if b"\0" not in value:
                self._id = self._last_id = value.decode("utf-8", "replace")
        elif name == b"retry":
            if value.isdigit():
                self._retry = int(value)
        # other field names are ignored, per the spec

    def _dispatch(self) -> SSEEvent | None:
        data = self._data
        event = self._event
        if not data and event is None and self._id is None and self._retry is None:
            return None
        text = (data[0] if len(data) == 1 else b"\n".join(data)).decode("utf-8", "replace")
        ev = SSEEvent(text, event, self._last_id, self._retry)
        self._data = []
        self._data_size = 0
        if event is not None:
            self._event = None
        self._id = None
        self._retry = None
        return ev
