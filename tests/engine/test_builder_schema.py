"""Every event the ResponseBuilder can emit, and every ResponseResource it ends with, is valid against
the dated spec's schemas (tests/schema.py): each event against the streaming event schema of its ``type``."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings

from adapters.deltas import (
    Delta,
    TextDelta,
    ToolCallArgsDelta,
)
from gateway.kernel.errors import GatewayError, IllegalTransition, ServiceUnavailable, UpstreamError
from tests.engine.helpers import BUILDER_EVENTS, SCENARIOS, delta_sequences, fresh_builder
from tests.schema import assert_event, assert_schema, event_components, schema_errors


def wire(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events as a client receives them: serialized when emitted (later changes do not show)."""
    return [orjson.loads(orjson.dumps(e)) for e in events]


def run(
    deltas: list[Delta],
    *,
    fail_at: int | None = None,
    before_start: bool = False,
    revoke: bool = False,
    error_event: bool = True,
    error: GatewayError | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    b = fresh_builder(error_event=error_event)
    error = error or UpstreamError("The upstream failed.")
    if before_start:
        return wire(b.fail(error)), b.resource
    events = wire(b.start())
    for n, d in enumerate(deltas):
        if n == fail_at:
            return events + wire(b.fail(error)), b.resource
        try:
            events += wire(b.feed(d))
        except IllegalTransition as exc:  # as the turn does: the response fails with it
            return events + wire(b.fail(exc)), b.resource
    terminal = b.finish()
    if revoke:
        terminal[-1:] = b.revoke(ServiceUnavailable("The state store is unavailable."))
    return events + wire(terminal), b.resource


def all_runs() -> list[tuple[str, list[dict[str, Any]], dict[str, Any]]]:
    out = [(name, *run(deltas)) for name, deltas in SCENARIOS.items()]
    out += [
        ("fail before start", *run([], before_start=True)),
        ("fail mid-text", *run(SCENARIOS["text"], fail_at=1)),
        ("fail mid-reasoning", *run(SCENARIOS["reasoning"], fail_at=4)),
        ("fail mid-call", *run(SCENARIOS["calls"], fail_at=3)),
        ("fail mid-refusal, no error event", *run(SCENARIOS["refusal"], fail_at=2, error_event=False)),
        ("fail on an illegal transition", *run([TextDelta("a"), ToolCallArgsDelta(9, "{}")])),
        ("revoke", *run(SCENARIOS["text"], revoke=True)),
        ("revoke incomplete", *run(SCENARIOS["length"], revoke=True)),
        ("revoke, no error event", *run(SCENARIOS["calls"], revoke=True, error_event=False)),
    ]
    return out


RUNS = all_runs()


def test_the_document_has_a_schema_for_every_builder_event() -> None:
    missing = BUILDER_EVENTS - set(event_components())
    assert not missing, f"no streaming event schema for {sorted(missing)}"


@pytest.mark.parametrize(("name", "events", "final"), RUNS, ids=[r[0] for r in RUNS])
def test_events_and_final_resource_match_the_schema(
    name: str, events: list[dict[str, Any]], final: dict[str, Any]
) -> None:
    for event in events:
        assert_event(event)
    assert_schema("ResponseResource", final)
    assert events[-1]["response"] == wire([final])[0]


def test_the_scenarios_emit_every_builder_event() -> None:
    emitted = {e["type"] for _, events, _ in RUNS for e in events}
    assert emitted == BUILDER_EVENTS


@settings(max_examples=40, deadline=None)
@given(delta_sequences())
def test_any_valid_sequence_matches_the_schema(deltas: list[Any]) -> None:
    for events, final in (run(deltas), run(deltas, fail_at=len(deltas) // 2)):
        for event in events:
            assert_event(event)
        assert_schema("ResponseResource", final)


# -- the checker itself is not vacuous ------------------------------------------------------------
def test_the_checker_refuses_what_the_schema_refuses() -> None:
    _, events, final = RUNS[0]
    events = copy.deepcopy(events)
    delta = next(e for e in events if e["type"] == "response.output_text.delta")
    assert schema_errors("ResponseOutputTextDeltaStreamingEvent", {**delta, "output_index": "0"})
    del delta["item_id"]
    with pytest.raises(AssertionError):
        assert_event(delta)
    with pytest.raises(AssertionError, match="no streaming event schema"):
        assert_event({"type": "response.not_in_the_spec", "sequence_number": 0})
    with pytest.raises(AssertionError, match="no component schema"):
        assert_schema("NoSuchComponent", final)
    with pytest.raises(AssertionError):
        assert_schema("ResponseResource", {**final, "output": "none"})
    assert IllegalTransition.code == "upstream_protocol_error"
