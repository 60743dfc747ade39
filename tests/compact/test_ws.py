"""A compacted window on the WebSocket transport. The window replaces the history, so a client
sends it as the input of a turn without ``previous_response_id``: a new chain, which with
``store: false`` lives only in the socket's connection cache and is continued from there. A tampered
compaction item is a turn-scoped error that reaches no upstream."""

from __future__ import annotations

from typing import Any

import httpx

from tests.compact.helpers import conversation, flip_byte, sent_text, upstream_settings, user, with_envelope
from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.harness import ServedApp, serve_gateway
from tests.ws.helpers import run_turn, ws_connect


async def compact(gw: ServedApp, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=30) as c:
        r = await c.post("/v1/responses/compact", json=body)
    assert r.status_code == 200, r.text
    return r.json()["output"]


async def test_compacted_window_starts_a_new_store_false_chain(gateway: ServedApp) -> None:
    window = await compact(
        gateway,
        {
            "model": "mock",
            "input": [
                user("Remember the compaction code word: slate."),
                {"type": "message", "role": "assistant", "content": "I will remember slate."},
                user("Good."),
            ],
        },
    )
    async with ws_connect(gateway) as ws:
        events = await run_turn(
            ws, model="mock", store=False, input=[*window, user("What was the word?")], tools=[]
        )
        done = events[-1]
        assert done["type"] == "response.completed", events[-1]
        assert done["response"]["previous_response_id"] is None and done["response"]["store"] is False
        assert done["response"]["output"][0]["content"][0]["text"] == "Hello! You said: What was the word?"
        # the store:false response continues from the connection cache, summary included
        events = await run_turn(
            ws, model="mock", store=False, previous_response_id=done["response"]["id"], input="again"
        )
        assert events[-1]["type"] == "response.completed"


async def test_tampered_item_on_a_websocket_is_a_turn_error_with_no_upstream_call() -> None:
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("WS-SUMMARY of cobalt"))
        with serve_gateway(upstream_settings(fake, compaction={"keep_recent_items": 1})) as gw:
            window = await compact(gw, {"model": "m", "input": conversation(3)})
            envelope = next(i for i in window if i["type"] == "compaction")["encrypted_content"]
            fake.reset()
            async with ws_connect(gw) as ws:
                bad = with_envelope(window, flip_byte(envelope))
                events = await run_turn(ws, model="m", store=False, input=[*bad, user("go")])
                assert len(events) == 1
                assert events[0]["type"] == "error" and events[0]["status"] == 400
                assert events[0]["error"]["code"] == "invalid_encrypted_content"
                assert fake.requests == []
                # the socket stays usable, and the authentic window goes through
                events = await run_turn(ws, model="m", store=False, input=[*window, user("go")])
                assert events[-1]["type"] == "response.completed"
        assert "WS-SUMMARY of cobalt" in sent_text(fake)


async def test_a_websocket_chain_is_measured_against_the_window_in_full() -> None:
    # The connection cache keeps each transcript's estimated size, so a continuation counts only its
    # new items; the decision must still be the one the whole transcript would get.
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("ok"), Reply.text("ok"), Reply.text("ok"))
        with serve_gateway(upstream_settings(fake)) as gw:
            async with ws_connect(gw) as ws:

                async def small(text: str, prev: dict[str, Any] | None, **extra: Any) -> list[dict[str, Any]]:
                    previous = prev["response"]["id"] if prev else None
                    body = {"model": "small", "store": False, "input": text, **extra}
                    return await run_turn(ws, previous_response_id=previous, **body)

                # each 480-byte input is ~124 tokens, each "ok" ~5: two turns fit in 300, three do not
                first = (await small("a" * 480, None))[-1]
                assert first["type"] == "response.completed"
                second = (await small("b" * 480, first))[-1]
                assert second["type"] == "response.completed"
                # truncation: auto drops the oldest turn; the upstream sees the rest
                fake.reset()
                fake.add(Reply.text("ok"))
                third = await small("c" * 480, second, truncation="auto")
                assert third[-1]["type"] == "response.completed"
                sent = sent_text(fake)
                assert "c" * 480 in sent and "b" * 480 in sent and "a" * 480 not in sent
                # truncation: disabled (the default) refuses the same continuation before any upstream call
                fake.reset()
                refused = await small("c" * 480, second)
                assert refused[-1]["type"] == "error"
                assert refused[-1]["error"]["code"] == "context_length_exceeded"
                assert fake.requests == []
