"""Assemble the effective transcript of a turn: the ``previous_response_id`` chain (connection
cache first, then the store), resolved ``item_reference``s, opened compaction items, then the new
input — and check that every ``function_call_output`` answers a call in that context.

A compaction item is opened for the upstream but stored as the client sent it (sealed): the store
keeps no plaintext the client did not give it in plaintext, ``input_items`` lists what was sent, and
a chain or a reference that reaches it opens it again. An inline compaction item (made by
``context_management``) opens into a ``Window``: the whole context up to it, so it supersedes every
item before it, wherever they come from (the chain, or the client sending its history back)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.engine.validate import check_call_ids
from gateway.kernel.errors import (
    ErrorCode,
    InvalidEncryptedContent,
    InvalidRequest,
    PreviousResponseNotFound,
    chain_too_deep,
)
from gateway.kernel.estimate import estimate
from gateway.kernel.ids import new_id
from gateway.kernel.items import call_ids, message, normalize, output_as_input
from gateway.kernel.spec.request import CompactionItem, ItemReference
from state.base import ConnectionCache, ResponseStore, Transcript

Item = dict[str, Any]
CompactionOpener = Callable[[CompactionItem, str], list[Item]]


class Window(list[Item]):
    """What an inline compaction item opens into: the compacted context it replaces (kept
    messages, the summary, the recent items), superseding everything before the item."""


@dataclass(slots=True)
class Context:
    """A turn's assembled context. Truncation derives a shorter one with ``dataclasses.replace``,
    so what is stored (``stored_items``) never changes with what the upstream is shown."""

    history: list[Item]  # items inherited through previous_response_id
    new_items: list[Item]  # this turn's own input, normalized, compaction items opened
    stored_items: list[Item] | None = None  # what gets stored for it: the input as sent (sealed)
    calls: frozenset[str] = frozenset()  # call ids of the function calls in the transcript
    history_tokens: int | None = None  # the history's estimated tokens, when a cache knew them
    depth: int = 0  # responses in the previous_response_id chain
    tokens: int | None = None  # the transcript's estimated tokens, once fit_context counted them
    compacted: bool = False  # the window of an inline compaction (``compact_context``)
    root: str | None = None  # the chain's first response id, when the chain was read from the store

    @property
    def transcript(self) -> list[Item]:
        return self.history + self.new_items if self.history else self.new_items

    @property
    def input_items(self) -> list[Item]:
        """This turn's input as it is stored: what the client sent, compaction items sealed."""
        return self.new_items if self.stored_items is None else self.stored_items

    def estimated_tokens(self) -> int:
        """The transcript's estimated tokens: as counted already (``tokens``), else a cached
        history's plus the new items' (the history is not counted again), else counted now."""
        if self.tokens is not None:
            return self.tokens
        if self.history_tokens is not None:
            return self.history_tokens + estimate(self.new_items)
        return estimate(self.transcript)

    def ran_on(self) -> Transcript:
        """The transcript the turn ran on, as the connection cache keeps it."""
        return Transcript(items=self.transcript, tokens=self.tokens, calls=self.calls, depth=self.depth)


async def _history(
    previous_id: str,
    tenant: str,
    store: ResponseStore,
    cache: ConnectionCache | None,
    max_depth: int,
    open_compaction: CompactionOpener | None,
) -> tuple[Transcript, str | None]:
    """The chain's transcript, and its root's id when the store was read (a WebSocket's cached
    transcript does not know it)."""
    if cache is not None:
        cached = cache.get_transcript(previous_id)
        if cached is not None:
            if cached.depth > max_depth:  # the limit a stored chain has
                raise chain_too_deep(max_depth)
            return cached, None
    chain = await store.chain(tenant, previous_id, max_depth)
    if not chain:
        raise PreviousResponseNotFound(previous_id)
    if chain[-1].resource.get("status") in ("queued", "in_progress"):  # a background one, running
        raise InvalidRequest(
            f"Previous response '{previous_id}' is still in progress: continue it once it has ended.",
            param="previous_response_id",
            code=ErrorCode.INVALID_VALUE,
        )
    history: list[Item] = []
    param = "previous_response_id"
    for stored in chain:
        for item in stored.input_items:
            if item.get("type") == "compaction":
                history = _extend(history, _reopen(item, tenant, open_compaction, param))
            else:
                history.append(item)
        for o in stored.output_items:
            if o.get("type") == "compaction":  # an inline compaction's window
                history = _extend(history, _reopen(o, tenant, open_compaction, param))
            else:
                history.append(output_as_input(o))
    return Transcript(items=history, tokens=None, calls=call_ids(history), depth=len(chain)), chain[0].id


