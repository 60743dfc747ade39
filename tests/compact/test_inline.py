"""Inline compaction (``context_management``) over HTTP and the WebSocket, against a fake Chat
Completions upstream that records what it got: over the threshold the gateway summarizes first (the
same summarizing prompt as /v1/responses/compact), answers from the compacted window, and announces
the sealed compaction item as output 0; later turns continue from the window, chained by
previous_response_id (store or connection cache) or by the client sending the output back."""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson

from compact.opener import SUMMARY_MESSAGE_HEADER
from compact.strategy import SUMMARY_PROMPT
from tests.compact.helpers import conversation, flip_byte, upstream_settings, user
from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.harness import ServedApp, serve_gateway
from tests.helpers import sse_events
from tests.schema import assert_schema
from tests.ws.helpers import assert_clean_turn, create, read_turn, run_turn, ws_connect

CM = [{"type": "compaction", "compact_threshold": 110}]  # conversation(6) + a question is ~154 tokens


def long_input() -> list[dict[str, Any]]:
    return [*conversation(6), user("what now?")]


async def post(gw: ServedApp, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=30) as c:
        return await c.post("/v1/responses", json=body)


def contents(fake: FakeOpenAIChat, n: int) -> list[tuple[str, str]]:
    """(role, text) of each message upstream request ``n`` carried."""
    out = []
    for m in fake.requests[n].body["messages"]:
        content = m["content"]
        text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)
        out.append((m["role"], text))
    return out


WINDOW = [
    ("system", "You are terse."),
    ("user", SUMMARY_MESSAGE_HEADER + "SUMMARY: codes cobalt-0 to cobalt-3"),
    ("assistant", "answer 4"),
    ("user", "question 5: remember code word cobalt-5"),
    ("assistant", "answer 5"),
    ("user", "what now?"),
]


async def test_over_the_threshold_compacts_before_the_answer_sse() -> None:
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("SUMMARY: codes cobalt-0 to cobalt-3"), Reply.text("Carry on."))
        with serve_gateway(upstream_settings(fake)) as gw:
            r = await post(
                gw, {"model": "m", "input": long_input(), "context_management": CM, "stream": True}
            )
            assert r.status_code == 200, r.text
            events = sse_events(r.text)
            async with httpx.AsyncClient(base_url=gw.base_url) as c:
                usage = (await c.get("/v1/usage")).json()["totals"]
    # the summarizing call first, through the same prompt as /v1/responses/compact
    assert len(fake.requests) == 2
    assert fake.requests[0].body["messages"][0]["content"].startswith(SUMMARY_PROMPT)
    assert "question 0: remember code word cobalt-0" in orjson.dumps(fake.requests[0].body).decode()
    # then the answer, from the compacted window only
    assert contents(fake, 1) == WINDOW
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.compaction.compacting",
        "response.output_item.done",
    ]
    added, compacting, done = events[2:5]
    item = done["item"]
    assert added["output_index"] == compacting["output_index"] == done["output_index"] == 0
    assert added["item"]["type"] == "compaction" and added["item"]["encrypted_content"] == ""
    assert added["item"]["id"] == compacting["item_id"] == item["id"] and item["id"].startswith("cmp_")
    assert item["encrypted_content"].startswith("v1.") and item["status"] == "completed"
    assert item["created_by"] == "m"
    answer_events = events[5:]
    assert answer_events[0]["type"] == "response.output_item.added"
    assert all(e.get("output_index", 1) == 1 for e in answer_events)
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    assert_schema("ResponseResource", final)
    assert [o["type"] for o in final["output"]] == ["compaction", "message"]
    assert final["output"][0] == item
    assert final["usage"]["input_tokens"] == 11  # the answer's own call
    # the summarizing call is metered as its own request, as /v1/responses/compact is
    assert usage["requests"] == 2 and usage["input_tokens"] == 22


