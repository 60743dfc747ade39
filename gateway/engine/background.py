"""Background responses (``background: true``): each runs detached from its request, through the
one turn runner and its end-of-turn hooks, every event appended to its event log
(``state/background.py``: in process, or a Redis Stream) so that a client on any replica can replay
it from any sequence number and follow it live; its owner holds a lease that its heartbeat renews.

- **Cancel from anywhere**: on the owner's replica the turn is cancelled at once; elsewhere the
  request sets the lease's cancel flag and sends the owner a message on its control stream, which
  it follows (``start_watch``): it cancels at once, or at its next heartbeat (``BEAT_SECONDS``) if
  the message was lost.
- **Owner lost**: a process that dies stops renewing its lease, which lapses within
  ``LEASE_SECONDS``; whoever next looks at the response (a GET, a stream follower, a cancel) finds
  it still ``queued`` or ``in_progress`` with no lease and marks it ``failed`` (``server_error``,
  ``OWNER_LOST``), appending ``response.failed`` to its log for the followers; and every replica's
  sweeper looks, every ``SWEEP_SECONDS``, at the tenants' responses whose lease lapsed, so none is
  left ``in_progress`` even if nobody asks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import structlog

from gateway.engine.builder import ResponseState
from gateway.engine.turn import Event, Turn
from gateway.kernel.errors import GatewayError, RateLimited, ServerError, ServiceUnavailable
from state.background import BackgroundLog, Beat, LoggedEvent
from state.base import ResponseStore, StoredResponse

log = structlog.get_logger("gateway.engine.background")

LEASE_SECONDS = 10.0  # a lease not renewed for this long is lost: its owner stopped
BEAT_SECONDS = 1.0  # how often the owner renews it, and reads a cancel request
FOLLOW_SECONDS = 1.0  # how long a follower waits for the next events before it checks the owner
RUNNING = frozenset({"queued", "in_progress"})
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "response.cancelled"})
OWNER_LOST = "The gateway stopped while generating this response."
DRAINED = "The gateway shut down before this response could start; send the request again."
SWEEP_SECONDS = 5.0  # how often each replica looks for responses whose owner died
QUEUE_POLL_SECONDS = 0.25  # a queued response tries for its slot at least this often

Encode = Callable[[Event], bytes]


def _json(event: Event) -> bytes:
    return orjson.dumps(event)


Slot = Callable[[], Awaitable[None]]  # takes a queued turn's concurrency slot, or raises RateLimited


@dataclass(slots=True)
class _Run:
    turn: Turn
    task: asyncio.Task[None]
    waiting: bool  # queued: waiting for its concurrency slot
    cancelled: bool = False  # a cancel was made (once: a second would cut the first's cleanup)


class BackgroundRuns:
    """The background responses this process runs (``start``), and what every replica can do
    with any of them: ``current`` (its stored state, an orphan marked failed), ``follow`` (its
    events after a sequence number, until the terminal one) and ``cancel``. ``encode``: how an
    event is kept in the log (the transport's SSE frame; a follower writes it as it is)."""

    def __init__(self, events: BackgroundLog, store: ResponseStore, encode: Encode = _json) -> None:
        self.events = events
        self.store = store
        self.encode = encode
        self.accepting = True  # False once the process drains: no new background work
        self._running: dict[tuple[str, str], _Run] = {}
        self._gates: dict[str, asyncio.Lock] = {}  # per tenant: its queue, FIFO (asyncio.Lock is)
        self._waiting: dict[str, int] = {}  # per tenant: how many wait for a slot
        self._freed: dict[str, asyncio.Event] = {}  # per tenant: set when one of its turns ends
        self._watchers: list[asyncio.Task[None]] = []  # the sweeper, the control stream's reader

    def __len__(self) -> int:
        return len(self._running)

    @property
    def tasks(self) -> set[asyncio.Task[None]]:
        return {run.task for run in self._running.values()}

    def waiting(self, tenant: str) -> int:
        """How many of the tenant's background responses wait for a slot in this process."""
        return self._waiting.get(tenant, 0)

    # -- the owner --------------------------------------------------------------------------------
    def start(self, turn: Turn, tenant: str, done: Callable[[], None], slot: Slot | None = None) -> None:
        """Run ``turn`` (prepared with ``background``: stored, its lease claimed) detached; a
        ``queued`` one first waits for its concurrency slot (``slot``), in FIFO order among its
        tenant's. ``done`` is called once it has ended."""
        key = (tenant, turn.result.resource["id"])
        if slot is not None:
            self._waiting[tenant] = self._waiting.get(tenant, 0) + 1
        task = asyncio.create_task(self._run(turn, key, slot))
        self._running[key] = _Run(turn, task, slot is not None)

        def finished(_: asyncio.Task[None]) -> None:
            self._running.pop(key, None)
            freed = self._freed.pop(tenant, None)
            if freed is not None:
                freed.set()
            done()

        task.add_done_callback(finished)

    async def _run(self, turn: Turn, key: tuple[str, str], slot: Slot | None) -> None:
        beat = asyncio.create_task(self._beat(key))

        async def emit(event: Event) -> None:
            await self._append(key, [event])

        b = turn.builder
        ran = False
        try:
            if slot is not None:
                await self._admitted(key, slot, b.queued())
            ran = True
            await turn.run(emit, announce=True)
        except GatewayError as exc:  # failed before its first delta: stored failed by its hooks
            if not ran:  # never admitted (the process drains)
                await turn.discard(exc)
            await self._append(key, [*(b.start() if b.state is ResponseState.NEW else ()), *b.fail(exc)])
        except asyncio.CancelledError:  # cancelled while queued, or cut at shutdown
            if not ran:
                await turn.discard(None)
            with contextlib.suppress(Exception):
                await self._append(key, [*(b.start() if b.state is ResponseState.NEW else ()), *b.cancel()])
        except Exception:
            log.exception("background_turn_crashed", response_id=key[1])
        finally:
            beat.cancel()
            with contextlib.suppress(GatewayError):
                await self.events.drop(*key)

    async def _admitted(self, key: tuple[str, str], slot: Slot, queued: list[Event]) -> None:
        """Wait for the queued response's slot: the tenant's queue is served in order, its head
        trying again whenever one of the tenant's background turns here ends, and at least every
        ``QUEUE_POLL_SECONDS`` (a slot freed elsewhere). A draining process admits no more."""
        tenant = key[0]
        try:
            await self._append(key, queued)  # response.created, response.queued
            async with self._gates.setdefault(tenant, asyncio.Lock()):
                while True:
                    if not self.accepting:
                        raise ServiceUnavailable(DRAINED)
                    try:
                        await slot()
                        break
                    except RateLimited:
                        pass
                    freed = self._freed.setdefault(tenant, asyncio.Event())
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(freed.wait(), QUEUE_POLL_SECONDS)
        finally:
            left = self._waiting[tenant] - 1
            if left:
                self._waiting[tenant] = left
            else:
                del self._waiting[tenant]
                self._gates.pop(tenant, None)
            run = self._running.get(key)
            if run is not None:
                run.waiting = False

    async def _append(self, key: tuple[str, str], events: list[Event]) -> None:
        """Log ``events``; a log that cannot take them loses them (the stored response still ends
        right), rather than the response failing."""
        logged = [LoggedEvent(e["sequence_number"], self.encode(e), e["type"] in TERMINAL) for e in events]
        try:
            await self.events.append(*key, logged)
        except GatewayError as exc:
            log.warning("background_events_lost", response_id=key[1], code=exc.code, events=len(logged))

    async def _beat(self, key: tuple[str, str]) -> None:
        """Renew the lease every ``BEAT_SECONDS``; cancel the turn when a cancel is asked for."""
        while True:
            await asyncio.sleep(BEAT_SECONDS)
            try:
                beat = await self.events.beat(*key, LEASE_SECONDS)
                if beat is Beat.LOST:  # lapsed (the store was unreachable for a while): taken again
                    log.warning("background_lease_lost", response_id=key[1])
                    await self.events.claim(*key, LEASE_SECONDS)
            except GatewayError as exc:
                log.warning("background_beat_failed", response_id=key[1], code=exc.code)
                continue
            run = self._running.get(key)
            if beat is Beat.CANCEL and run is not None and not run.cancelled and self._cancel_here(key):
                log.info("background_cancel", response_id=key[1], via="beat")

    # -- any replica ------------------------------------------------------------------------------
    async def _owned(self, key: tuple[str, str]) -> bool:
        return key in self._running or await self.events.held(*key)

    async def current(self, tenant: str, response_id: str) -> StoredResponse | None:
        """The stored response; one still running whose owner is gone (no lease) is marked failed
        first (``OWNER_LOST``), its ``response.failed`` appended to its log."""
        key = (tenant, response_id)
        stored = await self.store.get(tenant, response_id)
        if stored is None or stored.resource.get("status") not in RUNNING or await self._owned(key):
            return stored
        stored = await self.store.get(tenant, response_id)  # again: it may have ended meanwhile
        if stored is None or stored.resource.get("status") not in RUNNING:
            return stored
        log.warning("background_owner_lost", response_id=response_id, tenant=tenant)
        res = stored.resource
        res["status"] = "failed"
        res["error"] = ServerError(OWNER_LOST).response_error()
        await self.store.put(stored)
        last = await self.events.last(tenant, response_id)
        event: Event = {
            "type": "response.failed",
            "sequence_number": last.seq + 1 if last is not None else 0,
            "response": res,
        }
        with contextlib.suppress(Exception):  # another reader may have logged it first
            await self._append(key, [event])
        return stored

    async def sweep(self, tenants: Iterable[str]) -> int:
        """Mark failed every response of ``tenants`` whose lease lapsed while it was still running
        (its owner died: ``current``), and drop it from the running index; how many were swept."""
        swept = 0
        for tenant in tenants:
            for rid in await self.events.stale(tenant):
                key = (tenant, rid)
                if await self._owned(key):  # its owner is back (it took the lease again)
                    continue
                await self.current(tenant, rid)
                await self.events.drop(tenant, rid)
                swept += 1
        return swept

    def start_watch(self, tenants: Callable[[], Iterable[str]]) -> None:
        """Sweep every ``SWEEP_SECONDS`` (``tenants``: the configured ones, read each time), and
        follow this process's control stream: a cancel sent from another replica cancels its
        response here at once."""

        async def sweeping() -> None:
            while True:
                await asyncio.sleep(SWEEP_SECONDS)
                try:
                    await self.sweep(tenants())
                except GatewayError as exc:
                    log.warning("background_sweep_failed", code=exc.code)

        async def listening() -> None:
            while True:
                if not self._running:  # nothing here to cancel: no Redis call while idle
                    await asyncio.sleep(FOLLOW_SECONDS)
                    continue
                try:
                    requests = await self.events.control(FOLLOW_SECONDS)
                except GatewayError as exc:
                    log.warning("background_control_failed", code=exc.code)
                    await asyncio.sleep(BEAT_SECONDS)
                    continue
                for key in requests:
                    run = self._running.get(key)
                    if run is not None and not run.cancelled and self._cancel_here(key):
                        log.info("background_cancel", response_id=key[1], via="control")

        self._watchers = [asyncio.create_task(sweeping()), asyncio.create_task(listening())]

    async def aclose(self) -> None:
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)

    async def follow(self, tenant: str, response_id: str, after: int) -> AsyncIterator[LoggedEvent]:
        """The response's logged events numbered above ``after``, then each new one as it is
        logged, until its terminal event (or, its log gone, until nothing more can come)."""
        key = (tenant, response_id)
        while True:
            batch = await self.events.read(tenant, response_id, after, FOLLOW_SECONDS)
            for event in batch:
                yield event
                if event.terminal:
                    return
                after = event.seq
            if batch or await self._owned(key):
                continue
            # no owner: its terminal event is logged by now, or it never will be (an orphan)
            await self.current(tenant, response_id)
            batch = await self.events.read(tenant, response_id, after, 0)
            for event in batch:
                yield event
                if event.terminal:
                    return
            if not batch:
                return

    async def cancel(self, tenant: str, response_id: str) -> bool:
        """Ask for the response to be cancelled, wherever it runs; False: nothing runs it."""
        if self._cancel_here((tenant, response_id)):
            return True
        return await self.events.cancel(tenant, response_id)

    def _cancel_here(self, key: tuple[str, str]) -> bool:
        """Cancel the response if this process runs it: a queued one at once (it never ran), a
        running one through its turn (``Turn.cancel``)."""
        run = self._running.get(key)
        if run is None or run.cancelled:
            return run is not None
        run.cancelled = True
        if run.waiting:
            run.task.cancel()
        else:
            run.turn.cancel()
        return True

    async def wait_ended(self, tenant: str, response_id: str, seconds: float) -> StoredResponse | None:
        """The stored response once it has left ``queued`` / ``in_progress`` (or as it is after
        ``seconds``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            stored = await self.current(tenant, response_id)
            if stored is None or stored.resource.get("status") not in RUNNING or loop.time() >= deadline:
                return stored
            await asyncio.sleep(0.05)


def snapshot(resource: dict[str, Any]) -> dict[str, Any]:
    """A copy of a running response's resource, as it is now (its output list copied too)."""
    return {**resource, "output": list(resource["output"])}
