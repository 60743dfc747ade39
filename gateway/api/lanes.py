"""Lanes of one WebSocket (``stream_id`` on ``response.create``): each lane runs its creates FIFO,
lanes run side by side. A create without ``stream_id`` is on the default lane (key ``None``),
whose events carry no ``stream_id``; every other lane's events echo it."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from gateway.kernel.errors import ErrorCode, GatewayError, InvalidRequest

QueuedCreate = (
    dict[str, Any] | GatewayError
)  # a decoded response.create frame, or the error a bad frame already earned
MAX_STREAM_ID = 256


class Lane:
    """One lane's admitted creates (the head is the one running) and the task running them."""

    __slots__ = ("creates", "key", "task")

    def __init__(self, key: str | None) -> None:
        self.key = key
        self.creates: deque[QueuedCreate] = deque()
        self.task: asyncio.Task[None] | None = None


def lane_of(data: dict[str, Any]) -> str | None:
    """The lane a decoded frame names, removing ``stream_id`` from it (it is envelope, not body).
    A ``stream_id`` that is not a non-empty string is an ``InvalidRequest`` (on the default lane)."""
    if "stream_id" not in data:
        return None
    sid = data.pop("stream_id")
    if sid is None:
        return None
    if not isinstance(sid, str) or not sid or len(sid) > MAX_STREAM_ID:
        raise InvalidRequest(
            f"stream_id must be a non-empty string of at most {MAX_STREAM_ID} characters.",
            param="stream_id",
            code=ErrorCode.INVALID_VALUE,
        )
    return sid


def tagged(event: dict[str, Any], stream_id: str | None) -> dict[str, Any]:
    """``event`` as sent on lane ``stream_id`` (the default lane adds nothing)."""
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event
