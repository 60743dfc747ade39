"""Stop work when the HTTP client goes away: a watch that cancels the handling task on
``http.disconnect`` (Starlette's StreamingResponse idea, without its task group per response)."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from starlette.types import Receive, Send

from gateway.server.internals import abort_transport


class DisconnectWatch:
    """``async with DisconnectWatch(receive) as watch:`` — once the request body has been read, a
    client disconnect cancels the body of the block (the upstream call with it) and the block exits
    quietly with ``watch.gone`` set."""

    __slots__ = ("_receive", "_send", "_task", "_watcher", "gone", "since")

    def __init__(self, receive: Receive, send: Send | None = None) -> None:
        self._receive = receive
        self._send = send
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.gone = False
        self.since = 0.0  # a send to the client in progress since (gateway/api/stall.py)

    def stalled(self) -> None:
        """The client stopped reading (``StallWatch``): treat it as gone, and drop its socket."""
        self.gone = True
        if self._task is not None:
            self._task.cancel()
        abort_transport(self._send)

    async def __aenter__(self) -> DisconnectWatch:
        self._task = asyncio.current_task()
        self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return self

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                if self._task is not None:
                    self._task.cancel()
                return

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()
        if self.gone and exc_type is asyncio.CancelledError and self._task is not None:
            self._task.uncancel()
            return True  # the client left: nothing more to do
        return self.gone and exc_type is not None and issubclass(exc_type, OSError | RuntimeError)