def normalized(events: list[dict[str, Any]]) -> str:
    text = orjson.dumps(events).decode()
    text = re.sub(r'"(resp|msg)_[0-9a-f]+"', r'"\1_X"', text)
    return re.sub(r'"(created_at|completed_at)":\d+', r'"\1":0', text)


async def test_under_the_threshold_nothing_changes() -> None:
    async with FakeOpenAIChat.serve() as fake:
        settings = upstream_settings(fake)
        # one event per upstream chunk: merging joins what one read brought, which varies by run
        settings["providers"]["up"]["merge_deltas"] = False
        with serve_gateway(settings) as gw:
            body = {"model": "m", "input": conversation(1), "stream": True}
            plain = sse_events((await post(gw, body)).text)
            managed = sse_events((await post(gw, {**body, "context_management": CM})).text)
            # omitted threshold: 80% of the window (128,000 tokens), far away
            default = sse_events(
                (
                    await post(
                        gw, {**body, "input": long_input(), "context_management": [{"type": "compaction"}]}
                    )
                ).text
            )
    assert normalized(plain) == normalized(managed)
    assert [e["type"] for e in default][2] == "response.output_item.added"
    assert default[2]["item"]["type"] == "message"
    assert len(fake.requests) == 3  # no summarizing call


async def test_store_true_chain_continues_from_the_window() -> None:
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("SUMMARY: codes cobalt-0 to cobalt-3"), Reply.text("Carry on."), Reply.text("ok"))
        with serve_gateway(upstream_settings(fake)) as gw:
            first = await post(gw, {"model": "m", "input": long_input(), "context_management": CM})
            assert first.status_code == 200, first.text
            rid = first.json()["id"]
            assert [o["type"] for o in first.json()["output"]] == ["compaction", "message"]
            second = await post(gw, {"model": "m", "input": "and then?", "previous_response_id": rid})
            assert second.status_code == 200, second.text
            assert second.json()["previous_response_id"] == rid
            async with httpx.AsyncClient(base_url=gw.base_url) as c:
                listed = (await c.get(f"/v1/responses/{rid}/input_items", params={"limit": 100})).json()
                kept = (await c.get(f"/v1/responses/{rid}")).json()
    assert len(fake.requests) == 3
    assert contents(fake, 2) == [*WINDOW, ("assistant", "Carry on."), ("user", "and then?")]
    # the stored response lists what the client sent, and keeps its previous_response_id echo
    assert len(listed["data"]) == len(long_input())
    assert kept["output"][0]["type"] == "compaction" and kept["previous_response_id"] is None


async def test_client_sending_the_output_back_continues_from_the_window() -> None:
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("SUMMARY: codes cobalt-0 to cobalt-3"), Reply.text("Carry on."), Reply.text("ok"))
        with serve_gateway(upstream_settings(fake)) as gw:
            first = await post(
                gw, {"model": "m", "input": long_input(), "context_management": CM, "store": False}
            )
            output = first.json()["output"]
            # appended as usual: everything before the compaction item is superseded by it
            second = await post(
                gw, {"model": "m", "store": False, "input": [*long_input(), *output, user("next")]}
            )
            assert second.status_code == 200, second.text
            # the tampered item is refused, before any upstream call
            bad = [{**output[0], "encrypted_content": flip_byte(output[0]["encrypted_content"])}, user("x")]
            third = await post(gw, {"model": "m", "input": bad})
    assert len(fake.requests) == 3
    assert contents(fake, 2) == [*WINDOW, ("assistant", "Carry on."), ("user", "next")]
    assert third.status_code == 400
    assert third.json()["error"]["code"] == "invalid_encrypted_content"
    assert third.json()["error"]["param"] == "input[0].encrypted_content"


