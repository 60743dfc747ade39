"""The pieces of inline compaction without a server: the builder's compaction announcement, what
a window item opens into, how it supersedes what comes before it, and the threshold."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.deltas import Finish, TextDelta, Usage
from compact.inline import threshold_of
from compact.opener import SUMMARY_MESSAGE_HEADER, Opener
from compact.seal import Sealer
from gateway.engine.context import Window, build_context
from gateway.kernel.errors import IllegalTransition
from gateway.kernel.spec.request import CompactionItem, CreateResponseBody
from state.connection import ConnectionCache
from state.memory import MemoryStore
from tests.engine.helpers import fresh_builder

ITEM = {"type": "compaction", "id": "cmp_1", "encrypted_content": "v1.k.sealed", "created_by": "m"}


def test_the_compaction_item_is_output_zero_and_the_answer_follows() -> None:
    b = fresh_builder()
    events = b.start() + b.compaction(ITEM)
    events += b.feed(TextDelta("hi")) + b.feed(Usage(3, 1)) + b.feed(Finish("stop")) + b.finish()
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[2:5]] == [
        "response.output_item.added",
        "response.compaction.compacting",
        "response.output_item.done",
    ]
    added, compacting, done = events[2:5]
    assert added["item"] == {**ITEM, "encrypted_content": "", "status": "in_progress"}
    assert compacting == {
        "type": "response.compaction.compacting",
        "sequence_number": 3,
        "item_id": "cmp_1",
        "output_index": 0,
    }
    assert done["item"] == {**ITEM, "status": "completed"} and done["output_index"] == 0
    assert events[5]["type"] == "response.output_item.added" and events[5]["output_index"] == 1
    output = events[-1]["response"]["output"]
    assert [o["type"] for o in output] == ["compaction", "message"]
    assert "status" not in ITEM  # the caller's dict is not changed


def test_a_compaction_item_only_comes_first() -> None:
    b = fresh_builder()
    with pytest.raises(IllegalTransition):
        b.compaction(ITEM)  # before start()
    b.start()
    b.feed(TextDelta("hi"))
    with pytest.raises(IllegalTransition):
        b.compaction(ITEM)  # after output


def sealer() -> Sealer:
    return Sealer([bytes(range(32))])


def window_item(s: Sealer, tenant: str = "default") -> CompactionItem:
    payload: dict[str, Any] = {
        "v": 1,
        "id": "cmp_abc",
        "summary": "they talked",
        "window": {
            "pinned": [
                {
                    "type": "message",
                    "id": "msg_s",
                    "role": "system",
                    "content": [{"type": "input_text", "text": "S"}],
                }
            ],
            "recent": [
                {
                    "type": "message",
                    "id": "msg_r",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "R"}],
                }
            ],
        },
    }
    return CompactionItem(type="compaction", id="cmp_abc", encrypted_content=s.seal(payload, tenant))


def test_a_window_item_opens_into_its_whole_window() -> None:
    s = sealer()
    opened = Opener(s)(window_item(s), "default")
    assert isinstance(opened, Window)
    assert [i["id"] for i in opened] == ["msg_s", "cmp_abc", "msg_r"]
    assert opened[1]["content"][0]["text"] == SUMMARY_MESSAGE_HEADER + "they talked"
    # a /v1/responses/compact item (no window) opens into its summary alone, as before
    plain = CompactionItem(
        type="compaction", encrypted_content=s.seal({"v": 1, "id": "cmp_x", "summary": "y"}, "default")
    )
    assert not isinstance(Opener(s)(plain, "default"), Window)


async def test_a_window_item_in_the_input_supersedes_everything_before_it() -> None:
    s = sealer()
    body = CreateResponseBody.model_validate(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "old one"},
                {"type": "function_call", "call_id": "c0", "name": "f", "arguments": "{}"},
                window_item(s).model_dump(exclude_none=True),
                {"role": "user", "content": "new"},
            ],
        },
        strict=True,
    )
    ctx = await build_context(
        input_=body.input,
        previous_response_id=None,
        tenant="default",
        store=MemoryStore(),
        cache=ConnectionCache(4),
        open_compaction=Opener(s),
    )
    texts = [i["content"][0]["text"] for i in ctx.transcript]
    assert texts == ["S", SUMMARY_MESSAGE_HEADER + "they talked", "R", "new"]
    assert ctx.calls == frozenset()  # the superseded call is gone from the context
    assert len(ctx.input_items) == 4  # what is stored stays what was sent


def test_the_threshold_and_its_default() -> None:
    route: Any = type("R", (), {"context_window": 10_000})()
    body = CreateResponseBody(model="m", input="x")
    assert threshold_of(body, route) is None
    body = CreateResponseBody.model_validate({"model": "m", "context_management": [{"type": "compaction"}]})
    assert threshold_of(body, route) == 8_000
    body = CreateResponseBody.model_validate(
        {"model": "m", "context_management": [{"type": "compaction", "compact_threshold": 5}]}
    )
    assert threshold_of(body, route) == 5
