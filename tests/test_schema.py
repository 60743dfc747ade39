"""The schema check (tests/schema.py) itself: it comes with the test extra (no file beside the
repository), it knows every component and streaming event, and it still refuses what the
2026-04-24 document refuses: each case below is a real gateway output made wrong in one place."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import openresponses_types
import pytest

from tests.engine.test_builder_schema import RUNS
from tests.schema import (
    SPEC_VERSION,
    assert_event,
    assert_schema,
    components,
    event_components,
    schema_errors,
)

Obj = dict[str, Any]


def run(name: str) -> tuple[list[Obj], Obj]:
    """The events and the final ResponseResource of one builder scenario (copies)."""
    events, final = next((e, f) for n, e, f in RUNS if n == name)
    return copy.deepcopy(events), copy.deepcopy(final)


def event(name: str, kind: str) -> Obj:
    return next(e for e in run(name)[0] if e["type"] == kind)


def test_the_schemas_are_the_dated_documents_from_the_test_extra() -> None:
    assert openresponses_types.__spec_version__ == SPEC_VERSION == "2026-04-24"
    names = components()
    for name in ("ResponseResource", "CompactResource", "ErrorPayload", "WebSocketErrorEvent", "Error"):
        assert name in names
    assert set(names["Error"]["required"]) == {"code", "message"}  # the component, not the WS payload
    assert len(event_components()) == 24  # every *StreamingEvent of the document, one type each
    assert event_components()["error"] == "ErrorStreamingEvent"


def test_real_outputs_pass() -> None:
    for _, events, final in RUNS:
        for e in events:
            assert_event(e)
        assert_schema("ResponseResource", final)
    assert_schema("WebSocketErrorEvent", {"type": "error", "status": 400, "error": WS_ERROR})


WS_ERROR = {"type": "invalid_request_error", "code": "bad", "message": "Bad.", "param": None}


def _set(path: tuple[str | int, ...], value: Any) -> Callable[[Obj], None]:
    def change(obj: Obj) -> None:
        node: Any = obj  # a JSON tree: dicts and lists
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


def _drop(path: tuple[str | int, ...]) -> Callable[[Obj], None]:
    def change(obj: Obj) -> None:
        node: Any = obj  # a JSON tree: dicts and lists
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return change


# (scenario, the wrong thing, how it is made wrong): each of a resource
WRONG_RESOURCES = [
    ("text", "no status", _drop(("status",))),
    ("text", "created_at as text", _set(("created_at",), "1796174253")),
    ("text", "a status that is a number", _set(("status",), 3)),
    ("text", "output not a list", _set(("output",), "none")),
    ("text", "an item of no known type", _set(("output", 0, "type"), "bogus")),
    ("text", "a message without content", _drop(("output", 0, "content"))),
    ("text", "an output_text without annotations", _drop(("output", 0, "content", 0, "annotations"))),
    ("text", "logprobs null (optional, not nullable)", _set(("output", 0, "content", 0, "logprobs"), None)),
    ("text", "a role outside the enum", _set(("output", 0, "role"), "robot")),
    ("text", "usage without input_tokens", _drop(("usage", "input_tokens"))),
    ("text", "a tool_choice outside the enum", _set(("tool_choice",), "sometimes")),
    ("text", "no previous_response_id (required, nullable)", _drop(("previous_response_id",))),
    ("calls", "a call's arguments as an object", _set(("output", 1, "arguments"), {"a": 1})),
    ("encrypted", "encrypted_content null", _set(("output", 0, "encrypted_content"), None)),
    ("fail mid-text", "an error without its code", _drop(("error", "code"))),
]


@pytest.mark.parametrize(
    ("scenario", "change"), [(s, c) for s, _, c in WRONG_RESOURCES], ids=[w for _, w, _ in WRONG_RESOURCES]
)
def test_a_wrong_resource_fails(scenario: str, change: Callable[[Obj], None]) -> None:
    _, final = run(scenario)
    assert_schema("ResponseResource", final)  # right as the builder made it
    change(final)
    with pytest.raises(AssertionError):
        assert_schema("ResponseResource", final)


WRONG_EVENTS = [
    ("text", "response.output_text.delta", "sequence_number as text", _set(("sequence_number",), "4")),
    ("text", "response.output_text.delta", "no item_id", _drop(("item_id",))),
    ("text", "response.output_text.delta", "a delta that is no string", _set(("delta",), 7)),
    ("text", "response.output_text.delta", "logprobs null", _set(("logprobs",), None)),
    ("text", "response.completed", "a response without an id", _drop(("response", "id"))),
    ("text", "response.content_part.added", "a part of no known type", _set(("part", "type"), "x")),
    ("text", "response.output_item.done", "an item without status", _drop(("item", "status"))),
    ("fail mid-text", "error", "an error event without its code", _drop(("error", "code"))),
    ("calls", "response.function_call_arguments.done", "no arguments", _drop(("arguments",))),
]


@pytest.mark.parametrize(
    ("scenario", "kind", "change"),
    [(s, k, c) for s, k, _, c in WRONG_EVENTS],
    ids=[w for _, _, w, _ in WRONG_EVENTS],
)
def test_a_wrong_event_fails(scenario: str, kind: str, change: Callable[[Obj], None]) -> None:
    e = event(scenario, kind)
    assert_event(e)
    change(e)
    with pytest.raises(AssertionError):
        assert_event(e)


def test_wrong_envelopes_and_compactions_fail() -> None:
    envelope = {"type": "error", "status": 400, "error": WS_ERROR}
    assert schema_errors("WebSocketErrorEvent", {**envelope, "status": "400"})
    assert schema_errors("WebSocketErrorEvent", {**envelope, "error": {**WS_ERROR, "type": None}})
    assert schema_errors("ErrorPayload", {**WS_ERROR, "code": None, "type": 4})
    _, final = run("text")
    compacted = {
        "id": "resp_c",
        "object": "response.compaction",
        "output": final["output"],
        "created_at": 1,
        "usage": final["usage"],
    }
    assert not schema_errors("CompactResource", compacted)
    assert schema_errors("CompactResource", {**compacted, "object": "response"})
    assert schema_errors("CompactResource", {k: v for k, v in compacted.items() if k != "output"})


def test_what_has_no_schema_fails_rather_than_passes() -> None:
    with pytest.raises(AssertionError, match="no streaming event schema"):
        assert_event({"type": "response.not_in_the_spec", "sequence_number": 0})
    with pytest.raises(AssertionError, match="no streaming event schema"):
        assert_event({"sequence_number": 0})
    with pytest.raises(AssertionError, match="no component schema"):
        assert_schema("NoSuchComponent", {})
