"""The shell every HTTP provider adapter shares: the pooled client, the request headers, one POST
per generation, and the loop that JSON-decodes each server-sent event into the provider's pure
stream translator (an unstreamed JSON reply goes to it whole). A provider states only what
differs: its URL, auth headers, body and translator.

Every call sends the request's id as ``X-Request-Id`` (and, with tracing on, the attempt's span as
``traceparent``) and ends with one ``upstream_call`` log line
(``adapters.transport.UpstreamCall``) naming the provider's own id for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

import orjson

from adapters.base import UpstreamRequest
from adapters.deltas import (
    Delta,
    ReasoningDelta,
    ReasoningSummaryDelta,
    RefusalDelta,
    TextDelta,
    ToolCallArgsDelta,
)
from adapters.sse import SSEDecodeError, SSEDecoder
from adapters.transport import UpstreamCall, UpstreamClient, open_stream
from gateway.kernel.errors import UpstreamError
from gateway.kernel.ids import safe_id
from gateway.kernel.settings import ProviderSettings

__all__ = ["EventReader", "HTTPStreamAdapter", "StreamTranslator", "json_object", "merge_ready"]


def one_per_name(*layers: Mapping[str, str]) -> dict[str, str]:
    """Request headers from ``layers``, a later one's value replacing an earlier one's under the
    same name in any case (a config ``headers: {Authorization: …}`` replaces the provider's
    ``authorization``), so that no header is sent twice."""
    merged: dict[str, str] = {}
    for layer in layers:
        for name, value in layer.items():
            merged[name.lower()] = value
    return merged


class StreamTranslator(Protocol):
    """A provider's pure stream translator (``adapters/*/stream.py``)."""

    @property
    def done(self) -> bool:
        """The provider's terminal event was seen: nothing more will come (always False for
        providers whose stream has no terminal event)."""
        ...

    def feed(self, chunk: dict[str, Any], /) -> list[Delta]: ...

    def deltas_or_text(self, chunk: dict[str, Any], /) -> list[Delta] | str:
        """What :meth:`feed` does, but a chunk of the translator's plain-text shape gives its text
        alone (for ``feed``, ``[TextDelta(text)]``). The shape is such that the same chunk with
        other text would give that text and leave the translator as this one did (the stream
        loop reads such chunks' text straight from their JSON: ``EventReader``)."""
        ...

    def end(self) -> list[Delta]: ...


T = TypeVar("T", bound=StreamTranslator)

# A body field naming the provider's id for the call, where no header does (Gemini's responseId).
_BODY_ID = "responseId"


