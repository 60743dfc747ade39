"""The context-size estimator and fit_context (truncation "disabled" and "auto")."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.mock.adapter import MockAdapter
from compact.truncation import fit_context
from gateway.engine.context import Context
from gateway.engine.routing import Route
from gateway.engine.validate import check_call_ids
from gateway.kernel.errors import ContextLengthExceeded
from gateway.kernel.estimate import (
    FILE_TOKENS,
    IMAGE_LOW_TOKENS,
    IMAGE_TOKENS,
    ITEM_OVERHEAD,
    estimate,
    estimate_item,
)

Item = dict[str, Any]


def route(window: int) -> Route:
    return Route(model="m", provider="mock", adapter=MockAdapter(), upstream_model="m", context_window=window)


def msg(role: str, text: str, n: int = 0) -> Item:
    kind = "output_text" if role == "assistant" else "input_text"
    return {
        "type": "message",
        "id": f"msg_{role}_{n}",
        "role": role,
        "content": [{"type": kind, "text": text}],
    }


def call(cid: str, args: str = "{}") -> Item:
    return {"type": "function_call", "id": f"fc_{cid}", "call_id": cid, "name": "f", "arguments": args}


def out(cid: str, text: str = "ok") -> Item:
    return {"type": "function_call_output", "id": f"fco_{cid}", "call_id": cid, "output": text}


def test_estimate_item_counts_text_not_ids_or_types() -> None:
    a = msg("user", "x" * 40)
    b = {**a, "id": "msg_" + "y" * 400}
    assert estimate_item(a) == estimate_item(b) == 10 + ITEM_OVERHEAD
    assert estimate_item(call("c", "z" * 40)) == -(-(1 + 40) // 4) + ITEM_OVERHEAD  # name + arguments


def test_images_and_files_are_flat_costs() -> None:
    def with_part(part: Item) -> Item:
        return {"type": "message", "id": "m", "role": "user", "content": [part]}

    big = "data:image/png;base64," + "A" * 100_000
    assert estimate_item(with_part({"type": "input_image", "image_url": big})) == IMAGE_TOKENS + ITEM_OVERHEAD
    low = {"type": "input_image", "image_url": big, "detail": "low"}
    assert estimate_item(with_part(low)) == IMAGE_LOW_TOKENS + ITEM_OVERHEAD
    pdf = {"type": "input_file", "filename": "a.pdf", "file_data": "B" * 100_000}
    assert estimate_item(with_part(pdf)) == FILE_TOKENS + ITEM_OVERHEAD


def test_fits_returns_the_same_context() -> None:
    ctx = Context(history=[msg("user", "hi")], new_items=[msg("user", "there", 1)])
    assert fit_context(ctx, route(1000), "disabled") is ctx
    assert fit_context(ctx, route(1000), "auto") is ctx


def test_disabled_raises_context_length_exceeded() -> None:
    ctx = Context(history=[], new_items=[msg("user", "x" * 4000)])
    with pytest.raises(ContextLengthExceeded) as info:
        fit_context(ctx, route(256), "disabled")
    err = info.value
    assert err.status == 400 and err.code == "context_length_exceeded" and err.param == "input"
    assert "256" in err.message and "truncation" in err.message


def test_auto_drops_oldest_non_system_first() -> None:
    history = [msg("system", "be nice")] + [msg("user", "u" * 400, n) for n in range(5)]
    new = [msg("user", "latest", 99)]
    ctx = Context(history=history, new_items=new)
    fitted = fit_context(ctx, route(300), "auto")
    kept = [i["id"] for i in fitted.transcript]
    assert kept[0] == "msg_system_0" and kept[-1] == "msg_user_99"
    assert kept == ["msg_system_0", "msg_user_3", "msg_user_4", "msg_user_99"]
    assert estimate(fitted.transcript) <= 300
    assert fitted.new_items == new


def test_auto_drops_calls_together_with_their_outputs() -> None:
    history = [msg("user", "start"), call("c1", "a" * 600), call("c2"), out("c2"), out("c1", "b" * 600)]
    new = [msg("user", "next", 5)]
    fitted = fit_context(Context(history=history, new_items=new), route(256), "auto")
    kept = [i["id"] for i in fitted.transcript]
    assert "fc_c1" not in kept and "fco_c1" not in kept
    check_call_ids([], fitted.transcript)  # no orphan outputs


def test_auto_keeps_the_call_the_newest_item_answers() -> None:
    history = [msg("user", "u" * 2000), call("c1")]
    new = [out("c1")]
    fitted = fit_context(Context(history=history, new_items=new), route(256), "auto")
    assert [i["id"] for i in fitted.transcript] == ["fc_c1", "fco_c1"]


def test_auto_raises_when_even_the_newest_item_does_not_fit() -> None:
    ctx = Context(history=[msg("user", "old")], new_items=[msg("user", "x" * 8000, 1)])
    with pytest.raises(ContextLengthExceeded, match="even after dropping"):
        fit_context(ctx, route(256), "auto")


def test_auto_never_drops_system_or_developer_messages() -> None:
    ctx = Context(
        history=[msg("system", "s" * 2000), msg("developer", "d" * 2000)], new_items=[msg("user", "q", 1)]
    )
    with pytest.raises(ContextLengthExceeded):
        fit_context(ctx, route(256), "auto")


def test_reserved_tokens_shrink_the_budget() -> None:
    ctx = Context(history=[], new_items=[msg("user", "x" * 800)])
    fit_context(ctx, route(256), "disabled")
    with pytest.raises(ContextLengthExceeded):
        fit_context(ctx, route(256), "disabled", reserved=100)


@settings(deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["user", "system", "call"]), st.integers(0, 600)), min_size=1, max_size=25
    )
)
def test_auto_result_fits_keeps_order_and_pairs(spec: list[tuple[str, int]]) -> None:
    items: list[Item] = []
    for n, (kind, size) in enumerate(spec):
        if kind == "call":
            items += [call(f"c{n}", "a" * size), out(f"c{n}")]
        else:
            items.append(msg(kind, "t" * size, n))
    split = len(items) // 2
    ctx = Context(history=items[:split], new_items=items[split:])
    try:
        fitted = fit_context(ctx, route(400), "auto")
    except ContextLengthExceeded:
        return
    result = fitted.transcript
    assert estimate(result) <= 400
    assert [i for i in items if i in result] == result
    assert items[-1] in result
    assert all(i in result for i in items if i.get("role") == "system")
    check_call_ids([], result)


def test_a_known_history_size_is_not_recounted() -> None:
    # A WebSocket continuation carries its history's size from the connection cache: only the new
    # items are counted (a conversation of N turns costs N counts, not N²/2).
    history = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x" * 4000}]}]
    new = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    ctx = Context(history=history, new_items=new, history_tokens=10)
    assert fit_context(ctx, route(100), "disabled") is ctx
    assert ctx.tokens == 10 + estimate(new)
    uncounted = Context(history=history, new_items=new)
    with pytest.raises(ContextLengthExceeded):
        fit_context(uncounted, route(100), "disabled")