async def test_bad_context_management_is_a_400_with_its_param() -> None:
    async with FakeOpenAIChat.serve() as fake:
        with serve_gateway(upstream_settings(fake)) as gw:
            cases = [
                ({"type": "truncate"}, "context_management[0].type"),
                ({"type": "compaction", "compact_threshold": 0}, "context_management[0].compact_threshold"),
                ({"type": "compaction", "compact_threshold": "9"}, "context_management[0].compact_threshold"),
                ({"compact_threshold": 9}, "context_management[0].type"),
            ]
            for entry, param in cases:
                r = await post(gw, {"model": "m", "input": "x", "context_management": [entry]})
                assert r.status_code == 400, r.text
                assert r.json()["error"]["param"] == param
            two = [{"type": "compaction"}, {"type": "compaction"}]
            r = await post(gw, {"model": "m", "input": "x", "context_management": two})
            assert r.status_code == 400 and r.json()["error"]["param"] == "context_management[1]"
            r = await post(gw, {"model": "m", "input": "x", "context_management": {"type": "compaction"}})
            assert r.status_code == 400 and r.json()["error"]["param"] == "context_management"
    assert fake.requests == []


async def test_a_warm_up_is_never_compacted() -> None:
    async with FakeOpenAIChat.serve() as fake:
        with serve_gateway(upstream_settings(fake)) as gw:
            r = await post(
                gw, {"model": "m", "input": long_input(), "context_management": CM, "generate": False}
            )
            assert r.status_code == 200 and r.json()["output"] == []
    assert fake.requests == []


async def test_websocket_store_false_continues_from_the_cached_window() -> None:
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("SUMMARY: codes cobalt-0 to cobalt-3"), Reply.text("Carry on."))
        with serve_gateway(upstream_settings(fake)) as gw:
            async with ws_connect(gw) as ws:
                events = await run_turn(ws, model="m", store=False, input=long_input(), context_management=CM)
                first = assert_clean_turn(events)
                assert [e["type"] for e in events[2:5]] == [
                    "response.output_item.added",
                    "response.compaction.compacting",
                    "response.output_item.done",
                ]
                assert [o["type"] for o in first["output"]] == ["compaction", "message"]
                # the continuation is under the threshold again: answered from the cache, no summary
                events = await run_turn(
                    ws,
                    model="m",
                    store=False,
                    previous_response_id=first["id"],
                    input="and then?",
                    context_management=CM,
                )
                second = assert_clean_turn(events)
                assert [o["type"] for o in second["output"]] == ["message"]
                events = await run_turn(
                    ws, model="m", store=False, previous_response_id=second["id"], input="last"
                )
                assert_clean_turn(events)
                # bad shapes are turn-scoped envelopes with their param
                events = await run_turn(ws, model="m", input="x", context_management=[{"type": "other"}])
                assert events[-1]["type"] == "error" and events[-1]["status"] == 400
                assert events[-1]["error"]["param"] == "context_management[0].type"
            async with httpx.AsyncClient(base_url=gw.base_url) as c:
                assert (await c.get(f"/v1/responses/{first['id']}")).status_code == 404
    assert len(fake.requests) == 4
    assert contents(fake, 2) == [*WINDOW, ("assistant", "Carry on."), ("user", "and then?")]
    assert contents(fake, 3) == [
        *WINDOW,
        ("assistant", "Carry on."),
        ("user", "and then?"),
        ("assistant", "Hello!"),
        ("user", "last"),
    ]


