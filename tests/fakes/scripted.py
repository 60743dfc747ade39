"""The plumbing every fake upstream shares, and what the native-API fakes (openai_responses,
anthropic, gemini) share on top of it.

:class:`FakeUpstream` is the ASGI app: it records each request, picks the queued reply (or a
fallback), answers errors and whole JSON bodies, and streams rendered events in awkward pieces,
hanging up on cue and noticing a client that left. :class:`Transport` holds the fields of a reply
that say how it is delivered. A fake supplies the wire format: ``route`` (path → model), ``check``
(auth and request validation, as the real API would refuse), ``render`` (a reply → its stream
events), ``error_body`` and ``fallback``.

:class:`ScriptedFake` adds a provider-neutral :class:`Reply` script and a default answering policy
(the fake supplies ``ask``: what the request asks for).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Self, TypeVar

import orjson

from adapters.mock.adapter import example_value
from tests.fakes.server import Hangup, LoopbackServer, serve_asgi

__all__ = [
    "Ask",
    "FakeUpstream",
    "Recorded",
    "Reject",
    "Reply",
    "ScriptedFake",
    "Transport",
    "pieces",
    "run_main",
]

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Event = tuple[str | None, dict[str, Any] | str]  # (SSE event name or None, data: JSON, or a str as is)


@dataclass(kw_only=True)
class Transport:
    """How one answer is delivered, whatever it says (the fields every fake's reply shares)."""

    events: list[Event] | None = None  # raw provider events: replaces the rendering
    status: int = 200
    body: bytes | dict[str, Any] | None = None  # the body of a non-2xx answer (None: the usual error)
    headers: dict[str, str] = field(default_factory=dict)
    disconnect_after: int | None = None  # drop the connection after this many events
    delay: float = 0.0  # seconds before the response headers
    chunk_delay: float = 0.0  # seconds between writes
    split: int | None = 7  # bytes per write (None: one write per event)
    line_ending: str | None = None  # None: the provider's usual
    comments: bool = True  # ": keep-alive" comment lines between events

    @classmethod
    def error(
        cls, status: int, body: bytes | dict[str, Any] | None = None, headers: dict[str, str] | None = None
    ) -> Self:
        """A non-2xx answer (body: the provider's usual error object when None)."""
        return cls(status=status, body=body, headers=headers or {})


@dataclass
class Reply(Transport):
    """One scripted answer, in provider-neutral terms (each fake renders it in its wire format)."""

    answer: str | None = None  # the assistant text
    pieces: int = 3  # text and reasoning are streamed in this many deltas
    calls: list[tuple[str, str, str | None]] = field(default_factory=list)  # (name, arguments, call id)
    arg_pieces: int = 3
    reasoning: str | None = None  # thinking / reasoning summary text, before the answer
    signature: str | None = None  # opaque reasoning state (encrypted_content, signature...)
    finish: str | None = None  # "stop" | "length" | "content_filter" | "tool_calls"; None: derived
    usage: tuple[int, int] | None = (11, 7)  # (input, output) tokens
    cached: int = 0
    reasoning_tokens: int = 0
    stream_error: str | None = None  # "overloaded" | "rate_limit" | "server" | "invalid": after the output
    terminal: bool = True  # False: end the body without the provider's terminal event

    # The builders have the openai_chat fake's names, so a test can drive either the same way.
    @classmethod
    def text(cls, text: str = "Hello!", **kw: Any) -> Reply:
        """A text answer (``pieces`` deltas), after optional ``reasoning``."""
        return cls(answer=text, **kw)

    @classmethod
    def tool_calls(
        cls, calls: list[tuple[str, str, str | None]], *, text: str | None = None, **kw: Any
    ) -> Reply:
        """``(name, arguments, call_id)`` calls (call id None: the fake makes one), after optional text."""
        kw.setdefault("usage", (20, 9))
        return cls(answer=text, calls=list(calls), **kw)

    @property
    def finish_reason(self) -> str:
        if self.finish:
            return self.finish
        return "tool_calls" if self.calls else "stop"


def pieces(text: str, n: int) -> list[str]:
    """``text`` cut into about ``n`` pieces (never empty ones)."""
    if not text:
        return []
    size = max(1, -(-len(text) // max(n, 1)))
    return [text[i : i + size] for i in range(0, len(text), size)]


@dataclass
class Recorded:
    """One request the fake received."""

    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-case names
    raw: bytes
    body: Any  # parsed JSON (None if the body was not JSON)
    client: tuple[str, int] | None = None


@dataclass
class Ask:
    """What a request asks for, for the default policy."""

    user_text: str = ""
    tool_result: str | None = None  # the last item answers a tool call with this text
    tools: list[tuple[str, Any]] = field(default_factory=list)  # offered (name, JSON schema)
    forced: str | None = None
    mode: str = "auto"  # auto | none | required
    max_tokens: int | None = None
    reasoning: bool = False
    images: int = 0


class Reject(Exception):
    """Raised by ``check``: answer ``status`` with the provider's error body for ``message``."""

    def __init__(self, status: int, message: str, kind: str = "invalid") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


def default_reply(ask: Ask, input_size: int) -> Reply:
    """Answer a tool result with its text, call the first offered tool, else echo the user text.

    Text is one piece per word; ``max_tokens`` below the word count truncates it and finishes with
    ``length``. Reasoning requested: a short thought with a signature first.
    """
    reasoning = "Let me think about that." if ask.reasoning else None
    signature = f"sig_{os.urandom(6).hex()}" if ask.reasoning else None
    tokens_in = max(1, input_size // 4)
    if ask.tool_result is None and ask.tools and ask.mode != "none":
        by_name = dict(ask.tools)
        name = ask.forced if ask.forced in by_name else ask.tools[0][0]
        args = orjson.dumps(example_value(by_name[name] or {"type": "object"}) or {}).decode()
        return Reply(
            calls=[(name, args, None)], reasoning=reasoning, signature=signature, usage=(tokens_in, 9)
        )
    if ask.tool_result is not None:
        text = f"The tool returned: {ask.tool_result}"
    else:
        text = f"Hello! You said: {ask.user_text}" if ask.user_text else "Hello!"
    words = text.split(" ")
    finish = None
    if ask.max_tokens is not None and len(words) > ask.max_tokens:
        words = words[: ask.max_tokens]
        finish = "length"
    out = " ".join(words)
    return Reply(
        answer=out,
        pieces=len(words),
        finish=finish,
        reasoning=reasoning,
        signature=signature,
        usage=(tokens_in, len(words)),
    )


R = TypeVar("R", bound=Transport)


class FakeUpstream(Generic[R]):
    """The ASGI app plus its script (``replies``) and its record (``requests``, ``disconnects``)."""

    line_ending: ClassVar[str] = "\n"
    named_events: ClassVar[bool] = True  # write "event: <type>" lines
    base_path: ClassVar[str] = ""  # appended to the server URL for ``base_url``

    def __init__(self) -> None:
        self.replies: deque[R] = deque()
        self.default: R | None = None  # what answers when no reply is queued (None: ``fallback``)
        self.requests: list[Recorded] = []
        self.disconnects = 0  # clients that went away before a streamed answer ended
        self.disconnected = asyncio.Event()
        self.streaming = asyncio.Event()  # set once a streamed answer has started
        self.server: LoopbackServer | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def serve(cls) -> AsyncIterator[Self]:
        """Start a fake on a free loopback port for the duration of the block."""
        fake = cls()
        async with serve_asgi(fake) as server:
            fake.server = server
            yield fake

    @property
    def base_url(self) -> str:
        """What to put in ``ProviderSettings.base_url``."""
        assert self.server is not None
        return self.server.url + self.base_path

    def add(self, *replies: R) -> None:
        """Queue replies for the next requests, in order."""
        self.replies.extend(replies)

    def reset(self) -> None:
        self.replies.clear()
        self.default = None
        self.requests.clear()
        self.disconnects = 0
        self.disconnected = asyncio.Event()
        self.streaming = asyncio.Event()

    # -- what a subclass provides --------------------------------------------------------------
    def route(self, method: str, path: str, query: str) -> str | None:
        """The model a request path names, or None (404)."""
        raise NotImplementedError

    def check(self, headers: dict[str, str], body: Any) -> None:
        """Raise :class:`Reject` for what the real API would refuse."""

    def fallback(self, body: dict[str, Any], size: int) -> R:
        """The reply when none is queued and ``default`` is None (``size``: the request's bytes)."""
        raise NotImplementedError

    def whole(self, reply: R, body: dict[str, Any], model: str) -> dict[str, Any] | None:
        """The reply as one JSON body (a request that did not ask to stream), or None: stream it."""
        return None

    def render(self, reply: R, body: dict[str, Any], model: str) -> list[Event]:
        raise NotImplementedError

    def error_body(self, status: int, message: str, kind: str) -> dict[str, Any]:
        raise NotImplementedError

    # -- ASGI ------------------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = bytearray()
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query = scope.get("query_string", b"").decode("latin-1")
        self.requests.append(
            Recorded(scope["method"], scope["path"], query, headers, bytes(raw), body, scope.get("client"))
        )
        model = self.route(scope["method"], scope["path"], query)
        if model is None:
            await _send_whole(send, 404, orjson.dumps(self.error_body(404, "Not found", "not_found")), {})
            return
        try:
            if not isinstance(body, dict):
                raise Reject(400, "The request body is not a JSON object.")
            self.check(headers, body)
        except Reject as exc:
            await _send_whole(
                send, exc.status, orjson.dumps(self.error_body(exc.status, exc.message, exc.kind)), {}
            )
            return
        if self.replies:
            reply = self.replies.popleft()
        elif self.default is not None:
            reply = self.default
        else:
            reply = self.fallback(body, len(raw))
        if reply.delay and await self._gone_during(reply.delay, receive):
            return
        if reply.status >= 300:
            payload = reply.body
            if payload is None:
                payload = self.error_body(reply.status, "fake upstream error", _kind_of(reply.status))
            data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
            await _send_whole(send, reply.status, data, reply.headers)
            return
        whole = self.whole(reply, body, model)
        if whole is not None:
            await _send_whole(send, 200, orjson.dumps(whole), reply.headers)
            return
        events = reply.events if reply.events is not None else self.render(reply, body, model)
        await self._stream(reply, events, receive, send)

    async def _gone_during(self, seconds: float, receive: Receive) -> bool:
        """Wait ``seconds`` (a model thinking before it answers); True if the client left meanwhile."""
        self.streaming.set()  # the call is under way, as far as the client can tell
        gone = asyncio.Event()
        watcher = asyncio.create_task(_watch_disconnect(receive, gone))
        try:
            await _sleep_or_gone(seconds, gone)
        except _ClientGone:
            self.disconnects += 1
            self.disconnected.set()
            return True
        finally:
            watcher.cancel()
        return False

    def frame(self, name: str | None, data: dict[str, Any] | str, nl: str) -> bytes:
        head = f"event: {name}{nl}" if name and self.named_events else ""
        payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
        return head.encode() + b"data: " + payload + f"{nl}{nl}".encode()

    async def _stream(self, reply: R, events: list[Event], receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        headers += [(k.encode(), v.encode()) for k, v in reply.headers.items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        self.streaming.set()
        gone = asyncio.Event()
        watcher = asyncio.create_task(_watch_disconnect(receive, gone))
        nl = reply.line_ending or self.line_ending
        try:
            frames = []
            for n, (name, data) in enumerate(events):
                prefix = f": keep-alive{nl}{nl}".encode() if reply.comments and n % 3 == 1 else b""
                frames.append(prefix + self.frame(name, data, nl))
            for n, frame in enumerate(frames):
                if reply.disconnect_after is not None and n >= reply.disconnect_after:
                    raise Hangup()
                cut = [frame] if reply.split is None else _cut(frame, reply.split)
                for piece in cut:
                    if gone.is_set():
                        raise _ClientGone()
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
                    if reply.chunk_delay:
                        await _sleep_or_gone(reply.chunk_delay, gone)
                    else:
                        await asyncio.sleep(0)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except _ClientGone:
            self.disconnects += 1
            self.disconnected.set()
        finally:
            watcher.cancel()


class ScriptedFake(FakeUpstream[Reply]):
    """A fake native-API upstream: provider-neutral :class:`Reply` scripts, and when none is
    queued, the default policy answers what the request asks (``ask``)."""

    def ask(self, body: dict[str, Any]) -> Ask:
        raise NotImplementedError

    def fallback(self, body: dict[str, Any], size: int) -> Reply:
        return default_reply(self.ask(body), size)


def _kind_of(status: int) -> str:
    if status == 429:
        return "rate_limit"
    if status in (401, 403):
        return "auth"
    if status == 529 or status == 503:
        return "overloaded"
    if status >= 500:
        return "server"
    return "invalid"


class _ClientGone(Exception):
    pass


async def _watch_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


async def _sleep_or_gone(seconds: float, gone: asyncio.Event) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(gone.wait(), seconds)
    if gone.is_set():
        raise _ClientGone()


def _cut(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


async def _send_whole(send: Send, status: int, payload: bytes, extra: dict[str, str]) -> None:
    headers = [(b"content-type", b"application/json")] + [(k.encode(), v.encode()) for k, v in extra.items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


def run_main(fake_cls: type[FakeUpstream[Any]], default_port: int) -> None:
    """``python -m tests.fakes.<name> [--port N]``: serve the fake with its default policy."""
    import uvicorn

    parser = argparse.ArgumentParser(description=fake_cls.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=default_port)
    args = parser.parse_args()
    fake = fake_cls()
    print(f"{fake_cls.__name__} on http://{args.host}:{args.port}{fake_cls.base_path}", flush=True)
    uvicorn.run(fake, host=args.host, port=args.port, log_level="warning", lifespan="off")
