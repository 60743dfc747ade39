"""Shared bits of the compaction tests: settings with a fake upstream, windows, tampering."""

from __future__ import annotations

import base64
from typing import Any

import orjson

from tests.fakes.openai_chat import FakeOpenAIChat
from tests.helpers import chat_upstream


def key(n: int) -> str:
    return base64.b64encode(bytes([n]) * 32).decode()


def upstream_settings(fake: FakeOpenAIChat, **extra: Any) -> dict[str, Any]:
    """Models ``m`` (default window) and ``small`` (300 tokens) on the fake Chat Completions upstream."""
    models = {"m": {"provider": "up"}, "small": {"provider": "up", "context_window": 300}}
    settings = chat_upstream(fake, models, api_key="sk-up", retry={"attempts": 0})
    settings.update(extra)
    return settings


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": text}


def conversation(turns: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"type": "message", "role": "system", "content": "You are terse."}]
    for n in range(turns):
        items += [user(f"question {n}: remember code word cobalt-{n}"), assistant(f"answer {n}")]
    return items


def build_log_read() -> list[dict[str, Any]]:
    """A call reading a build log, its 30,000-character output, and a long assistant answer."""
    log = "".join(f"line {n:05d}: compiler output ok\n" for n in range(1000))[:30_000]
    return [
        {
            "type": "function_call",
            "call_id": "call_log",
            "name": "read_file",
            "arguments": '{"path": "b.log"}',
        },
        {"type": "function_call_output", "call_id": "call_log", "output": log},
        assistant("The log shows: " + "a long explanation of the build. " * 220),
    ]


def bulky_tail() -> list[dict[str, Any]]:
    """About 40,000 characters whose bulk is at the end: a few short turns, then a call whose
    output is 30,000 characters and a long assistant message (the shape compaction used to grow)."""
    return [*conversation(3), user("Now read the build log."), *build_log_read()]


def agent_turns() -> list[dict[str, Any]]:
    """The agent conversation of issue 19 (~38,600 characters, ~9,300 tokens: within the default
    budget): a short first message, a 30,000-character tool result, a long answer, a short last
    message."""
    return [user("Read b.log and tell me why the build is slow."), *build_log_read(), user("Thanks. Fix it.")]


def compaction_of(window: list[dict[str, Any]]) -> dict[str, Any]:
    found = [i for i in window if i["type"] == "compaction"]
    assert len(found) == 1, window
    return found[0]


def with_envelope(window: list[dict[str, Any]], envelope: str) -> list[dict[str, Any]]:
    return [{**i, "encrypted_content": envelope} if i["type"] == "compaction" else i for i in window]


def flip_byte(envelope: str, index: int = 20) -> str:
    head, _, blob = envelope.rpartition(".")
    raw = bytearray(base64.urlsafe_b64decode(blob + "=" * (-len(blob) % 4)))
    raw[index] ^= 0x80
    return head + "." + base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()


def sent_text(fake: FakeOpenAIChat, n: int = -1) -> str:
    """Everything the upstream received in request ``n``, as one JSON string."""
    return orjson.dumps(fake.requests[n].body).decode()