class HTTPStreamAdapter(Generic[T]):
    """One ``POST`` per generation; yields the translator's deltas.

    ``client`` lets a caller share or inject an :class:`UpstreamClient`; by default the adapter owns
    one pooled client (closed by :meth:`aclose`). A subclass sets ``path`` (or overrides
    :meth:`url`) and implements :meth:`body`, :meth:`translator` and :meth:`unstreamed_deltas`;
    ``body()`` and ``url()`` ask for an unstreamed reply when ``request.stream`` is False. The
    class flags and the remaining hooks cover what only some providers do.
    """

    path: ClassVar[str] = ""  # appended to the base URL
    done_marker: ClassVar[bool] = False  # ``data: [DONE]`` ends the stream (OpenAI's convention)
    named_events: ClassVar[bool] = False  # data without a "type" takes the SSE event name

    def __init__(self, settings: ProviderSettings, *, client: UpstreamClient | None = None) -> None:
        self.settings = settings
        self._client = client if client is not None else UpstreamClient(settings)
        self._owns_client = client is None
        self._base = settings.resolved_base_url()
        self._url = self._base + self.path
        fixed = (self.provider_headers(settings.resolved_api_key()), settings.headers)
        self._headers = one_per_name({"accept": "text/event-stream"}, *fixed)
        self._json_headers = one_per_name({"accept": "application/json"}, *fixed)
        # temperature/top_p at the spec's 1.0 sent or not (ProviderSettings.sends_default_sampling)
        self.send_defaults = settings.sends_default_sampling()

    # -- what a provider states --------------------------------------------------------------
    def provider_headers(self, key: str | None) -> dict[str, str]:
        """Auth (and any other provider-fixed) headers; the default is a bearer token."""
        return {"authorization": f"Bearer {key}"} if key else {}

    def request_headers(self, request: UpstreamRequest) -> dict[str, str] | None:
        """Headers of this request's own, beside the fixed ones (None: none)."""
        return None

    def url(self, request: UpstreamRequest) -> str:
        return self._url

    def body(self, request: UpstreamRequest) -> Mapping[str, Any]:
        """The JSON request body (a subclass returns its provider's request TypedDict)."""
        raise NotImplementedError

    def translator(self) -> T:
        raise NotImplementedError

    def unstreamed_deltas(self, translator: T, body: Any) -> Iterable[Delta]:
        """All deltas (the final ones too) of a 200 JSON body: the answer to an unstreamed request,
        or a server that ignored ``stream``."""
        raise NotImplementedError

    def finish(self, translator: T, ended: bool) -> list[Delta]:
        """The deltas held to the end. ``ended``: the stream said it was over ([DONE] or a
        terminal event) rather than just stopping."""
        return translator.end()

    # -- the shell -----------------------------------------------------------------------------
    async def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
        """Send ``request``; yield its deltas. Raises ``UpstreamError`` (and subclasses)."""
        translator = self.translator()
        streamed = request.stream
        headers = self._headers if streamed else self._json_headers
        if (request_id := safe_id(request.request_id)) is not None:
            headers = {**headers, "x-request-id": request_id}
        if request.trace_headers:
            headers = {**headers, **request.trace_headers}
        if (own := self.request_headers(request)) is not None:
            headers = {**headers, **own}
        call = UpstreamCall(self.settings.kind, request.request_id)
        try:
            async with open_stream(
                self._client,
                "POST",
                self.url(request),
                json_body=self.body(request),
                headers=headers,
                total_timeout=request.seconds_left(self.settings.timeouts.total),
                streamed=streamed,
                call=call,
            ) as upstream:
                if upstream.headers.get("content-type", "").startswith("application/json"):
                    body = await upstream.read_json()
                    call.body_id(body.get(_BODY_ID) if isinstance(body, dict) else None)
                    for delta in self.unstreamed_deltas(translator, body):
                        yield delta
                    return
                reader = EventReader(
                    translator,
                    call,
                    done_marker=self.done_marker,
                    named=self.named_events,
                    merge=self.settings.merge_deltas,
                )
                # One upstream read at a time: its events are decoded into ``ready`` before any is
                # yielded, so that deltas that arrived together can go out as one (``merge_ready``).
                # Nothing waits for more input: the read's deltas are all yielded before the next read.
                while not reader.ended:
                    chunk = await upstream.next_chunk()
                    ready: list[Delta] = []
                    try:
                        reader.read(chunk, ready)
                    except Exception:
                        # what came before the failing event still goes out first, as it arrived
                        for delta in ready:
                            yield delta
                        raise
                    for delta in ready:
                        yield delta
                    if chunk is None:
                        break
                ended = reader.ended
                if ended:
                    await upstream.drain()  # the body's end is normally right behind: reuse the socket
            for delta in self.finish(translator, ended):
                yield delta
        except UpstreamError as exc:
            call.failed(exc)
            raise
        finally:
            call.log()

    async def aclose(self) -> None:
        """Close the connection pool (when the adapter owns it)."""
        if self._owns_client:
            await self._client.aclose()


