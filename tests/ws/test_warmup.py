"""``generate: false`` on the WebSocket: a warm-up keeps its input in the connection cache (and the
store when ``store`` is true), answers created → in_progress → completed with empty output and zero
usage, and calls no upstream; the next turn continues from its id. Raw frames, and the openai SDK's
``responses.connect()`` (sync and async, with the typed ``generate`` parameter) against a Gemini
upstream and the built-in ``mock`` model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.fakes.gemini import FakeGemini
from tests.fakes.gemini import Reply as GeminiReply
from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.harness import ServedApp
from tests.helpers import chat_upstream
from tests.ws.helpers import Recorder, assert_clean_turn, install, output_text, run_turn, serve, ws_connect

ZERO_USAGE = {
    "input_tokens": 0,
    "output_tokens": 0,
    "total_tokens": 0,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens_details": {"reasoning_tokens": 0},
}
TERMINAL = ("response.completed", "response.failed", "response.incomplete", "error")


async def test_warm_up_store_false_lives_in_the_connection_cache() -> None:
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("It is 42."))
        cfg = chat_upstream(fake, {"m": {"provider": "up"}}, api_key="sk-up", retry={"attempts": 0})
        with serve(cfg) as gw:
            async with ws_connect(gw) as ws:
                events = await run_turn(
                    ws, model="m", store=False, generate=False, input="The answer is 42. Remember it."
                )
                warm = assert_clean_turn(events)
                assert [e["type"] for e in events] == [
                    "response.created",
                    "response.in_progress",
                    "response.completed",
                ]
                assert warm["output"] == [] and warm["usage"] == ZERO_USAGE and warm["store"] is False
                assert fake.requests == []
                events = await run_turn(
                    ws, model="m", store=False, previous_response_id=warm["id"], input="What is it?"
                )
                assert output_text(assert_clean_turn(events)) == "It is 42."
                messages = fake.requests[0].body["messages"]
                assert [m["content"] for m in messages] == ["The answer is 42. Remember it.", "What is it?"]
            # nothing was persisted
            async with httpx.AsyncClient(base_url=gw.base_url) as c:
                assert (await c.get(f"/v1/responses/{warm['id']}")).status_code == 404


async def test_warm_up_errors_are_turn_scoped_envelopes() -> None:
    with serve() as gw:
        async with ws_connect(gw) as ws:
            events = await run_turn(ws, model="mock", generate="false", input="x")
            assert events[-1]["type"] == "error" and events[-1]["error"]["param"] == "generate"
            events = await run_turn(
                ws, model="mock", generate=False, previous_response_id="resp_no", input="x"
            )
            assert events[-1]["error"]["code"] == "previous_response_not_found"
            events = await run_turn(ws, model="mock", generate=False, input="x")
            assert events[-1]["type"] == "response.completed"


@pytest.fixture(scope="module")
def recorded() -> Iterator[tuple[ServedApp, Recorder]]:
    with serve() as served:
        recorder = Recorder()
        install(served, "mock", recorder)
        yield served, recorder


async def test_openai_sdk_async_connect_warm_up_then_generate(recorded: tuple[ServedApp, Recorder]) -> None:
    served, recorder = recorded
    start = len(recorder.requests)
    client = openai.AsyncOpenAI(base_url=served.base_url + "/v1", api_key="sk-none", max_retries=0)
    async with client.responses.connect() as conn:
        await conn.response.create(
            model="mock", input="Background: the vault code is 7-1-9.", store=False, generate=False
        )
        types = []
        async for event in conn:
            types.append(event.type)
            if event.type in TERMINAL:
                break
        assert types == ["response.created", "response.in_progress", "response.completed"]
        warm = event.response  # type: ignore[union-attr]
        assert warm.output == [] and warm.usage is not None and warm.usage.total_tokens == 0
        assert len(recorder.requests) == start  # no upstream call
        await conn.response.create(model="mock", input="The code?", store=False, previous_response_id=warm.id)
        async for event in conn:
            if event.type in TERMINAL:
                break
        assert event.type == "response.completed"
        assert event.response.output_text == "Hello! You said: The code?"
    (transcript,) = recorder.transcripts()[start:]
    assert [i["content"][0]["text"] for i in transcript] == [
        "Background: the vault code is 7-1-9.",
        "The code?",
    ]


def test_openai_sdk_sync_connect_warm_up_against_gemini() -> None:
    async def main() -> None:
        async with FakeGemini.serve() as fake:
            fake.add(GeminiReply.text("The code is 7-1-9."))
            cfg = {
                "providers": {"gem": {"kind": "gemini", "base_url": fake.base_url, "api_key": "k"}},
                "models": {"gem": {"provider": "gem", "upstream_model": "gemini-x"}},
            }
            with serve(cfg) as gw:
                result = await asyncio.to_thread(sync_client_turns, gw)
            assert result == ("completed", 0, "The code is 7-1-9.")
            assert len(fake.requests) == 1  # the warm-up reached no upstream
            sent = orjson.dumps(fake.requests[0].body["contents"]).decode()
            assert "vault code is 7-1-9" in sent and "The code?" in sent

    asyncio.run(main())


def sync_client_turns(gw: ServedApp) -> tuple[str, int, str]:
    client = openai.OpenAI(base_url=gw.base_url + "/v1", api_key="sk-none", max_retries=0)
    with client.responses.connect() as conn:
        conn.response.create(model="gem", input="The vault code is 7-1-9.", generate=False)
        warm: Any = None
        for event in conn:
            if event.type in TERMINAL:
                warm = event.response  # type: ignore[union-attr]
                break
        conn.response.create(model="gem", input="The code?", previous_response_id=warm.id)
        for event in conn:
            if event.type in TERMINAL:
                break
        assert event.type == "response.completed"
        return warm.status, warm.usage.total_tokens, event.response.output_text
