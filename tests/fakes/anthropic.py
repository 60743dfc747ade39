"""A fake Anthropic Messages API upstream (``POST /v1/messages``, streamed): a real HTTP server on
loopback that speaks the documented event stream (``message_start``, ``content_block_start`` /
``_delta`` / ``_stop``, ``message_delta``, ``message_stop``, ``ping``, ``error``).

    async with FakeAnthropic.serve() as fake:
        fake.add(Reply.text("Hi!", reasoning="Hmm.", signature="sig-1"))
        settings = ProviderSettings(kind="anthropic", base_url=fake.base_url, api_key="sk-ant-test")

Like the real API it refuses requests without ``x-api-key`` / ``anthropic-version`` or
``max_tokens``, non-alternating roles, empty text blocks, ``tool_use`` blocks not answered by
``tool_result`` blocks at the start of the next user turn, and thinking blocks without a
signature, and more than 4 ``cache_control`` breakpoints. Its prompt cache
(:class:`PromptCache`) accounts for the breakpoints as the API does: ``cache_read_input_tokens``
for a prefix an earlier request marked, ``cache_creation_input_tokens`` for the rest up to the last
breakpoint. ``python -m tests.fakes.anthropic --port 9102`` serves it standalone.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

import orjson

from tests.fakes.scripted import Ask, Event, Reject, Reply, ScriptedFake, pieces, run_main

__all__ = ["FakeAnthropic", "Reply"]

_ERRORS = {
    "rate_limit": "rate_limit_error",
    "overloaded": "overloaded_error",
    "server": "api_error",
    "invalid": "invalid_request_error",
    "auth": "authentication_error",
    "not_found": "not_found_error",
}
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}
_BLOCKS = {
    "user": {"text", "image", "document", "tool_result"},
    "assistant": {"text", "tool_use", "thinking", "redacted_thinking"},
}


class PromptCache:
    """Anthropic's prompt cache as the API documents it. A request is read as its blocks in the
    order the API caches them (tools, system, then each message's blocks); a block marked with
    ``cache_control`` writes the prefix up to it. At each breakpoint the cache looks back up to
    20 blocks for the longest prefix an earlier request wrote (a hit: read); what lies between
    that and the last breakpoint is written. Prefixes depend on the model and every byte of the
    blocks before (their ``cache_control`` aside). Tokens: a block's JSON bytes / 4. No minimum
    length, no expiry."""

    LOOKBACK = 20

    def __init__(self) -> None:
        self.entries: set[bytes] = set()

    def account(self, body: dict[str, Any]) -> tuple[int, int, int] | None:
        """(uncached input tokens, cache read, cache creation), or None: no breakpoint."""
        blocks = list(_cache_blocks(body))
        marks = [n for n, b in enumerate(blocks) if "cache_control" in b]
        if not marks:
            return None
        running = hashlib.sha256(str(body.get("model")).encode())
        keys: list[bytes] = []
        sizes: list[int] = []  # tokens up to and including each block
        for block in blocks:
            data = orjson.dumps({k: v for k, v in block.items() if k != "cache_control"})
            running.update(data)
            keys.append(running.copy().digest())
            sizes.append((sizes[-1] if sizes else 0) + max(1, len(data) // 4))
        hit = -1
        for mark in marks:
            for n in range(mark, max(mark - self.LOOKBACK, -1), -1):
                if keys[n] in self.entries:
                    hit = max(hit, n)
                    break
        last = marks[-1]
        read = sizes[hit] if hit >= 0 else 0
        written = max(sizes[last] - read, 0)
        self.entries.update(keys[mark] for mark in marks)
        return sizes[-1] - read - written, read, written


def _cache_blocks(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from body.get("tools") or []
    system = body.get("system")
    if isinstance(system, str):
        yield {"type": "text", "text": system}
    else:
        yield from system or []
    for msg in body.get("messages") or []:
        content = msg.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for block in blocks:
            yield {"role": msg.get("role"), **block}


class FakeAnthropic(ScriptedFake):
    """A fake Anthropic API (base URL is the origin; the path is ``/v1/messages``)."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = PromptCache()
        self._accounted: dict[int, tuple[dict[str, Any], tuple[int, int, int]]] = {}

    def reset(self) -> None:
        super().reset()
        self.cache = PromptCache()
        self._accounted.clear()

    def route(self, method: str, path: str, query: str) -> str | None:
        return "" if method == "POST" and path == "/v1/messages" else None

    def check(self, headers: dict[str, str], body: Any) -> None:
        if not headers.get("x-api-key"):
            raise Reject(401, "x-api-key header is required", "auth")
        if not headers.get("anthropic-version"):
            raise Reject(400, "anthropic-version: header is required")
        if not isinstance(body.get("max_tokens"), int):
            raise Reject(400, "max_tokens: Field required")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Reject(400, "messages: at least one message is required")
        if messages[0].get("role") != "user":
            raise Reject(400, 'messages: first message must use the "user" role')
        pending: set[str] = set()  # tool_use ids of the previous assistant turn
        for n, msg in enumerate(messages):
            role = msg.get("role")
            if role not in _BLOCKS:
                raise Reject(400, f"messages.{n}.role: Input should be 'user' or 'assistant'")
            if n and messages[n - 1].get("role") == role:
                raise Reject(400, "messages: roles must alternate between 'user' and 'assistant'")
            content = msg.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            if not blocks:
                raise Reject(400, f"messages.{n}: all messages must have non-empty content")
            answered: set[str] = set()
            for m, block in enumerate(blocks):
                kind = block.get("type")
                if kind not in _BLOCKS[role]:
                    raise Reject(400, f"messages.{n}.content.{m}: unexpected block type '{kind}'")
                if kind == "text" and not block.get("text"):
                    raise Reject(400, f"messages.{n}.content.{m}: text content blocks must be non-empty")
                if kind == "thinking" and not block.get("signature"):
                    raise Reject(400, f"messages.{n}.content.{m}.thinking.signature: Field required")
                if kind == "tool_result":
                    if answered != {b.get("tool_use_id") for b in blocks[:m]}:
                        raise Reject(400, f"messages.{n}: tool_result blocks must come first")
                    answered.add(block.get("tool_use_id"))
                if kind == "image":
                    source = block.get("source") or {}
                    if source.get("type") not in ("base64", "url") or not (
                        source.get("data") or source.get("url")
                    ):
                        raise Reject(400, f"messages.{n}.content.{m}.source: invalid image source")
            if role == "user":
                if pending != answered:
                    raise Reject(
                        400,
                        "messages: `tool_use` ids were found without `tool_result` blocks immediately after",
                    )
                pending = set()
            else:
                pending = {b["id"] for b in blocks if b.get("type") == "tool_use"}
        for tool in body.get("tools") or []:
            if not isinstance(tool.get("input_schema"), dict):
                raise Reject(400, "tools.0.input_schema: Field required")
        choice = body.get("tool_choice")
        if choice is not None and choice.get("type") not in ("auto", "any", "tool", "none"):
            raise Reject(400, "tool_choice.type: invalid")
        marked = [b for b in _cache_blocks(body) if "cache_control" in b]
        if len(marked) > 4:
            raise Reject(
                400, f"A maximum of 4 blocks with cache_control may be provided. Found {len(marked)}."
            )
        for block in marked:
            if block.get("type") in ("thinking", "redacted_thinking"):
                raise Reject(400, "cache_control cannot be set for thinking blocks")
            if block["cache_control"] != {"type": "ephemeral"}:
                raise Reject(400, "cache_control.type: Input should be 'ephemeral'")
        usage = self.cache.account(body)
        if usage is not None:
            self._accounted[id(body)] = (body, usage)

    def ask(self, body: dict[str, Any]) -> Ask:
        ask = Ask(max_tokens=body.get("max_tokens"), reasoning=bool(body.get("thinking")))
        messages = body.get("messages") or []
        for msg in messages:
            if msg.get("role") != "user":
                continue
            content = msg.get("content")
            if isinstance(content, str):
                ask.user_text = content
                continue
            texts = [b.get("text", "") for b in content if b.get("type") == "text"]
            if texts:
                ask.user_text = " ".join(texts)
            ask.images += sum(1 for b in content if b.get("type") == "image")
        last = messages[-1] if messages else {}
        results = [
            b for b in last.get("content") or [] if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
        if last.get("role") == "user" and results:
            content = results[-1].get("content") or ""
            ask.tool_result = (
                content if isinstance(content, str) else " ".join(b.get("text", "") for b in content)
            )
        ask.tools = [(t["name"], t.get("input_schema")) for t in body.get("tools") or []]
        choice = body.get("tool_choice") or {"type": "auto"}
        ask.mode = {"any": "required", "tool": "required", "none": "none"}.get(
            str(choice.get("type")), "auto"
        )
        if choice.get("type") == "tool":
            ask.forced = choice.get("name")
        return ask

    def error_body(self, status: int, message: str, kind: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": _ERRORS.get(kind, "api_error"), "message": message}}

    def whole(self, reply: Reply, body: dict[str, Any], model: str) -> dict[str, Any] | None:
        """``"stream"`` absent or false: the rendered stream folded into one Message object (a
        reply scripted to fail or stop mid-stream still streams)."""
        if body.get("stream") or reply.events or reply.stream_error or not reply.terminal:
            return None
        if reply.disconnect_after is not None:
            return None
        message: dict[str, Any] = {}
        blocks: list[dict[str, Any]] = []
        args: dict[int, str] = {}
        for _, event in self.render(reply, body, model):
            assert isinstance(event, dict)  # Anthropic's events are all JSON
            kind = event["type"]
            if kind == "message_start":
                message = dict(event["message"])
            elif kind == "content_block_start":
                blocks.append(dict(event["content_block"]))
            elif kind == "content_block_delta":
                block, delta = blocks[event["index"]], event["delta"]
                if delta["type"] == "input_json_delta":
                    args[event["index"]] = args.get(event["index"], "") + delta["partial_json"]
                else:
                    field = {"text_delta": "text", "thinking_delta": "thinking"}.get(delta["type"])
                    field = field or "signature"
                    block[field] = block.get(field, "") + delta[field]
            elif kind == "message_delta":
                message.update(event["delta"])
                message["usage"] = {**message["usage"], **event["usage"]}
        for index, text in args.items():
            blocks[index]["input"] = orjson.loads(text or "{}")
        return {**message, "content": blocks}

    def render(self, reply: Reply, body: dict[str, Any], model: str) -> list[Event]:
        r = reply
        out: list[Event] = []

        def emit(kind: str, **fields: Any) -> None:
            out.append((kind, {"type": kind, **fields}))

        usage_in = r.usage[0] if r.usage else 0
        uncached, read, written = max(usage_in - r.cached, 0), r.cached, 0
        if (accounted := self._accounted.get(id(body))) is not None and accounted[0] is body:
            uncached, read, written = accounted[1]
        emit(
            "message_start",
            message={
                "id": f"msg_{os.urandom(8).hex()}",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": body.get("model"),
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": uncached,
                    "cache_creation_input_tokens": written,
                    "cache_read_input_tokens": read,
                    "output_tokens": 1,
                },
            },
        )
        index = 0
        if r.reasoning is not None or r.signature is not None:
            emit(
                "content_block_start",
                index=index,
                content_block={"type": "thinking", "thinking": "", "signature": ""},
            )
            emit("ping")
            for piece in pieces(r.reasoning or "", r.pieces):
                emit("content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": piece})
            if r.signature:
                emit(
                    "content_block_delta",
                    index=index,
                    delta={"type": "signature_delta", "signature": r.signature},
                )
            emit("content_block_stop", index=index)
            index += 1
        if r.answer:
            emit("content_block_start", index=index, content_block={"type": "text", "text": ""})
            for piece in pieces(r.answer, r.pieces):
                emit("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})
            emit("content_block_stop", index=index)
            index += 1
        for name, args, call_id in r.calls:
            block = {
                "type": "tool_use",
                "id": call_id or f"toolu_{os.urandom(8).hex()}",
                "name": name,
                "input": {},
            }
            emit("content_block_start", index=index, content_block=block)
            emit("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": ""})
            for piece in pieces(args, r.arg_pieces):
                emit(
                    "content_block_delta",
                    index=index,
                    delta={"type": "input_json_delta", "partial_json": piece},
                )
            emit("content_block_stop", index=index)
            index += 1
        if r.stream_error:
            kind = _ERRORS.get(r.stream_error, "api_error")
            emit(
                "error",
                error={"type": kind, "message": "Overloaded" if kind == "overloaded_error" else "Error"},
            )
            return out
        if not r.terminal:
            return out
        emit(
            "message_delta",
            delta={"stop_reason": _STOP.get(r.finish_reason, "end_turn"), "stop_sequence": None},
            usage={"output_tokens": r.usage[1] if r.usage else 0},
        )
        emit("message_stop")
        return out


if __name__ == "__main__":
    run_main(FakeAnthropic, 9102)