class EventReader:
    """The decoding of one stream: each upstream read's events → the translator's deltas.

    The usual event is one more piece of text in the same shape as the last (the same JSON but
    for the text): after a plain-text chunk was parsed, the next chunks that are its JSON with
    only the text's characters changed are read without parsing, as ``prefix + text + suffix``
    (see :meth:`_learn`), until a chunk of another shape comes. With ``merge_deltas`` the texts
    of a run are joined at once; without, each is its own ``TextDelta``, as the translator would
    give.
    """

    __slots__ = (
        "_call",
        "_decoder",
        "_done_marker",
        "_learn_left",
        "_merge",
        "_named",
        "_need_id",
        "_prefix",
        "_shape",
        "_suffix",
        "_translator",
        "ended",
    )

    def __init__(
        self, translator: StreamTranslator, call: UpstreamCall, *, done_marker: bool, named: bool, merge: bool
    ) -> None:
        self._translator = translator
        self._call = call
        self._decoder = SSEDecoder()
        self._done_marker = done_marker  # ``data: [DONE]`` ends the stream
        self._named = named  # data without a "type" takes the SSE event name
        self._merge = merge
        self._need_id = call.upstream_request_id is None
        self._prefix: str | None = None  # the raw JSON around the text of the last plain-text chunk
        self._suffix = ""
        self._shape = ("", "")  # the last shape learnt, (prefix, suffix)
        self._learn_left = 8  # new shapes to learn: a stream whose chunks differ in more than text stops soon
        self.ended = False  # [DONE] or the translator's terminal event was seen

    def read(self, chunk: bytes | None, out: list[Delta]) -> None:
        """Decode one upstream read (None: the body ended) into ``out``, merged when merging is
        on. Raises ``UpstreamError`` for bad data; ``out`` then holds the events' before it."""
        decoder = self._decoder
        names: list[str | None] | list[str] | None = None
        # the usual read, whole events only: their data (and, for named events, names)
        fast = decoder.feed_data(chunk, named=self._named) if chunk is not None else None
        if fast is not None:
            datas, names = fast
        else:
            try:
                events = decoder.feed(chunk) if chunk is not None else decoder.flush()
            except SSEDecodeError:
                raise UpstreamError("The upstream provider sent an oversized stream event.") from None
            datas = [e.data for e in events]
            if self._named:
                names = [e.event for e in events]
        translator = self._translator
        merge = self._merge
        prefix = self._prefix
        suffix = self._suffix
        start = len(prefix) if prefix is not None else 0
        cut = -len(suffix)  # a suffix begins with the text's closing quote: never empty
        texts: list[str] = []  # a run of plain text not yet in ``out`` (merging)
        try:
            for index, data in enumerate(datas):
                if prefix is not None and data.startswith(prefix) and data.endswith(suffix):
                    text = data[start:cut]
                    # No quote, backslash or control character: the same JSON, other text. Else,
                    # if it is one JSON string's inside (escapes...), the same JSON, that string.
                    if '"' in text or "\\" in text or not text.isprintable():
                        try:
                            text = orjson.loads('"' + text + '"')
                        except orjson.JSONDecodeError:
                            text = ""  # not one string: the JSON is another (or none)
                    if text:
                        if merge:
                            texts.append(text)
                        else:
                            out.append(TextDelta(text))
                        continue
                if not data:
                    continue
                if self._done_marker and data == "[DONE]":
                    self.ended = True
                    break
                try:
                    parsed = orjson.loads(data)
                except orjson.JSONDecodeError:
                    raise UpstreamError("The upstream provider sent malformed stream data.") from None
                if type(parsed) is not dict:
                    continue
                if self._need_id:  # the first chunk, for a provider that names its id there
                    self._need_id = False
                    self._call.body_id(parsed.get(_BODY_ID))
                typed = names is None or "type" in parsed
                if not typed and names[index]:  # type: ignore[index]
                    parsed["type"] = names[index]  # type: ignore[index]
                got = translator.deltas_or_text(parsed)
                # The shape to read the next chunks by is this chunk's, or none: a chunk read by
                # it does to the translator what the chunk it was learnt from did, so that must
                # be the last chunk fed (a Gemini chunk's usage is in its shape).
                if type(got) is str and typed:
                    prefix = self._learn(data, got)
                    suffix = self._suffix
                    start = len(prefix) if prefix is not None else 0
                    cut = -len(suffix)
                elif prefix is not None:
                    prefix = self._prefix = None
                if type(got) is str:
                    if merge:
                        texts.append(got)
                    else:
                        out.append(TextDelta(got))
                    continue
                if texts:
                    out.append(TextDelta("".join(texts)))
                    texts = []
                out += got  # type: ignore[arg-type]
                if translator.done:
                    self.ended = True
                    break
        finally:
            if texts:
                out.append(TextDelta("".join(texts)))
            if merge and len(out) > 1:
                out[:] = merge_ready(out)

    def _learn(self, data: str, text: str) -> str | None:
        """Take ``data`` (a plain-text chunk's JSON, carrying ``text``) as the shape of the next;
        the prefix before their text, or None when ``data`` cannot be one.

        Only JSON without backslashes: then every quote is a string's, and the text's one
        ``"text"`` in it is that string (were it also elsewhere, no shape is learnt). Anything
        else there that is a JSON string's inside (``orjson.loads('"' + it + '"')`` takes it)
        gives the same JSON but for that string, and so the same chunk but for its text: as the
        translator's ``deltas_or_text`` defines its plain-text shape, that text (when not empty)
        with the same effect on the translator."""
        self._prefix = None
        shape = self._shape
        if not self._learn_left and not (data.startswith(shape[0]) and data.endswith(shape[1])):
            return None  # no new shapes: this stream's chunks differ in more than their text
        if "\\" in data:
            return None
        quoted = '"' + text + '"'
        at = data.find(quoted)
        if at < 0 or at != data.rfind(quoted):
            return None
        prefix = data[: at + 1]
        suffix = data[at + 1 + len(text) :]
        if prefix != shape[0] or suffix != shape[1]:  # the same again (after a "\n" in the text...) is free
            self._learn_left -= 1
            self._shape = (prefix, suffix)
        self._prefix = prefix
        self._suffix = suffix
        return prefix


