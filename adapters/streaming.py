"""The shell every HTTP provider adapter shares: the pooled client, the request headers, one POST
per generation, and the loop that JSON-decodes each server-sent event into the provider's pure
stream translator (an unstreamed JSON reply goes to it whole). A provider states only what
differs: its URL, auth headers, body and translator.

Every call sends the request's id as ``X-Request-Id`` (and, with tracing on, the attempt's span as
``traceparent``) and ends with one ``upstream_call`` log line
(``adapters.transport.UpstreamCall``) naming the provider's own id for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
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

__all__ = ["HTTPStreamAdapter", "StreamTranslator", "json_object", "merge_ready"]


class StreamTranslator(Protocol):
    """A provider's pure stream translator (``adapters/*/stream.py``)."""

    @property
    def done(self) -> bool:
        """The provider's terminal event was seen: nothing more will come (always False for
        providers whose stream has no terminal event)."""
        ...

    def feed(self, chunk: dict[str, Any], /) -> list[Delta]: ...

    def end(self) -> list[Delta]: ...


T = TypeVar("T", bound=StreamTranslator)

# A body field naming the provider's id for the call, where no header does (Gemini's responseId).
_BODY_ID = "responseId"


class HTTPStreamAdapter(Generic[T]):
    """One ``POST`` per generation; yields the translator's deltas.

    ``client`` lets a caller share or inject an :class:`UpstreamClient`; by default the adapter owns
    one pooled client (closed by :meth:`aclose`). A subclass sets ``path`` (or overrides
    :meth:`url`) and implements :meth:`body`, :meth:`translator` and :meth:`whole`; ``body()``
    and ``url()`` ask for an unstreamed reply when ``request.stream`` is False. The class flags and
    the remaining hooks cover what only some providers do.
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
        fixed = {**self.provider_headers(settings.resolved_api_key()), **settings.headers}
        self._headers = {"accept": "text/event-stream", **fixed}
        self._json_headers = {"accept": "application/json", **fixed}

    # -- what a provider states --------------------------------------------------------------
    def provider_headers(self, key: str | None) -> dict[str, str]:
        """Auth (and any other provider-fixed) headers; the default is a bearer token."""
        return {"authorization": f"Bearer {key}"} if key else {}

    def url(self, request: UpstreamRequest) -> str:
        return self._url

    def body(self, request: UpstreamRequest) -> dict[str, Any]:
        raise NotImplementedError

    def translator(self) -> T:
        raise NotImplementedError

    def whole(self, translator: T, body: Any) -> Iterable[Delta]:
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
                    for delta in self.whole(translator, body):
                        yield delta
                    return
                ended = False
                feed = translator.feed
                done_marker = self.done_marker
                named_events = self.named_events
                need_id = call.upstream_request_id is None
                merge = self.settings.merge_deltas
                decoder = SSEDecoder()
                # One upstream read at a time: its events are decoded into ``ready`` before any is
                # yielded, so that deltas that arrived together can go out as one (``merge_ready``).
                # Nothing waits for more input: the read's deltas are all yielded before the next read.
                while not ended:
                    chunk = await upstream.next_chunk()
                    # the usual read, whole "data: " events only: their data alone (names None)
                    datas = decoder.feed_data(chunk) if chunk is not None else None
                    names: list[str | None] | None = None
                    if datas is None:
                        try:
                            events = decoder.feed(chunk) if chunk is not None else decoder.flush()
                        except SSEDecodeError:
                            raise UpstreamError(
                                "The upstream provider sent an oversized stream event."
                            ) from None
                        datas = [e.data for e in events]
                        if named_events:
                            names = [e.event for e in events]
                    ready: list[Delta] = []
                    try:
                        for index, data in enumerate(datas):
                            if not data:
                                continue
                            if done_marker and data == "[DONE]":
                                ended = True
                                break
                            try:
                                parsed = orjson.loads(data)
                            except orjson.JSONDecodeError:
                                raise UpstreamError(
                                    "The upstream provider sent malformed stream data."
                                ) from None
                            if not isinstance(parsed, dict):
                                continue
                            if need_id:  # the first chunk, for a provider that names its id there
                                need_id = False
                                call.body_id(parsed.get(_BODY_ID))
                            if names is not None and "type" not in parsed and names[index]:
                                parsed["type"] = names[index]
                            ready += feed(parsed)
                            if translator.done:
                                ended = True
                                break
                    except Exception:
                        # what came before the failing event still goes out first, as it arrived
                        for delta in merge_ready(ready) if merge else ready:
                            yield delta
                        raise
                    for delta in merge_ready(ready) if merge else ready:
                        yield delta
                    if chunk is None:
                        break
                if ended:
                    await upstream.drain()  # the body's end is normally right behind: reuse the socket
            for delta in self.finish(translator, ended):
                yield delta
        except UpstreamError as exc:
            call.error_code = exc.code
            raise
        finally:
            call.log()

    async def aclose(self) -> None:
        """Close the connection pool (when the adapter owns it)."""
        if self._owns_client:
            await self._client.aclose()


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
