"""The connection-local cache on its own: LRU bound, eviction, transcripts, item lookup."""

from __future__ import annotations

import pytest

from gateway.engine.context import Context, Transcript
from gateway.kernel.estimate import estimate
from state.connection import ConnectionCache


def msg(item_id: str, role: str = "user") -> dict[str, object]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "id": item_id, "role": role, "content": [{"type": kind, "text": item_id}]}


def t(*items: dict[str, object]) -> Transcript:
    return Transcript(items=list(items), tokens=None, calls=frozenset())


def test_remember_keeps_the_transcript_plus_output_in_input_form() -> None:
    cache = ConnectionCache(4)
    output = {**msg("msg_out", "assistant"), "status": "completed"}
    output["content"] = [{"type": "output_text", "text": "hi", "annotations": []}]
    cache.remember("resp_1", Context(history=[], new_items=[msg("msg_in")]), [output])
    transcript = cache.get_transcript("resp_1")
    assert transcript is not None
    items = transcript.items
    assert [i["id"] for i in items] == ["msg_in", "msg_out"]
    assert "status" not in items[1]
    assert items[1]["content"] == [{"type": "output_text", "text": "hi"}]
    assert transcript.tokens is None  # the turn's context was never counted


def test_remember_adds_the_output_to_the_counted_tokens_and_call_ids() -> None:
    cache = ConnectionCache(4)
    call = {"type": "function_call", "id": "fc_1", "call_id": "c2", "name": "f", "arguments": "{}"}
    ctx = Context(history=[], new_items=[msg("msg_in")], calls=frozenset({"c1"}), tokens=100)
    cache.remember("resp_1", ctx, [{**call, "status": "completed"}])
    transcript = cache.get_transcript("resp_1")
    assert transcript is not None
    assert transcript.tokens == 100 + estimate([call])
    assert transcript.calls == {"c1", "c2"}


def test_lru_bound_drops_the_least_recently_used() -> None:
    cache = ConnectionCache(2)
    cache.put("a", t(msg("1")))
    cache.put("b", t(msg("2")))
    assert cache.get_transcript("a") is not None  # a is now the most recent
    cache.put("c", t(msg("3")))
    assert "b" not in cache and "a" in cache and "c" in cache
    assert len(cache) == 2


def test_evict_and_clear() -> None:
    cache = ConnectionCache(3)
    cache.put("a", t(msg("1")))
    cache.evict("a")
    cache.evict("never-there")
    assert cache.get_transcript("a") is None
    cache.put("b", t(msg("2")))
    cache.clear()
    assert len(cache) == 0


def test_find_item_searches_newest_first() -> None:
    cache = ConnectionCache(3)
    old = msg("shared")
    new = {**msg("shared"), "marker": True}
    cache.put("a", t(old))
    cache.put("b", t(msg("x"), new))
    assert cache.find_item("shared") is new
    assert cache.find_item("x") is not None
    assert cache.find_item("missing") is None


def test_a_bound_of_zero_is_refused() -> None:
    with pytest.raises(ValueError):
        ConnectionCache(0)


def test_caches_are_independent() -> None:
    one, two = ConnectionCache(2), ConnectionCache(2)
    one.put("resp", t(msg("1")))
    assert two.get_transcript("resp") is None