def json_object(body: Any) -> dict[str, Any]:
    """``body`` if it is a JSON object; ``UpstreamError`` otherwise."""
    if not isinstance(body, dict):
        raise UpstreamError("The upstream provider sent a malformed response.")
    return body


def merge_ready(deltas: list[Delta]) -> list[Delta]:
    """``deltas`` (all already decoded, from one upstream read) with each run of adjacent pieces of
    the same text merged into one delta: text (logprobs concatenated in order), refusal, reasoning,
    a reasoning summary part's text (same ``part``), one tool call's arguments (same ``key``). Any
    other delta ends a run. The concatenated text and logprobs are exactly the pieces'."""
    if len(deltas) < 2:
        return deltas
    out: list[Delta] = []
    run: list[Delta] = []  # adjacent pieces that merge with one another
    for d in deltas:
        if run:
            head = run[0]
            kind = type(d)
            # text (the usual delta) always continues a text run: no _joins call for it
            if kind is type(head) and (kind is TextDelta or _joins(head, d)):
                run.append(d)
                continue
            out.append(_merged(run))
            run = []
        if type(d) in _MERGEABLE:
            run.append(d)
        else:
            out.append(d)
    if run:
        out.append(_merged(run))
    return out


_MERGEABLE = (TextDelta, RefusalDelta, ReasoningDelta, ReasoningSummaryDelta, ToolCallArgsDelta)


def _joins(head: Delta, d: Delta) -> bool:
    """Whether ``d`` continues the run that ``head`` (of the same type) began."""
    if isinstance(head, ToolCallArgsDelta):
        return head.key == d.key  # type: ignore[union-attr]
    if isinstance(head, ReasoningSummaryDelta):
        return head.part == d.part  # type: ignore[union-attr]
    return True


def _merged(run: list[Delta]) -> Delta:
    head = run[0]
    if len(run) == 1:
        return head
    if isinstance(head, TextDelta):
        texts = cast(list[TextDelta], run)
        logprobs = [lp for t in texts if t.logprobs for lp in t.logprobs]
        return TextDelta("".join(t.text for t in texts), logprobs or None)
    if isinstance(head, ToolCallArgsDelta):
        return ToolCallArgsDelta(head.key, "".join(cast(ToolCallArgsDelta, d).delta for d in run))
    if isinstance(head, ReasoningSummaryDelta):
        return ReasoningSummaryDelta("".join(cast(ReasoningSummaryDelta, d).text for d in run), head.part)
    text = "".join(cast(RefusalDelta | ReasoningDelta, d).text for d in run)
    return RefusalDelta(text) if isinstance(head, RefusalDelta) else ReasoningDelta(text)
