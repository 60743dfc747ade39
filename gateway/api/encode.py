"""Encoders: each event is serialized exactly once, here."""

from __future__ import annotations

from typing import Any

import orjson

SSE_DONE = b"data: [DONE]\n\n"


def sse_frame(event: dict[str, Any]) -> bytes:
    """One whole SSE event: ``event:`` equals the JSON ``type``, one single-line ``data:``, LF endings."""
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def json_bytes(obj: Any) -> bytes:
    return orjson.dumps(obj)


def ws_text(event: dict[str, Any]) -> str:
    return orjson.dumps(event).decode()


def ws_bytes(event: dict[str, Any]) -> bytes:
    """A WebSocket text frame's payload as UTF-8 (gateway/api/frames.py frames it as is)."""
    return orjson.dumps(event)