def _extend(items: list[Item], opened: list[Item]) -> list[Item]:
    """``items`` followed by an opened compaction item; a ``Window`` replaces them."""
    if isinstance(opened, Window):
        return list(opened)
    items.extend(opened)
    return items


def _reopen(item: Item, tenant: str, open_compaction: CompactionOpener | None, param: str) -> list[Item]:
    """A stored (sealed) compaction item opened again."""
    if open_compaction is None:
        raise InvalidEncryptedContent("Compaction items are not accepted here.", param=param)
    try:
        return open_compaction(CompactionItem.model_validate(item), tenant)
    except InvalidEncryptedContent as exc:
        exc.param = param
        raise


async def build_context(
    *,
    input_: str | list[Any] | None,
    previous_response_id: str | None,
    tenant: str,
    store: ResponseStore,
    cache: ConnectionCache | None = None,
    open_compaction: CompactionOpener | None = None,
    max_depth: int = 1000,
) -> Context:
    history: list[Item] = []
    known: Transcript | None = None
    root: str | None = None
    if previous_response_id:
        known, root = await _history(previous_response_id, tenant, store, cache, max_depth, open_compaction)
        history = known.items

    new_items: list[Item] = []
    stored_items: list[Item] | None = None
    if isinstance(input_, str):
        new_items.append(message("user", input_))
        stored_items = new_items
    elif input_:
        refs = [i.id for i in input_ if isinstance(i, ItemReference)]
        resolved = await _resolve_refs(refs, tenant, store, cache, history) if refs else {}
        stored: list[Item] = []  # the input as the client sent it (compaction items sealed)
        sealed = False
        for index, item in enumerate(input_):
            if isinstance(item, ItemReference):
                given = resolved[item.id]
            elif isinstance(item, CompactionItem):
                given = _sealed(item)
            else:
                given = normalize(item)
            stored.append(given)
            if given.get("type") == "compaction":
                sealed = True
                param = f"input[{index}].encrypted_content"  # the opener cannot know the index
                opened = _reopen(given, tenant, open_compaction, param)
                if isinstance(opened, Window):
                    # it carries the whole context before it: the chain and earlier input go
                    history, new_items, known = [], list(opened), None
                else:
                    new_items.extend(opened)
            else:
                new_items.append(given)
        stored_items = stored if sealed else new_items
    calls = check_call_ids(history, new_items, known.calls if known is not None else None)
    return Context(
        history=history,
        new_items=new_items,
        stored_items=stored_items,
        calls=calls,
        history_tokens=known.tokens if known is not None else None,
        depth=known.depth if known is not None else 0,
        root=root,
    )


def _sealed(item: CompactionItem) -> Item:
    out: Item = {
        "type": "compaction",
        "id": item.id or new_id("cmp"),
        "encrypted_content": item.encrypted_content,
    }
    if item.created_by is not None:
        out["created_by"] = item.created_by
    return out


async def _resolve_refs(
    ids: list[str], tenant: str, store: ResponseStore, cache: ConnectionCache | None, history: list[Item]
) -> dict[str, Item]:
    found: dict[str, Item] = {}
    local = {i.get("id"): i for i in history}
    missing = []
    for item_id in ids:
        hit = local.get(item_id) or (cache.find_item(item_id) if cache is not None else None)
        if hit is not None:
            found[item_id] = hit
        else:
            missing.append(item_id)
    if missing:
        stored = await store.get_items(tenant, missing)
        for item_id in missing:
            item = stored.get(item_id)
            if item is None:
                raise InvalidRequest(
                    f"Item with id '{item_id}' not found.", param="input", code=ErrorCode.ITEM_NOT_FOUND
                )
            found[item_id] = output_as_input(item) if "status" in item else item
    return found
