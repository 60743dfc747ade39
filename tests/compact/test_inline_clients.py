"""Inline compaction with real clients: the openai SDK's typed ``context_management`` on
``responses.create`` (streamed, against an Anthropic upstream) and on ``responses.connect()``
(sync and async, ``store: false``, against the built-in ``mock`` model); the SDK parses every
event, the compaction item included, and the chain continues from the compacted window."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest
from openai.types.responses import ResponseCompactionCompactingEvent, ResponseCompactionItem

from compact.opener import SUMMARY_MESSAGE_HEADER
from tests.compact.helpers import conversation, user
from tests.fakes.anthropic import FakeAnthropic, Reply
from tests.harness import ServedApp
from tests.ws.helpers import Recorder, install, serve

CM: list[Any] = [{"type": "compaction", "compact_threshold": 100}]
TERMINAL = ("response.completed", "response.failed", "response.incomplete", "error")


def long_input() -> list[Any]:
    return [*conversation(6), user("what now?")]


async def test_sdk_http_stream_with_context_management_against_anthropic() -> None:
    async with FakeAnthropic.serve() as fake:
        fake.add(Reply.text("SUMMARY: cobalt codes 0-3"), Reply.text("Carry on."), Reply.text("Still here."))
        cfg = {
            "providers": {"ant": {"kind": "anthropic", "base_url": fake.base_url, "api_key": "sk-ant"}},
            "models": {"claude": {"provider": "ant", "upstream_model": "claude-x"}},
        }
        with serve(cfg) as gw:
            client = openai.AsyncOpenAI(base_url=gw.base_url + "/v1", api_key="sk-none", max_retries=0)
            stream = await client.responses.create(
                model="claude", input=long_input(), context_management=CM, stream=True
            )
            events = [event async for event in stream]
            compacting = [e for e in events if isinstance(e, ResponseCompactionCompactingEvent)]
            assert len(compacting) == 1 and compacting[0].output_index == 0
            final = events[-1].response  # type: ignore[union-attr]
            assert events[-1].type == "response.completed"
            assert isinstance(final.output[0], ResponseCompactionItem)
            assert final.output[0].id == compacting[0].item_id
            assert final.output_text == "Carry on."
            nxt = await client.responses.create(model="claude", input="and?", previous_response_id=final.id)
            assert nxt.output_text == "Still here."
    assert len(fake.requests) == 3
    answer = orjson.dumps(fake.requests[1].body).decode()
    assert "SUMMARY: cobalt codes 0-3" in answer and "question 0:" not in answer
    system = fake.requests[1].body["system"]  # a text block when a cache breakpoint marks it
    assert (system if isinstance(system, str) else "".join(b["text"] for b in system)) == "You are terse."
    last = orjson.dumps(fake.requests[2].body).decode()
    assert "SUMMARY: cobalt codes 0-3" in last and "question 0:" not in last and "and?" in last


@pytest.fixture(scope="module")
def recorded() -> Iterator[tuple[ServedApp, Recorder]]:
    with serve() as served:
        recorder = Recorder()
        install(served, "mock", recorder)
        yield served, recorder


def summary_seen(transcript: list[dict[str, Any]]) -> bool:
    return any(
        i["type"] == "message" and i["content"][0]["text"].startswith(SUMMARY_MESSAGE_HEADER)
        for i in transcript
    )


async def test_sdk_async_connect_store_false_compacts_and_continues(
    recorded: tuple[ServedApp, Recorder],
) -> None:
    served, recorder = recorded
    start = len(recorder.requests)
    client = openai.AsyncOpenAI(base_url=served.base_url + "/v1", api_key="sk-none", max_retries=0)
    async with client.responses.connect() as conn:
        await conn.response.create(model="mock", input=long_input(), store=False, context_management=CM)
        types = []
        async for event in conn:
            types.append(event.type)
            if event.type in TERMINAL:
                break
        assert types[2:5] == [
            "response.output_item.added",
            "response.compaction.compacting",
            "response.output_item.done",
        ]
        first = event.response  # type: ignore[union-attr]
        assert [o.type for o in first.output] == ["compaction", "message"]
        # (the mock's summary echoes the whole transcript, so a second threshold would compact again)
        await conn.response.create(model="mock", input="next", store=False, previous_response_id=first.id)
        async for event in conn:
            if event.type in TERMINAL:
                break
        assert event.type == "response.completed"
        assert event.response.output_text == "Hello! You said: next"
    summarize, answer, nxt = recorder.transcripts()[start:]
    assert len(summarize) == 1 and "question 0:" in summarize[0]["content"][0]["text"]
    assert summary_seen(answer) and summary_seen(nxt)
    texts = [i["content"][0]["text"] for i in nxt]
    assert not any(t.startswith("question 0:") for t in texts)  # summarized, not kept
    assert texts[-1] == "next" and texts[-2] == first.output_text


def test_sdk_sync_connect_compacts(recorded: tuple[ServedApp, Recorder]) -> None:
    served, recorder = recorded
    start = len(recorder.requests)

    def turns() -> list[str]:
        client = openai.OpenAI(base_url=served.base_url + "/v1", api_key="sk-none", max_retries=0)
        with client.responses.connect() as conn:
            conn.response.create(model="mock", input=long_input(), store=False, context_management=CM)
            for event in conn:
                if event.type in TERMINAL:
                    break
            assert event.type == "response.completed"
            return [o.type for o in event.response.output]

    assert asyncio.run(asyncio.to_thread(turns)) == ["compaction", "message"]
    assert len(recorder.requests) == start + 2  # the summary, then the answer
