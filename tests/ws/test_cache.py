"""The connection-local cache on its own: LRU bound, eviction, transcripts, item lookup."""

from __future__ import annotations

import pytest

from state.connection import ConnectionCache


def msg(item_id: str, role: str = "user") -> dict[str, object]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "id": item_id, "role": role, "content": [{"type": kind, "text": item_id}]}


def test_remember_keeps_the_transcript_plus_output_in_input_form() -> None:
    cache = ConnectionCache(4)
    output = {**msg("msg_out", "assistant"), "status": "completed"}
    output["content"] = [{"type": "output_text", "text": "hi", "annotations": []}]
    cache.remember("resp_1", [msg("msg_in")], [output])
    transcript = cache.get_transcript("resp_1")
    assert transcript is not None
    assert [i["id"] for i in transcript] == ["msg_in", "msg_out"]
    assert "status" not in transcript[1]
    assert transcript[1]["content"] == [{"type": "output_text", "text": "hi"}]


def test_lru_bound_drops_the_least_recently_used() -> None:
    cache = ConnectionCache(2)
    cache.put("a", [msg("1")])
    cache.put("b", [msg("2")])
    assert cache.get_transcript("a") is not None  # a is now the most recent
    cache.put("c", [msg("3")])
    assert "b" not in cache and "a" in cache and "c" in cache
    assert len(cache) == 2


def test_evict_and_clear() -> None:
    cache = ConnectionCache(3)
    cache.put("a", [msg("1")])
    cache.evict("a")
    cache.evict("never-there")
    assert cache.get_transcript("a") is None
    cache.put("b", [msg("2")])
    cache.clear()
    assert len(cache) == 0


def test_find_item_searches_newest_first() -> None:
    cache = ConnectionCache(3)
    old = msg("shared")
    new = {**msg("shared"), "marker": True}
    cache.put("a", [old])
    cache.put("b", [msg("x"), new])
    assert cache.find_item("shared") is new
    assert cache.find_item("x") is not None
    assert cache.find_item("missing") is None


def test_a_bound_of_zero_is_refused() -> None:
    with pytest.raises(ValueError):
        ConnectionCache(0)


def test_caches_are_independent() -> None:
    one, two = ConnectionCache(2), ConnectionCache(2)
    one.put("resp", [msg("1")])
    assert two.get_transcript("resp") is None
