"""In-process ResponseStore: encoded blobs in an LRU bounded by entry count and total bytes,
each with a TTL on the monotonic clock, plus an item-id index for ``get_items``.

A chain lives as long as its newest member: ``put`` raises each ancestor's expiry to the new
response's (the item index has no expiry of its own; it follows its response's entry).

Write-ahead records (``reserve``) are kept apart, as an expiry by id: they hold nothing to read and
take no room in the LRU's bounds.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.kernel.errors import chain_too_deep
from state import codec
from state.base import PendingResponse, StoredResponse

log = logging.getLogger(__name__)

_Key = tuple[str, str]  # (tenant, id)


@dataclass(slots=True)
class _Entry:
    blob: bytes
    prev: str | None
    expires: float
    item_ids: tuple[str, ...]


class MemoryStore:
    """Bounded, TTL'd and tenant-scoped. Data is kept encoded, so callers never share objects
    with the store and ``max_bytes`` counts real payload bytes."""

    def __init__(
        self,
        *,
        max_entries: int = 10_000,
        max_bytes: int = 256 * 1024 * 1024,
        ttl_seconds: float = 30 * 24 * 3600,
        max_chain_depth: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_seconds = ttl_seconds
        self.max_chain_depth = max_chain_depth  # how far a put extends ancestors' expiry
        self._clock = clock
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()  # least recently used first
        self._items: dict[_Key, str] = {}  # (tenant, item id) -> response id
        self._pending: dict[_Key, float] = {}  # write-ahead records: their expiry, oldest first
        self._bytes = 0

    # -- introspection (tests, metrics) ------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    @property
    def total_bytes(self) -> int:
        return self._bytes

    def pending(self, tenant: str, response_id: str) -> bool:
        """A live write-ahead record by that id."""
        expires = self._pending.get((tenant, response_id))
        return expires is not None and expires > self._clock()

    # -- internals ---------------------------------------------------------------------------
    def _remove(self, key: _Key) -> None:
        entry = self._entries.pop(key)
        self._bytes -= len(entry.blob)
        tenant, response_id = key
        for item_id in entry.item_ids:
            # another response may have re-used the item id since; leave its pointer alone
            if self._items.get((tenant, item_id)) == response_id:
                del self._items[(tenant, item_id)]

    def _live(self, key: _Key, now: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= now:
            self._remove(key)
            return None
        self._entries.move_to_end(key)
        return entry

    def _extend_ancestors(self, tenant: str, response_id: str | None, expires: float, now: float) -> None:
        """Raise the expiry of ``response_id`` and its ancestors (up to ``max_chain_depth`` of them,
        stopping at the first missing one) to at least ``expires``. Like a ``chain`` read, this
        counts as a use for the LRU, so a live conversation is not evicted from under its newest
        turn either."""
        current = response_id
        for _ in range(self.max_chain_depth):
            if current is None:
                return
            entry = self._live((tenant, current), now)
            if entry is None:
                return
            entry.expires = max(entry.expires, expires)
            current = entry.prev

    def _evict(self, now: float) -> None:
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            over = len(self._entries) > self.max_entries or self._bytes > self.max_bytes
            if not over and entry.expires > now:
                return
            self._remove(key)

    # -- ResponseStore -----------------------------------------------------------------------
    async def reserve(self, pending: PendingResponse, ttl_seconds: float) -> None:
        now = self._clock()
        records = self._pending
        # drop the expired ones at the front (left by turns that never ended): amortized O(1)
        while records:
            oldest = next(iter(records))
            if records[oldest] > now:
                break
            del records[oldest]
        records[(pending.tenant, pending.id)] = now + ttl_seconds

    async def release(self, tenant: str, response_id: str) -> None:
        self._pending.pop((tenant, response_id), None)

    async def put(self, response: StoredResponse) -> None:
        blob = codec.encode(response)
        key = (response.tenant, response.id)
        self._pending.pop(key, None)
        if key in self._entries:
            self._remove(key)
        if len(blob) > self.max_bytes:
            log.warning("response %s (%d bytes) exceeds memory_max_bytes; not stored", key[1], len(blob))
            return
        now = self._clock()
        expires = now + self.ttl_seconds
        self._extend_ancestors(response.tenant, response.previous_response_id, expires, now)
        ids = tuple(codec.item_ids(response))
        self._entries[key] = _Entry(blob, response.previous_response_id, expires, ids)
        self._bytes += len(blob)
        for item_id in ids:
            self._items[(response.tenant, item_id)] = response.id
        self._evict(now)

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        entry = self._live((tenant, response_id), self._clock())
        return codec.decode(entry.blob) if entry else None

    async def chain(self, tenant: str, response_id: str, max_depth: int) -> list[StoredResponse] | None:
        now = self._clock()
        blobs: list[bytes] = []
        current: str | None = response_id
        while current is not None:
            entry = self._live((tenant, current), now)
            if entry is None:
                return None
            if len(blobs) >= max_depth:
                raise chain_too_deep(max_depth)
            blobs.append(entry.blob)
            current = entry.prev
        out: list[StoredResponse] = []
        for blob in reversed(blobs):
            decoded = codec.decode(blob)
            if decoded is None:
                return None
            out.append(decoded)
        return out

    async def delete(self, tenant: str, response_id: str) -> bool:
        key = (tenant, response_id)
        if self._live(key, self._clock()) is None:
            return False
        self._remove(key)
        return True

    async def get_items(self, tenant: str, item_ids: list[str]) -> dict[str, dict[str, Any]]:
        now = self._clock()
        by_response: dict[str, set[str]] = {}
        for item_id in item_ids:
            response_id = self._items.get((tenant, item_id))
            if response_id is not None:
                by_response.setdefault(response_id, set()).add(item_id)
        found: dict[str, dict[str, Any]] = {}
        for response_id, wanted in by_response.items():
            entry = self._live((tenant, response_id), now)
            decoded = codec.decode(entry.blob) if entry else None
            if decoded is not None:
                found.update(codec.find_items(decoded, wanted))
        return found

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        self._entries.clear()
        self._items.clear()
        self._pending.clear()
        self._bytes = 0
