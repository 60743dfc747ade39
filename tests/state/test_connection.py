"""The WebSocket's connection-local cache (state/connection.py) on its own: the LRU bound and the
order it evicts in, recency refreshed by a lookup, item lookup newest first, evict and clear, and
``remember`` building a transcript from the turn it ran on plus its output."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.kernel.estimate import estimate
from state.base import Transcript
from state.connection import ConnectionCache

Item = dict[str, Any]


def msg(item_id: str, role: str = "user") -> Item:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "id": item_id, "role": role, "content": [{"type": kind, "text": item_id}]}


def t(*items: Item) -> Transcript:
    return Transcript(items=list(items), tokens=None, calls=frozenset())


def ran_on(
    history: list[Item],
    new: list[Item],
    *,
    tokens: int | None = None,
    calls: frozenset[str] = frozenset(),
    depth: int = 0,
) -> Transcript:
    """What ``remember`` is given about the turn it caches: the transcript the turn ran on
    (``history`` then ``new``), its estimated tokens (None: never counted), the call ids in it and
    the depth of the chain it continued. The one place that knows the type ``remember`` takes."""
    return Transcript(items=[*history, *new], calls=calls, tokens=tokens, depth=depth)


def present(cache: ConnectionCache, *ids: str) -> list[str]:
    return [i for i in ids if i in cache]


# -- the bound -----------------------------------------------------------------------------------
@pytest.mark.parametrize("bound", [0, -1])
def test_a_bound_below_one_is_refused(bound: int) -> None:
    with pytest.raises(ValueError):
        ConnectionCache(bound)


def test_a_bound_of_one_keeps_only_the_latest() -> None:
    cache = ConnectionCache(1)
    cache.put("a", t(msg("1")))
    cache.put("b", t(msg("2")))
    assert present(cache, "a", "b") == ["b"] and len(cache) == 1


def test_puts_beyond_the_bound_evict_the_oldest_first() -> None:
    cache = ConnectionCache(3)
    for rid in "abc":
        cache.put(rid, t(msg(rid)))
    assert len(cache) == 3
    cache.put("d", t(msg("d")))
    assert present(cache, "a", "b", "c", "d") == ["b", "c", "d"]
    cache.put("e", t(msg("e")))
    assert present(cache, "a", "b", "c", "d", "e") == ["c", "d", "e"]
    assert len(cache) == 3


def test_putting_an_id_again_replaces_it_and_makes_it_the_newest() -> None:
    cache = ConnectionCache(2)
    first, second = t(msg("1")), t(msg("2"))
    cache.put("a", first)
    cache.put("b", t(msg("b")))
    cache.put("a", second)
    assert len(cache) == 2 and cache.get_transcript("a") is second
    cache.put("c", t(msg("c")))
    assert present(cache, "a", "b", "c") == ["a", "c"]  # b, not a, was the oldest


def test_lru_bound_drops_the_least_recently_used() -> None:
    cache = ConnectionCache(2)
    cache.put("a", t(msg("1")))
    cache.put("b", t(msg("2")))
    assert cache.get_transcript("a") is not None  # a is now the most recent
    cache.put("c", t(msg("3")))
    assert "b" not in cache and "a" in cache and "c" in cache
    assert len(cache) == 2


def test_get_transcript_refreshes_recency_and_a_miss_changes_nothing() -> None:
    cache = ConnectionCache(3)
    kept = t(msg("1"))
    cache.put("a", kept)
    cache.put("b", t(msg("2")))
    cache.put("c", t(msg("3")))
    assert cache.get_transcript("a") is kept  # order now b, c, a
    assert cache.get_transcript("missing") is None
    assert len(cache) == 3
    cache.put("d", t(msg("4")))
    assert present(cache, "a", "b", "c", "d") == ["a", "c", "d"]
    cache.put("e", t(msg("5")))
    assert present(cache, "a", "b", "c", "d", "e") == ["a", "d", "e"]


# -- item lookup -----------------------------------------------------------------------------------
def test_find_item_searches_newest_first() -> None:
    cache = ConnectionCache(3)
    old = msg("shared")
    new = {**msg("shared"), "marker": True}
    cache.put("a", t(old))
    cache.put("b", t(msg("x"), new))
    assert cache.find_item("shared") is new
    assert cache.find_item("x") is not None
    assert cache.find_item("missing") is None


def test_find_item_follows_recency_and_reaches_older_entries() -> None:
    cache = ConnectionCache(3)
    old, new = msg("shared"), {**msg("shared"), "marker": True}
    only_old = msg("only-in-a")
    cache.put("a", t(only_old, old))
    cache.put("b", t(new))
    assert cache.find_item("shared") is new
    cache.get_transcript("a")  # a is the most recently used now
    assert cache.find_item("shared") is old
    assert cache.find_item("only-in-a") is only_old


# -- evict and clear -------------------------------------------------------------------------------
def test_evict_and_clear() -> None:
    cache = ConnectionCache(3)
    cache.put("a", t(msg("1")))
    cache.evict("a")
    cache.evict("never-there")
    assert cache.get_transcript("a") is None
    cache.put("b", t(msg("2")))
    cache.clear()
    assert len(cache) == 0


def test_evict_drops_one_entry_and_its_items() -> None:
    cache = ConnectionCache(3)
    cache.put("a", t(msg("in-a")))
    cache.put("b", t(msg("in-b")))
    cache.evict("a")
    assert present(cache, "a", "b") == ["b"] and len(cache) == 1
    assert cache.find_item("in-a") is None
    assert cache.find_item("in-b") is not None
    cache.evict("never-there")  # not an error
    assert len(cache) == 1


def test_clear_empties_the_cache_and_leaves_it_usable() -> None:
    cache = ConnectionCache(2)
    cache.put("a", t(msg("1")))
    cache.put("b", t(msg("2")))
    cache.clear()
    assert len(cache) == 0 and present(cache, "a", "b") == []
    assert cache.get_transcript("a") is None and cache.find_item("1") is None
    cache.put("c", t(msg("3")))
    cache.put("d", t(msg("4")))
    assert present(cache, "c", "d") == ["c", "d"]  # the bound still holds, from empty


def test_caches_are_independent() -> None:
    one, two = ConnectionCache(2), ConnectionCache(2)
    one.put("resp", t(msg("1")))
    assert two.get_transcript("resp") is None


# -- remember: the transcript of a finished turn ---------------------------------------------------
def test_remember_keeps_the_transcript_plus_output_in_input_form() -> None:
    cache = ConnectionCache(4)
    history, new = [msg("msg_old"), msg("msg_old_out", "assistant")], [msg("msg_in")]
    text = {**msg("msg_out", "assistant"), "status": "completed"}
    text["content"] = [{"type": "output_text", "text": "hi", "annotations": []}]
    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"}
    cache.remember("resp_1", ran_on(history, new, depth=2), [text, {**call, "status": "completed"}])
    transcript = cache.get_transcript("resp_1")
    assert transcript is not None
    items = transcript.items
    assert [i["id"] for i in items] == ["msg_old", "msg_old_out", "msg_in", "msg_out", "fc_1"]
    assert items[0] is history[0] and items[2] is new[0]  # shared with the turn, not copied
    assert "status" not in items[3] and "status" not in items[4]
    assert items[3]["content"] == [{"type": "output_text", "text": "hi"}]
    assert items[4] == call
    assert transcript.tokens is None  # the turn's context was never counted
    assert transcript.calls == {"c1"}  # an uncounted transcript still knows its calls
    assert transcript.depth == 3  # one response more than the chain it continued
    fresh = ConnectionCache(1)
    fresh.remember("resp_0", ran_on([], [msg("m")]), [])
    assert fresh.get_transcript("resp_0") == Transcript(
        items=[msg("m")], tokens=None, calls=frozenset(), depth=1
    )


def test_remember_adds_the_output_to_the_counted_tokens_and_call_ids() -> None:
    cache = ConnectionCache(4)
    call = {"type": "function_call", "id": "fc_1", "call_id": "c2", "name": "f", "arguments": "{}"}
    counted = ran_on([], [msg("msg_in")], calls=frozenset({"c1"}), tokens=100)
    cache.remember("resp_1", counted, [{**call, "status": "completed"}])
    transcript = cache.get_transcript("resp_1")
    assert transcript is not None
    assert transcript.tokens == 100 + estimate([call])
    assert transcript.calls == {"c1", "c2"}
    answer = msg("msg_out", "assistant")
    cache.remember("resp_2", ran_on([], [msg("msg_in")], calls=frozenset({"c1"}), tokens=0), [answer])
    plain = cache.get_transcript("resp_2")
    assert plain is not None
    assert plain.tokens == estimate([answer]) and plain.calls == {"c1"}  # no new calls: the same set
