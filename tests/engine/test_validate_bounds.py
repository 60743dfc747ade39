"""A Chat Completions body's own bytes bound its element count and its nesting: ``chat_request``
skips the count or the walk when they prove the body under a limit. Skipping must never change the
verdict: the same body, with its bytes or without, is accepted or refused alike, with the same
error, at the smallest limits a configuration allows."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.engine.validate import chat_request
from gateway.kernel.errors import InvalidRequest
from gateway.kernel.settings import Limits

SMALLEST = Limits(max_json_depth=8, max_input_elements=10)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=30,
)
parts = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=2)}), max_size=4)
messages = st.lists(
    st.fixed_dictionaries({"role": st.just("user"), "content": st.text(max_size=2) | parts}),
    min_size=1,
    max_size=12,
)


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value] if depth % 2 else {"k": value}
    return value


bodies = st.fixed_dictionaries(
    {"model": st.just("m"), "messages": messages},
    optional={
        "extra": json_values,
        "deep": st.integers(1, 12).map(_nested),  # around the smallest depth limit, 8
        "metadata": st.dictionaries(st.text(max_size=2), st.text(max_size=2)),
    },
)


def _verdict(data: dict[str, Any], limits: Limits, sent: bytes | None) -> tuple[str, str | None] | None:
    try:
        chat_request(data, limits, sent=sent)
    except InvalidRequest as err:
        return err.code.value, err.param
    return None


@settings(max_examples=300, deadline=None)
@given(bodies)
def test_a_body_s_bytes_never_change_the_verdict(body: dict[str, Any]) -> None:
    sent = orjson.dumps(body)
    assert _verdict(orjson.loads(sent), SMALLEST, sent) == _verdict(orjson.loads(sent), SMALLEST, None)


@pytest.mark.parametrize("limits", [SMALLEST, Limits()], ids=["smallest", "defaults"])
def test_just_over_each_limit_is_refused_with_its_bytes(limits: Limits) -> None:
    """The tightest bodies over a limit: one nesting level or one element too many, in as few
    bytes as JSON allows."""
    depth = limits.max_json_depth
    deep = {"model": "m", "messages": [{"role": "user", "content": "x"}], "x": [[]]}
    nested: Any = []
    for _ in range(depth):
        nested = [nested]
    deep["x"] = nested
    sent = orjson.dumps(deep)
    assert _verdict(deep, limits, sent) == ("nesting_too_deep", "x")
    deep["x"] = nested[0]  # at the limit: accepted
    assert _verdict(deep, limits, orjson.dumps(deep)) is None
    many = {"model": "m", "messages": [{"role": "user", "content": ""}] * (limits.max_input_elements + 1)}
    sent = orjson.dumps(many)
    assert _verdict(many, limits, sent) == ("too_many_input_items", "messages")
    many["messages"] = many["messages"][1:]  # at the limit: accepted
    assert _verdict(many, limits, orjson.dumps(many)) is None
