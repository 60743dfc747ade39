"""An explicit ``POST /v1/responses/compact`` always compacts (issue 19): with the defaults (a
128,000-token window, a 19,200-token budget) an agent conversation well within the budget is still
summarized up to its newest user message, the window comes back at most about half the input, and a
new chain started from it carries the summary to the upstream, over HTTP and WebSocket, with
``store`` true or false. Before, such an input came back whole with an empty compaction item."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from compact.strategy import SUMMARY_PROMPT
from gateway.kernel.estimate import estimate
from gateway.kernel.settings import CompactionSettings
from tests.compact.helpers import agent_turns, compaction_of, sent_text, upstream_settings, user
from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.harness import ServedApp, serve_gateway
from tests.schema import assert_schema
from tests.ws.helpers import run_turn, ws_connect

SUMMARY = "SUMMARY-7781: the user asked why the build is slow; b.log was read, every line ok."


async def compact(gw: ServedApp, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=30) as c:
        r = await c.post("/v1/responses/compact", json=body)
    assert r.status_code == 200, r.text
    resource: dict[str, Any] = r.json()
    assert_schema("CompactResource", resource)
    return resource


async def create(gw: ServedApp, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=30) as c:
        r = await c.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    response: dict[str, Any] = r.json()
    assert response["status"] == "completed", response
    return response


async def compacted_agent_turns(gw: ServedApp, fake: FakeOpenAIChat) -> list[dict[str, Any]]:
    """Compact the issue's conversation; check the model summarized it and the window is small."""
    convo = agent_turns()
    assert estimate(convo) < CompactionSettings().recent_budget(128_000)  # the defaults, untuned
    fake.add(Reply.text(SUMMARY, usage=(9_500, 40)))
    resource = await compact(gw, {"model": "m", "input": convo})
    window = resource["output"]
    # the model was called, once, to summarize everything before the newest user message
    assert len(fake.requests) == 1
    assert fake.requests[0].body["messages"][0]["content"].startswith(SUMMARY_PROMPT)
    summarized = sent_text(fake)
    assert "line 00000: compiler output ok" in summarized and "call_log" in summarized
    assert "why the build is slow" in summarized and "a long explanation of the build" in summarized
    assert resource["usage"]["input_tokens"] == 9_500 and resource["usage"]["output_tokens"] == 40
    assert compaction_of(window)["created_by"] == "m"
    # the window: the summary, then the newest user message verbatim; at most about half the input
    assert [i["type"] for i in window] == ["compaction", "message"]
    assert window[1]["role"] == "user" and window[1]["content"][0]["text"] == "Thanks. Fix it."
    assert len(orjson.dumps(window)) <= len(orjson.dumps(convo)) // 2
    assert estimate(window) <= estimate(convo) // 2
    fake.reset()
    return window


def upstream_saw_the_summary(fake: FakeOpenAIChat) -> None:
    text = sent_text(fake)
    assert SUMMARY in text and "encrypted_content" not in text
    assert "line 00000" not in text  # what was summarized is not sent again


@pytest.mark.parametrize("store", [True, False])
async def test_an_agent_conversation_within_the_budget_is_compacted_over_http(store: bool) -> None:
    async with FakeOpenAIChat.serve() as fake:
        with serve_gateway(upstream_settings(fake)) as gw:
            window = await compacted_agent_turns(gw, fake)
            # a new chain from the compacted window: the upstream sees the summary
            first = await create(gw, {"model": "m", "store": store, "input": [*window, user("Go on.")]})
            assert first["previous_response_id"] is None
            upstream_saw_the_summary(fake)
            fake.reset()
            # and still on the next turn: continued from the store, or sent back whole
            if store:
                body = {"model": "m", "previous_response_id": first["id"], "input": "And then?"}
            else:
                back = [*window, user("Go on."), *first["output"], user("And then?")]
                body = {"model": "m", "store": False, "input": back}
            await create(gw, body)
            upstream_saw_the_summary(fake)
            assert "And then?" in sent_text(fake)


@pytest.mark.parametrize("store", [True, False])
async def test_an_agent_conversation_within_the_budget_is_compacted_for_a_websocket(store: bool) -> None:
    async with FakeOpenAIChat.serve() as fake:
        with serve_gateway(upstream_settings(fake)) as gw:
            window = await compacted_agent_turns(gw, fake)
            async with ws_connect(gw) as ws:
                events = await run_turn(ws, model="m", store=store, input=[*window, user("Go on.")])
                done = events[-1]
                assert done["type"] == "response.completed", done
                assert done["response"]["previous_response_id"] is None
                assert done["response"]["store"] is store
                upstream_saw_the_summary(fake)
                fake.reset()
                # the chain continues (from the connection cache or the store), summary included
                previous = done["response"]["id"]
                events = await run_turn(
                    ws, model="m", store=store, previous_response_id=previous, input="And then?"
                )
                assert events[-1]["type"] == "response.completed", events[-1]
                upstream_saw_the_summary(fake)
                assert "And then?" in sent_text(fake)


async def test_nothing_readable_before_the_newest_user_message_calls_no_model() -> None:
    # an encrypted reasoning item without a summary renders into no transcript: no empty request
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"}
    async with FakeOpenAIChat.serve() as fake:
        with serve_gateway(upstream_settings(fake)) as gw:
            resource = await compact(gw, {"model": "m", "input": [reasoning, user("hi")]})
    assert fake.requests == []
    assert resource["usage"]["total_tokens"] == 0
    assert [i["type"] for i in resource["output"]] == ["compaction", "message"]
