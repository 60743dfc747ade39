"""The state seams: the ResponseStore (what the gateway persists for ``store: true`` responses) and
the WebSocket's connection-local cache of transcripts (``ConnectionCache``, its entry ``Transcript``).

A stored response holds only its *own* input items and its output (inside ``resource``), plus
a pointer to its predecessor, so a chain of N turns costs O(N) bytes and is reassembled by
walking ``previous_response_id`` (``chain``), which implementations do in a bounded number of
round trips. Every read is scoped by tenant: another tenant's id is simply "not found".

Before a ``store: true`` response is generated, its write-ahead record (``PendingResponse``: no
conversation content) is written under the same id (``reserve``), so that a store that cannot keep
the answer is known before any upstream spend. Until the response's ``put`` replaces it, the record
is invisible to every read: ``get``, ``chain``, ``get_items`` and ``delete`` treat the id as
unknown. A turn that ends without a stored response drops it (``release``); one that never gets to
(a crash) leaves it to its TTL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(slots=True)
class StoredResponse:
    id: str
    tenant: str
    model: str
    previous_response_id: str | None
    input_items: list[dict[str, Any]]  # this turn's own input, normalized, every item with an "id"
    resource: dict[str, Any]  # the final ResponseResource (its "output" is the output items)
    created_at: int  # unix seconds
    stored_at: float  # unix seconds, float

    @property
    def output_items(self) -> list[dict[str, Any]]:
        output: list[dict[str, Any]] = self.resource.get("output", [])
        return output


@dataclass(slots=True, frozen=True)
class PendingResponse:
    """The write-ahead record of a ``store: true`` response being generated (status
    ``in_progress``): its id, tenant and ``created_at`` (unix seconds), nothing of its content."""

    id: str
    tenant: str
    created_at: int


@dataclass(slots=True, frozen=True)
class Transcript:
    """An effective transcript (the inherited chain + a turn's input + its output in input form)
    and what is already known of it, so that a continuation costs its new items, not the length of
    the conversation: the estimated tokens (``gateway/kernel/estimate.py``; None when not counted)
    and the ids of its function calls."""

    items: list[dict[str, Any]]
    tokens: int | None
    calls: frozenset[str]
    depth: int = 1  # responses in the chain this transcript ends (max_chain_depth applies to it)


class ConnectionCache(Protocol):
    """What a WebSocket keeps per connection (``state/connection.py``)."""

    def get_transcript(self, response_id: str) -> Transcript | None: ...

    def find_item(self, item_id: str) -> dict[str, Any] | None: ...

    def remember(self, response_id: str, ran_on: Transcript, output: list[dict[str, Any]]) -> None:
        """Cache a finished turn: the transcript it ran on, extended by its output items."""

    def evict(self, response_id: str) -> None: ...


class ResponseStore(Protocol):
    async def put(self, response: StoredResponse) -> None:
        """Persist (with the store's TTL). Raises ServiceUnavailable when the backend is down.

        A chain lives as long as its newest member: storing a response also raises the TTL of
        every stored ancestor on its ``previous_response_id`` chain (and of their item-index
        entries) to at least the new response's, never shortening a longer one. This is done
        here, not when ``chain`` is read for a continuation, because a put is the one event
        every continuation goes through: a WebSocket turn continues from its connection cache
        without calling ``chain``, a read-time extension would leave the ancestors expiring
        before a response whose generation outlasted the read, and a continuation that fails or
        is not stored (``store: false``) should not prolong anything. Reads (``get``, ``chain``,
        ``get_items``) never extend a TTL."""

    async def reserve(self, pending: PendingResponse, ttl_seconds: float) -> None:
        """Write ``pending``'s write-ahead record, expiring after ``ttl_seconds`` unless a ``put``
        of the same id replaces it first (then it has the put's TTL). Raises ServiceUnavailable
        when the backend is down: the response cannot be stored, so it must not be generated."""

    async def release(self, tenant: str, response_id: str) -> None:
        """Drop the write-ahead record of a response that will not be stored (it failed, or was
        cancelled); a stored response by that id is left alone. Raises ServiceUnavailable when
        the backend is down (the record then expires with its TTL)."""

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None: ...

    async def chain(self, tenant: str, response_id: str, max_depth: int) -> list[StoredResponse] | None:
        """The response and all its ancestors, oldest first; None when it or any ancestor is
        missing, expired or another tenant's. Raises InvalidRequest when deeper than max_depth."""

    async def delete(self, tenant: str, response_id: str) -> bool: ...

    async def get_items(self, tenant: str, item_ids: list[str]) -> dict[str, dict[str, Any]]:
        """Stored input or output items by item id (for ``item_reference``); missing ids absent."""

    async def ping(self) -> bool:
        """True when the backend answers (readiness)."""

    async def aclose(self) -> None: ...
