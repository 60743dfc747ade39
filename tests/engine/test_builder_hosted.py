"""The builder's hosted-tool items (gateway/engine/hosted.py): a model's call to an MCP tool is an
``mcp_call`` (parked until executed, then closed with its outcome) or an ``mcp_approval_request``;
items made before sampling are announced whole; usage adds up over the response's upstream calls.
Every event and item is checked against openai-python's own models of them (the MCP extension is
OpenAI's, not in the Open Responses schemas)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from adapters.deltas import Finish, TextDelta, ToolCallArgsDelta, ToolCallStart, Usage
from gateway.engine.builder import ResponseBuilder
from gateway.engine.hosted import HostedFunction, function_name, receipt, upstream_items
from gateway.kernel.errors import IllegalTransition, UpstreamError
from gateway.kernel.items import message
from tests.engine.helpers import fresh_builder
from tests.schema import assert_event

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
# their snapshot holds the MCP items, which the Open Responses schemas do not know
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


def hosted_builder(*, approval: bool = False) -> ResponseBuilder:
    b = fresh_builder()
    server: Any = SimpleNamespace(label="calc")
    fn = function_name("calc", "add")
    b.hosted = {fn: HostedFunction(server, "add", fn, approval)}
    return b


def _mcp(event: dict[str, Any]) -> bool:
    item = event.get("item")
    return "mcp" in event["type"] or (isinstance(item, dict) and item.get("type", "").startswith("mcp_"))


def checked(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An MCP event (or an item event of an MCP item) as openai-python parses it, every other event
    against the Open Responses schemas."""
    for ev in events:
        if _mcp(ev):
            EVENTS.validate_python(ev)
        elif ev["type"] not in TERMINAL:
            assert_event(ev)
    return events


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def test_a_hosted_call_streams_parks_and_closes_with_its_outcome() -> None:
    b = hosted_builder()
    events = b.start()
    events += b.feed(ToolCallStart(key=0, name="calc__add"))
    events += b.feed(ToolCallArgsDelta(key=0, delta='{"a": 1,'))
    events += b.feed(ToolCallArgsDelta(key=0, delta=' "b": 2}'))
    events += b.feed(Usage(input_tokens=10, output_tokens=5))
    events += b.feed(Finish("tool_calls"))
    events += b.end_round()
    assert types(events[2:]) == [
        "response.output_item.added",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
    ]
    assert events[-1]["arguments"] == '{"a": 1, "b": 2}'
    [(index, item)] = b.parked()
    assert index == 0 and item["status"] == "in_progress" and item["type"] == "mcp_call"
    assert item["server_label"] == "calc" and item["name"] == "add"
    done = b.hosted_done(index, receipt(SimpleNamespace(output="3", error=None)))  # type: ignore[arg-type]
    assert types(done) == ["response.mcp_call.completed", "response.output_item.done"]
    assert done[-1]["item"]["output"] == "3" and done[-1]["item"]["status"] == "completed"
    assert b.parked() == []
    b.next_round()
    events += done
    events += b.feed(TextDelta("It is 3."))
    events += b.feed(Usage(input_tokens=20, output_tokens=4, cached_tokens=8))
    events += b.finish()
    checked(events)
    final = events[-1]["response"]
    assert final["status"] == "completed"
    Response.model_validate({**final, "usage": None})  # openai-python: its usage wants more detail
    assert [o["type"] for o in final["output"]] == ["mcp_call", "message"]
    # both upstream calls' usage
    assert final["usage"]["input_tokens"] == 30 and final["usage"]["output_tokens"] == 9
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 8
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_a_failed_call_is_failed_and_its_error_is_openais_shape() -> None:
    b = hosted_builder()
    b.start()
    b.feed(ToolCallStart(key=0, name="calc__add"))
    b.end_round()
    [(index, _)] = b.parked()
    done = checked(b.hosted_done(index, receipt("the server hung up")))
    assert types(done) == ["response.mcp_call.failed", "response.output_item.done"]
    item = done[-1]["item"]
    assert item["status"] == "failed" and item["output"] is None
    assert item["error"]["type"] == "mcp_protocol_error" and "hung up" in item["error"]["message"]


def test_an_approval_request_is_announced_whole_and_hands_off() -> None:
    b = hosted_builder(approval=True)
    events = b.start()
    events += b.feed(ToolCallStart(key=0, name="calc__add"))
    events += b.feed(ToolCallArgsDelta(key=0, delta='{"a": 1}'))
    events += b.end_round()
    assert b.handoff and b.parked() == []
    assert types(events[2:]) == ["response.output_item.added", "response.output_item.done"]
    assert events[-1]["item"]["type"] == "mcp_approval_request"
    assert events[-1]["item"]["arguments"] == '{"a": 1}'
    checked(events + b.finish())


