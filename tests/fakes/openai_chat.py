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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.fakes.scripted import Event, FakeUpstream, Recorded, Transport
from tests.fakes.scripted import pieces as _pieces

__all__ = ["FakeOpenAIChat", "Recorded", "Reply", "smart_reply", "usage_chunk"]


@dataclass
class Reply(Transport):
    """What the fake answers to one request (``error`` and the delivery fields: see Transport)."""

    chunks: list[dict[str, Any]] = field(default_factory=list)  # choice deltas / usage / error chunks
    done: bool = True  # end with "data: [DONE]"
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


class FakeOpenAIChat(FakeUpstream[Reply]):
    """A fake Chat Completions server (base URL ends with ``/v1``; any path answers).

    When no reply is queued, ``responder`` (if set) answers from the request body, else "Hello!".
    """

    base_path = "/v1"
    named_events = False

    def __init__(self) -> None:
        super().__init__()
        self.responder: Callable[[Any], Reply] | None = None

    def reset(self) -> None:
        super().reset()
        self.responder = None

    def route(self, method: str, path: str, query: str) -> str | None:
        return ""

    def fallback(self, body: dict[str, Any], size: int) -> Reply:
        return self.responder(body) if self.responder is not None else Reply.text("Hello!")

    def error_body(self, status: int, message: str, kind: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": "server_error", "code": None}}

    def whole(self, reply: Reply, body: dict[str, Any], model: str) -> dict[str, Any] | None:
        return _assemble(reply, body) if reply.as_json or not body.get("stream") else None

    def render(self, reply: Reply, body: dict[str, Any], model: str) -> list[Event]:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        model = body.get("model", "fake-model")
        head = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": model}
        events: list[Event] = [
            (None, {**head, **_with_logprobs(chunk, body)})
            for chunk in reply.chunks
            if include_usage or not ("usage" in chunk and not chunk.get("choices"))
        ]
        if reply.done:
            events.append((None, "[DONE]"))
        return events


def fake_logprobs(text: str, top: int) -> list[dict[str, Any]]:
    """What the fake reports for ``text`` when asked for logprobs: one token, logprob -0.5, and
    ``top`` alternatives (the token itself, then "alt1"...)."""
    alts = [{"token": text, "logprob": -0.5, "bytes": list(text.encode())}]
    alts += [
        {"token": f"alt{n}", "logprob": -2.0 - n, "bytes": list(f"alt{n}".encode())} for n in range(1, top)
    ]
    return [{"token": text, "logprob": -0.5, "bytes": list(text.encode()), "top_logprobs": alts[:top]}]


def _with_logprobs(chunk: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    if not body.get("logprobs") or not chunk.get("choices"):
        return chunk
    choices = []
    for choice in chunk["choices"]:
        text = (choice.get("delta") or {}).get("content")
        if text:
            choice = {**choice, "logprobs": {"content": fake_logprobs(text, body.get("top_logprobs") or 0)}}
        choices.append(choice)
    return {**chunk, "choices": choices}


def _assemble(reply: Reply, body: Any) -> dict[str, Any]:
    """The reply as one non-streamed ``chat.completion``."""
    logprobs: list[dict[str, Any]] = []
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
                if isinstance(body, dict) and body.get("logprobs"):
                    logprobs += fake_logprobs(delta["content"], body.get("top_logprobs") or 0)
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
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish,
                "logprobs": {"content": logprobs} if logprobs else None,
            }
        ],
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
        user: dict[str, Any] = next((m for m in reversed(messages) if m.get("role") == "user"), {})
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
    """``python -m tests.fakes.openai_chat [--port N | N]``: serve a smart fake on 127.0.0.1."""
    import argparse

    import uvicorn

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("port_arg", nargs="?", type=int, help="the port (same as --port)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    args = parser.parse_args()
    fake = FakeOpenAIChat()
    fake.responder = smart_reply
    port = args.port_arg or args.port
    print(f"FakeOpenAIChat on http://{args.host}:{port}/v1", flush=True)
    uvicorn.run(fake, host=args.host, port=port, log_level="warning", lifespan="off")


if __name__ == "__main__":
    main()