async def test_a_stored_chain_compacted_midway_continues_from_the_window() -> None:
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("first"), Reply.text("SUMMARY: the cobalt codes"), Reply.text("second"))
        with serve_gateway(upstream_settings(fake)) as gw:
            t0 = (await post(gw, {"model": "m", "input": conversation(6)})).json()
            r = await post(
                gw,
                {
                    "model": "m",
                    "input": "what now?",
                    "previous_response_id": t0["id"],
                    "context_management": CM,
                },
            )
            t1 = r.json()
            assert r.status_code == 200 and t1["previous_response_id"] == t0["id"]
            assert [o["type"] for o in t1["output"]] == ["compaction", "message"]
            r = await post(gw, {"model": "m", "input": "and then?", "previous_response_id": t1["id"]})
            assert r.status_code == 200, r.text
            async with httpx.AsyncClient(base_url=gw.base_url) as c:
                assert (await c.get(f"/v1/responses/{t1['id']}")).json()["previous_response_id"] == t0["id"]
    assert len(fake.requests) == 4
    assert "question 0" in orjson.dumps(fake.requests[1].body).decode()  # the summarizing call
    last = contents(fake, 3)
    assert "question 0" not in orjson.dumps(last).decode()
    assert last[0] == ("system", "You are terse.")
    assert last[1] == ("user", SUMMARY_MESSAGE_HEADER + "SUMMARY: the cobalt codes")
    assert last[-3:] == [("user", "what now?"), ("assistant", "second"), ("user", "and then?")]


async def test_a_failed_summary_fails_the_request_before_any_answer() -> None:
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.error(500))
        with serve_gateway(upstream_settings(fake)) as gw:
            r = await post(
                gw, {"model": "m", "input": long_input(), "context_management": CM, "stream": True}
            )
            assert r.status_code == 502 and r.headers["content-type"] == "application/json"
            async with ws_connect(gw) as ws:
                fake.add(Reply.error(500))
                events = await run_turn(ws, model="m", store=False, input=long_input(), context_management=CM)
                assert len(events) == 1 and events[0]["type"] == "error" and events[0]["status"] == 502
                # the socket goes on
                events = await run_turn(ws, model="m", store=False, input="hi")
                assert events[-1]["type"] == "response.completed"
    assert len(fake.requests) == 3  # two summarizing attempts, one plain answer


async def test_steering_a_compacted_response_continues_from_the_window() -> None:
    """A steer mid-answer of a response that compacted first: the steered response keeps its
    compaction item (output 0) and the text so far; the automatic successor runs on the window (not
    the long history it replaced) plus the steering input, and being under the threshold it does
    not summarize again."""
    story = " ".join(f"w{i}" for i in range(40))
    async with FakeOpenAIChat.serve() as fake:
        fake.add(
            Reply.text("SUMMARY: codes cobalt-0 to cobalt-3"),
            Reply.text(story, pieces=40, chunk_delay=0.1, split=None),
            Reply.text("About a cat."),
        )
        with serve_gateway(upstream_settings(fake)) as gw:
            async with ws_connect(gw) as ws:
                await ws.send(create(model="m", store=False, input=long_input(), context_management=CM))
                head = [orjson.loads(await ws.recv())]
                while head[-1]["type"] != "response.output_text.delta":
                    head.append(orjson.loads(await ws.recv()))
                first_id = head[0]["response"]["id"]
                steer = {"type": "response.steer", "previous_response_id": first_id, "input": "A cat, please"}
                await ws.send(orjson.dumps(steer).decode())
                events = await read_turn(ws)  # through the steered response's terminal event
                successor = await read_turn(ws)
    kinds = [e["type"] for e in events]
    assert "response.steer.accepted" in kinds and kinds[-1] == "response.incomplete"
    steered = events[-1]["response"]
    assert steered["incomplete_details"] == {"reason": "steered"}
    assert [o["type"] for o in steered["output"]] == ["compaction", "message"]
    text = "".join(e["delta"] for e in [*head, *events] if e["type"] == "response.output_text.delta")
    assert 0 < len(text) < len(story) and steered["output"][1]["content"][0]["text"] == text
    done = assert_clean_turn(successor)
    assert successor[0]["response"]["previous_response_id"] == steered["id"]
    assert [o["type"] for o in done["output"]] == ["message"]  # under the threshold: no second summary
    assert len(fake.requests) == 3  # the summary, the steered answer, the successor
    assert contents(fake, 2) == [*WINDOW, ("assistant", text), ("user", "A cat, please")]
