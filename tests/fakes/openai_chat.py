"""A fake OpenAI-compatible Chat Completions upstream: a real HTTP server on loopback.

The test programs it with :class:`Reply` objects (queued, one per request; the default answers
"Hello!"), and reads back every request it received in ``fake.requests``::

    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.tool_calls([("get_weather", '{"city":"Paris"}', "call_1")]))
        settings = ProviderSettings(kind="openai-chat", base_url=fake.base_url, api_key="sk-test")
        ...
        assert fake.requests[0].body["model"] == "m"

Streams are written in awkward pieces (``split`` bytes per write: JSON and lines cut anywhere,
even inside UTF-8 characters), with keep-alive comments in between. Non-stream requests
(``"stream": false``) get the same reply assembled into one ``chat.completion`` object.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.fakes.server import Hangup, LoopbackServer, serve_asgi

__all__ = ["FakeOpenAIChat", "Recorded", "Reply"]

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class Reply:
    """What the fake answers to one request."""

    chunks: list[dict[str, Any]] = field(default_factory=list)  # choice deltas / usage / error chunks
    status: int = 200
    body: bytes | dict[str, Any] | None = None  # the body of a non-2xx answer
    headers: dict[str, str] = field(default_factory=dict)
    done: bool = True  # end with "data: [DONE]"
    disconnect_after: int | None = None  # drop the connection after this many events
    delay: float = 0.0  # seconds before the response headers
    chunk_delay: float = 0.0  # seconds between writes
    split: int | None = 7  # bytes per write (None: one write per event)
    line_ending: str = "\n"
    comments: bool = True  # ": keep-alive" comment lines between events
    as_json: bool = False  # answer one chat.completion JSON even to a streamed request

    # -- builders ----------------------------------------------------------------------------
    @classmethod
    def text(
        cls,
        text: str = "Hello!",
        *,
        pieces: int = 3,
        finish: str | None = "stop",
        usage: tuple[int, int] | None = (11, 7),
        reasoning: str | None = None,
        reasoning_field: str = "reasoning_content",
        **kw: Any,
    ) -> Reply:
        """A text answer in ``pieces`` content deltas (after optional reasoning deltas)."""
        chunks: list[dict[str, Any]] = [_choice({"role": "assistant", "content": ""})]
        if reasoning:
            chunks += [_choice({reasoning_field: p}) for p in _pieces(reasoning, pieces)]
        chunks += [_choice({"content": p}) for p in _pieces(text, pieces)]
        if finish is not None:
            chunks.append(_choice({}, finish))
        if usage is not None:
            chunks.append(usage_chunk(*usage))
        return cls(chunks=chunks, **kw)

    @classmethod
    def tool_calls(
        cls,
        calls: list[tuple[str, str, str]],
        *,
        text: str | None = None,
        arg_pieces: int = 3,
        finish: str = "tool_calls",
        usage: tuple[int, int] | None = (20, 9),
        **kw: Any,
    ) -> Reply:
        """``(name, arguments, call_id)`` calls, streamed one after another as OpenAI does."""
        chunks: list[dict[str, Any]] = [_choice({"role": "assistant", "content": None})]
        if text:
            chunks.append(_choice({"content": text}))
        for i, (name, args, call_id) in enumerate(calls):
            head = {
                "index": i,
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            chunks.append(_choice({"tool_calls": [head]}))
            for p in _pieces(args, arg_pieces):
                chunks.append(_choice({"tool_calls": [{"index": i, "function": {"arguments": p}}]}))
        chunks.append(_choice({}, finish))
        if usage is not None:
            chunks.append(usage_chunk(*usage))
        return cls(chunks=chunks, **kw)

    @classmethod
    def error(
        cls, status: int, body: bytes | dict[str, Any] | None = None, headers: dict[str, str] | None = None
    ) -> Reply:
        """A non-2xx answer."""
        if body is None:
            body = {"error": {"message": "fake upstream error", "type": "server_error", "code": None}}
        return cls(status=status, body=body, headers=headers or {})


def _choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def usage_chunk(prompt: int, completion: int, *, cached: int = 0, reasoning: int = 0) -> dict[str, Any]:
    """The final ``include_usage`` chunk (empty ``choices``)."""
    return {
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        },
    }


def _pieces(text: str, n: int) -> list[str]:
    if not text:
        return []
    size = max(1, -(-len(text) // max(n, 1)))
    return [text[i : i + size] for i in range(0, len(text), size)]


@dataclass
class Recorded:
    """One request the fake received."""

    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    raw: bytes
    body: Any  # parsed JSON (None if the body was not JSON)
    client: tuple[str, int] | None = None  # the peer address: same port, same (kept-alive) connection


class FakeOpenAIChat:
    """The ASGI app plus its script (``replies``) and its record (``requests``, ``disconnects``)."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.default = Reply.text("Hello!")
        self.responder: Callable[[Any], Reply] | None = None  # used when no reply is queued
        self.requests: list[Recorded] = []
        self.disconnects = 0  # clients that went away before a streamed answer ended
        self.disconnected = asyncio.Event()
        self.server: LoopbackServer | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def serve(cls) -> AsyncIterator[FakeOpenAIChat]:
        """Start a fake on a free loopback port for the duration of the block."""
        fake = cls()
        async with serve_asgi(fake) as server:
            fake.server = server
            yield fake

    @property
    def base_url(self) -> str:
        """What to put in ``ProviderSettings.base_url`` (ends with ``/v1``)."""
        assert self.server is not None
        return self.server.url + "/v1"

    def add(self, *replies: Reply) -> None:
        """Queue replies for the next requests, in order."""
        self.replies.extend(replies)

    def reset(self) -> None:
        self.replies.clear()
        self.default = Reply.text("Hello!")
        self.responder = None
        self.requests.clear()
        self.disconnects = 0
        self.disconnected = asyncio.Event()

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
        self.requests.append(
            Recorded(scope["method"], scope["path"], headers, bytes(raw), body, scope.get("client"))
        )
        if self.replies:
            reply = self.replies.popleft()
        elif self.responder is not None:
            reply = self.responder(body)
        else:
            reply = self.default

        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status >= 300:
            payload = reply.body if isinstance(reply.body, bytes) else orjson.dumps(reply.body)
            await _send_whole(send, reply.status, payload, "application/json", reply.headers)
            return
        if reply.as_json or not (isinstance(body, dict) and body.get("stream")):
            await _send_whole(
                send, 200, orjson.dumps(_assemble(reply, body)), "application/json", reply.headers
            )
            return
        await self._stream(reply, body, receive, send)

    async def _stream(self, reply: Reply, body: dict[str, Any], receive: Receive, send: Send) -> None:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        model = body.get("model", "fake-model")
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        headers += [(k.encode(), v.encode()) for k, v in reply.headers.items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        nl = reply.line_ending
        try:
            events: list[bytes] = []
            for chunk in reply.chunks:
                if "usage" in chunk and not chunk.get("choices") and not include_usage:
                    continue
                full = {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": model,
                }
                full.update(chunk)
                prefix = f": keep-alive{nl}{nl}" if reply.comments and len(events) % 3 == 1 else ""
                events.append(prefix.encode() + b"data: " + orjson.dumps(full) + f"{nl}{nl}".encode())
            if reply.done:
                events.append(f"data: [DONE]{nl}{nl}".encode())
            for n, event in enumerate(events):
                if reply.disconnect_after is not None and n >= reply.disconnect_after:
                    raise Hangup()
                pieces = [event] if reply.split is None else _cut(event, reply.split)
                for piece in pieces:
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


class _ClientGone(Exception):
    pass


async def _sleep_or_gone(seconds: float, gone: asyncio.Event) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(gone.wait(), seconds)
    if gone.is_set():
        raise _ClientGone()


def _cut(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


async def _send_whole(send: Send, status: int, payload: bytes, ctype: str, extra: dict[str, str]) -> None:
    headers = [(b"content-type", ctype.encode())] + [(k.encode(), v.encode()) for k, v in extra.items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


def _assemble(reply: Reply, body: Any) -> dict[str, Any]:
    """The reply as one non-streamed ``chat.completion``."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    usage = None
    for chunk in reply.chunks:
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                call = calls.setdefault(
                    tc["index"], {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                if tc.get("id"):
                    call["id"] = tc["id"]
                fn = tc.get("function") or {}
                call["function"]["name"] += fn.get("name") or ""
                call["function"]["arguments"] += fn.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    model = body.get("model", "fake-model") if isinstance(body, dict) else "fake-model"
    out: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
    }
    if usage is not None:
        out["usage"] = usage
    return out


def smart_reply(body: Any) -> Reply:
    """A model-like answer derived from the request: call the first offered tool unless the last
    message is a tool result, else echo the last user text; ``max_tokens`` caps the words sent."""
    from adapters.mock.adapter import example_value

    body = body if isinstance(body, dict) else {}
    messages = body.get("messages") or []
    tools = body.get("tools") or []
    last = messages[-1] if messages else {}
    if tools and body.get("tool_choice") != "none" and last.get("role") != "tool":
        fn = tools[0]["function"]
        args = orjson.dumps(example_value(fn.get("parameters") or {"type": "object"}) or {}).decode()
        return Reply.tool_calls([(fn["name"], args, f"call_{len(messages)}")])
    if last.get("role") == "tool":
        text = f"The tool returned: {last.get('content')}"
    else:
        user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
        content = user.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        text = f"Hello! You said: {content or ''}"
    words = text.split(" ")
    limit = body.get("max_tokens") or body.get("max_completion_tokens")
    finish = "stop"
    if limit is not None and len(words) > limit:
        words, finish = words[:limit], "length"
    return Reply.text(
        " ".join(words),
        pieces=max(1, len(words)),
        finish=finish,
        usage=(len(orjson.dumps(messages)) // 4, len(words)),
    )


def main() -> None:
    """``python -m tests.fakes.openai_chat PORT``: serve a smart fake on 127.0.0.1:PORT."""
    import sys

    import uvicorn

    fake = FakeOpenAIChat()
    fake.responder = smart_reply
    uvicorn.run(fake, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")


if __name__ == "__main__":
    main()
