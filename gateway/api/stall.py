"""Drop clients that stop reading. A send to a client blocks once the socket's buffers are full
(uvicorn applies backpressure), and with it the turn and its upstream call: nothing else times out
while the gateway waits on a client, so a few such clients would hold every upstream connection.

Each open SSE stream and WebSocket stamps ``since`` (time.monotonic) while a send is in progress,
two attribute writes per event. One watchdog task per process looks every quarter of the bound
(at most a second) and calls ``stalled()`` on any sender blocked longer than
``limits.client_send_seconds``: the sender cancels its turn (so the upstream call is cancelled)
and drops the client (``abort_transport``, gateway/server/internals.py). One tenant's stalled
clients thus free what they held for everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol

import structlog

log = structlog.get_logger("gateway.api.stall")


class Sender(Protocol):
    since: float  # when the send in progress began (time.monotonic); 0.0: none in progress

    def stalled(self) -> None: ...


class StallWatch:
    __slots__ = ("_senders", "_task", "limit")

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self._senders: set[Sender] = set()
        self._task: asyncio.Task[None] | None = None

    def add(self, sender: Sender) -> None:
        self._senders.add(sender)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())

    def discard(self, sender: Sender) -> None:
        self._senders.discard(sender)

    async def _watch(self) -> None:
        period = min(1.0, self.limit / 4)
        while self._senders:
            await asyncio.sleep(period)
            cutoff = time.monotonic() - self.limit
            for sender in [s for s in self._senders if 0.0 < s.since < cutoff]:
                self._senders.discard(sender)
                log.warning("client_send_stalled", seconds=self.limit)
                sender.stalled()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
