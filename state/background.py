"""What background responses (``background: true``) share between replicas: each one's event log,
its owner's lease and its cancel request. In process here (``MemoryBackgroundLog``, one process
only), in Redis in ``state/redis_background.py``.

- The **event log** holds every event of a background response, in order, each under its
  ``sequence_number`` (``LoggedEvent``), so that a reader can replay from any point and then follow
  until the terminal event. It is bounded (``max_events`` per response, the oldest dropped past it)
  and expires ``ttl_seconds`` after its last append.
- The **lease** is held by the replica running the response and renewed by its heartbeat
  (``beat``); a response still ``queued`` or ``in_progress`` whose lease has lapsed lost its owner
  (the process died), and a reader marks it failed.
- A **cancel request** is a flag on the lease, and a message on its owner's control stream: the
  owner hears it at once (``control``), or at its next heartbeat, wherever the request arrived.
- The tenant's **running index** lists its leases with their deadlines, so that a sweeper finds
  the lapsed ones (``stale``) without scanning.

Only ids, sequence numbers and the events themselves: the events are the response as its client
sees it, under the same tenant scope as the stored response.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

# the default bounds: events kept per response, and how long a log outlives its last event
MAX_EVENTS = 10_000
TTL_SECONDS = 24 * 3600


@dataclass(slots=True, frozen=True)
class LoggedEvent:
    """One event of a background response: its ``sequence_number``, its JSON (as sent), and
    whether it is the response's terminal event."""

    seq: int
    data: bytes
    terminal: bool


class Beat(Enum):
    """What a heartbeat learned: carry on, a cancel was asked for, or the lease was lost."""

    ALIVE = "alive"
    CANCEL = "cancel"
    LOST = "lost"


class BackgroundLog(Protocol):
    max_events: int
    ttl_seconds: int

    async def claim(self, tenant: str, response_id: str, ttl_seconds: float) -> None:
        """Take the response's lease for ``ttl_seconds`` (its owner renews it with ``beat``)."""

    async def beat(self, tenant: str, response_id: str, ttl_seconds: float) -> Beat:
        """Renew the lease for ``ttl_seconds``; whether a cancel was asked for, or it had lapsed."""

    async def cancel(self, tenant: str, response_id: str) -> bool:
        """Ask the owner to cancel the response; False: no lease is held (no replica runs it)."""

    async def held(self, tenant: str, response_id: str) -> bool:
        """Whether a replica holds the response's lease."""

    async def control(self, wait_seconds: float) -> list[tuple[str, str]]:
        """The cancel requests sent to this process since the last call, as (tenant, response
        id); when there are none, wait up to ``wait_seconds`` for one."""

    async def drop(self, tenant: str, response_id: str) -> None:
        """Give the lease up (the response has ended)."""

    async def stale(self, tenant: str) -> list[str]:
        """The tenant's responses whose lease lapsed without being given up (their owner died)."""

    async def append(self, tenant: str, response_id: str, events: Sequence[LoggedEvent]) -> None:
        """Append ``events`` (in order, their numbers increasing) and restart the log's TTL."""

    async def read(self, tenant: str, response_id: str, after: int, wait_seconds: float) -> list[LoggedEvent]:
        """The logged events numbered above ``after``, oldest first; when there are none yet, wait
        up to ``wait_seconds`` for the next ones (0: do not wait)."""

    async def last(self, tenant: str, response_id: str) -> LoggedEvent | None:
        """The newest logged event (None: the log is empty or gone)."""

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class _Log:
    events: list[LoggedEvent] = field(default_factory=list)
    expires: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True)
class _Lease:
    expires: float
    cancel: bool = False


class MemoryBackgroundLog:
    """The logs of one process, at most ``max_logs`` of them (the least recently appended dropped
    first), each bounded by ``max_events`` and ``ttl_seconds``; leases by expiry."""

    def __init__(
        self,
        *,
        max_events: int = MAX_EVENTS,
        ttl_seconds: int = TTL_SECONDS,
        max_logs: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_events = max_events
        self.ttl_seconds = ttl_seconds
        self.max_logs = max_logs
        self._clock = clock
        self._logs: OrderedDict[tuple[str, str], _Log] = OrderedDict()
        self._leases: dict[tuple[str, str], _Lease] = {}

    def _lease(self, key: tuple[str, str]) -> _Lease | None:
        lease = self._leases.get(key)
        if lease is not None and lease.expires <= self._clock():
            del self._leases[key]
            return None
        return lease

    async def claim(self, tenant: str, response_id: str, ttl_seconds: float) -> None:
        self._leases[(tenant, response_id)] = _Lease(self._clock() + ttl_seconds)

    async def beat(self, tenant: str, response_id: str, ttl_seconds: float) -> Beat:
        lease = self._lease((tenant, response_id))
        if lease is None:
            return Beat.LOST
        lease.expires = self._clock() + ttl_seconds
        return Beat.CANCEL if lease.cancel else Beat.ALIVE

    async def cancel(self, tenant: str, response_id: str) -> bool:
        lease = self._lease((tenant, response_id))
        if lease is None:
            return False
        lease.cancel = True
        return True

    async def held(self, tenant: str, response_id: str) -> bool:
        return self._lease((tenant, response_id)) is not None

    async def control(self, wait_seconds: float) -> list[tuple[str, str]]:
        await asyncio.sleep(wait_seconds)  # one process: a cancel reaches its turn directly
        return []

    async def drop(self, tenant: str, response_id: str) -> None:
        self._leases.pop((tenant, response_id), None)

    async def stale(self, tenant: str) -> list[str]:
        now = self._clock()
        return [rid for (t, rid), lease in self._leases.items() if t == tenant and lease.expires <= now]

    def _live(self, key: tuple[str, str]) -> _Log | None:
        log = self._logs.get(key)
        if log is not None and log.expires <= self._clock():
            del self._logs[key]
            return None
        return log

    async def append(self, tenant: str, response_id: str, events: Sequence[LoggedEvent]) -> None:
        key = (tenant, response_id)
        log = self._live(key)
        if log is None:
            log = self._logs[key] = _Log()
            while len(self._logs) > self.max_logs:
                self._logs.popitem(last=False)
        self._logs.move_to_end(key)
        log.events.extend(events)
        if len(log.events) > self.max_events:
            del log.events[: len(log.events) - self.max_events]
        log.expires = self._clock() + self.ttl_seconds
        changed, log.changed = log.changed, asyncio.Event()
        changed.set()  # wakes every reader waiting for these events

    async def read(self, tenant: str, response_id: str, after: int, wait_seconds: float) -> list[LoggedEvent]:
        key = (tenant, response_id)
        log = self._live(key)
        if log is None or not log.events or log.events[-1].seq <= after:
            if wait_seconds <= 0:
                return []
            if log is None:  # nothing logged yet: the first append makes it
                log = self._logs[key] = _Log(expires=self._clock() + self.ttl_seconds)
            try:
                await asyncio.wait_for(log.changed.wait(), wait_seconds)
            except TimeoutError:
                return []
        events = log.events  # numbered consecutively
        return events[max(0, after + 1 - events[0].seq) :] if events else []

    async def last(self, tenant: str, response_id: str) -> LoggedEvent | None:
        log = self._live((tenant, response_id))
        return log.events[-1] if log is not None and log.events else None

    async def aclose(self) -> None:
        self._logs.clear()
        self._leases.clear()