def test_a_client_function_call_hands_off_and_a_hosted_one_does_not() -> None:
    b = hosted_builder()
    b.start()
    b.feed(ToolCallStart(key=0, name="calc__add"))
    assert not b.handoff
    b.feed(ToolCallStart(key=1, name="get_weather"))
    assert b.handoff
    assert next(i for _, i in b.parked())["type"] == "mcp_call"  # closed by the next item, parked


def test_announced_items_come_whole_with_their_events() -> None:
    b = fresh_builder()
    events = b.start()
    listing: dict[str, Any] = {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "calc", "tools": []}
    listing["tools"] = [{"name": "add", "input_schema": {"type": "object"}, "description": None}]
    call = {
        "type": "mcp_call",
        "id": "mcp_1",
        "server_label": "calc",
        "name": "add",
        "arguments": "{}",
        "approval_request_id": "mcpr_1",
        "output": "3",
        "error": None,
        "status": "completed",
    }
    events += b.announce(listing) + b.announce(call)
    assert types(events[2:]) == [
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.output_item.done",
        "response.output_item.added",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.output_item.done",
    ]
    assert events[2]["item"]["tools"] == [] and events[5]["item"]["tools"] == listing["tools"]
    assert [e.get("output_index") for e in events[2:]] == [0, 0, 0, 0, 1, 1, 1, 1, 1]
    checked(events + b.finish())


@pytest.mark.parametrize("end", ["fail", "interrupt"])
def test_a_response_that_ends_with_a_call_unexecuted_leaves_it_incomplete(end: str) -> None:
    b = hosted_builder()
    b.start()
    b.feed(ToolCallStart(key=0, name="calc__add"))
    b.end_round()
    if end == "fail":
        events = b.fail(UpstreamError("gone"))
    else:
        events = b.interrupt("steered")
        assert types(events) == ["response.output_item.done", "response.incomplete"]
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"
    with pytest.raises(IllegalTransition):
        b.hosted_done(0, receipt("late"))


def test_receipts_map_to_the_calls_and_results_the_model_saw() -> None:
    user = message("user", "hi", item_id="msg_1")
    listing = {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "calc", "tools": []}
    call = {
        "type": "mcp_call",
        "id": "mcp_1",
        "server_label": "calc",
        "name": "add",
        "arguments": '{"a":1}',
        "output": "3",
        "error": None,
        "approval_request_id": None,
    }
    asked: dict[str, Any] = {
        "type": "mcp_approval_request",
        "id": "mcpr_1",
        "server_label": "calc",
        "name": "add",
    }
    asked["arguments"] = "{}"
    approved: dict[str, Any] = {
        "type": "mcp_approval_response",
        "id": "mcpa_1",
        "approval_request_id": "mcpr_1",
    }
    approved["approve"] = True
    executed: dict[str, Any] = {**call, "id": "mcp_2", "approval_request_id": "mcpr_1", "output": None}
    executed["error"] = {"type": "mcp_protocol_error", "code": -32000, "message": "boom"}
    denied_ask = {**asked, "id": "mcpr_2"}
    denied: dict[str, Any] = {
        "type": "mcp_approval_response",
        "approval_request_id": "mcpr_2",
        "approve": False,
    }
    denied["reason"] = "no"
    unanswered = {**asked, "id": "mcpr_3"}
    later = message("user", "go", item_id="msg_2")
    items = [user, listing, call, asked, approved, later, executed, denied_ask, denied, unanswered]
    mapped = upstream_items(items)
    assert mapped[0] is user
    kinds = [(m["type"], m.get("call_id")) for m in mapped[1:]]
    assert kinds == [
        ("function_call", "mcp_1"),
        ("function_call_output", "mcp_1"),
        ("function_call", "mcpr_1"),  # the approved call's result follows it, not the later message
        ("function_call_output", "mcpr_1"),
        ("message", None),
        ("function_call", "mcpr_2"),
        ("function_call_output", "mcpr_2"),
    ]
    assert mapped[1]["name"] == "calc__add" and mapped[1]["arguments"] == '{"a":1}'
    assert mapped[2]["output"] == "3"
    assert mapped[4]["output"] == "Error: boom"
    assert mapped[7]["output"].startswith("The user did not approve") and mapped[7]["output"].endswith("no")
    plain = [user]
    assert upstream_items(plain) is plain  # nothing to map: the same list


def test_function_names_are_provider_safe_and_stable() -> None:
    assert function_name("calc", "add") == "calc__add"
    odd = function_name("calc", "weird.tool/name")
    assert odd == function_name("calc", "weird.tool/name") and len(odd) <= 64
    assert odd != function_name("calc", "weird_tool_name")
    long = function_name("x" * 60, "y" * 60)
    assert len(long) == 64 and long != function_name("x" * 60, "y" * 59)
