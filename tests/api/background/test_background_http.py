"""Background responses (``background: true``) over HTTP in one gateway process, with the store in
memory and in a real Redis: the JSON answer at once (``in_progress``), the turn finishing after its
client left, GET showing the status as it moves, the SSE stream that a disconnect does not cancel,
resuming at several ``starting_after`` points, cancelling, the refusals, cross-tenant 404s, and the
openai SDK's calls unmodified."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.api.procs import SLOW_TEXT
from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.harness import ServedApp
from tests.helpers import TWO_TENANTS, A, B, chat_upstream, fake_fixtures, sse_events
from tests.redis_server import delete_prefix, redis_url, unique_prefix
from tests.ws.helpers import run_turn, serve, ws_connect

fake_server, fake = fake_fixtures(FakeOpenAIChat)


def slow(seconds: float = 0.25) -> Reply:
    """``SLOW_TEXT`` in 8 pieces, ``seconds`` apart."""
    return Reply.text(SLOW_TEXT, pieces=8, chunk_delay=seconds, split=None, comments=False)


def config(fake: FakeOpenAIChat, store: str, prefix: str) -> dict[str, Any]:
    cfg = chat_upstream(fake, {"m": {"provider": "up"}}, api_key="sk-up", retry={"attempts": 0})
    cfg["auth"] = {
        "api_keys": [*TWO_TENANTS["api_keys"], {"key": "sk-n", "tenant": "n"}],
    }
    cfg["tenants"] = {"n": {"retention": "none"}}
    if store == "redis":
        cfg["state"] = {"redis_url": redis_url(), "key_prefix": prefix}
    return cfg


@pytest.fixture(params=["memory", "redis"])
def served(request: pytest.FixtureRequest, fake: FakeOpenAIChat) -> Iterator[ServedApp]:
    prefix = unique_prefix()
    with serve(config(fake, request.param, prefix)) as gw:
        yield gw
    if request.param == "redis":
        delete_prefix(redis_url(), prefix)


async def poll(c: httpx.AsyncClient, rid: str, until: str, seconds: float = 15) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        r = await c.get(f"/v1/responses/{rid}", headers=A)
        assert r.status_code == 200, r.text
        res: dict[str, Any] = r.json()
        if res["status"] == until:
            return res
        assert time.monotonic() < deadline, res["status"]
        await asyncio.sleep(0.05)


def text_of(res: dict[str, Any]) -> str:
    return "".join(p["text"] for item in res["output"] for p in item.get("content", []))


def frames(body: bytes) -> list[dict[str, Any]]:
    return sse_events(body.decode())


async def test_json_answers_at_once_and_the_turn_finishes_alone(
    served: ServedApp, fake: FakeOpenAIChat
) -> None:
    fake.add(slow())
    async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
        began = time.monotonic()
        r = await c.post("/v1/responses", headers=A, json={"model": "m", "input": "hi", "background": True})
        assert r.status_code == 200, r.text
        assert time.monotonic() - began < 1.5  # the reply takes ~2 s: not waited for
        res = r.json()
        assert res["status"] in ("queued", "in_progress") and res["background"] is True
        assert res["output"] == []
        rid = res["id"]
    # that client is gone; another one reads the response as it moves
    async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
        running = (await c.get(f"/v1/responses/{rid}", headers=A)).json()
        assert running["status"] == "in_progress"
        done = await poll(c, rid, "completed")
        assert text_of(done) == SLOW_TEXT and done["usage"]["output_tokens"] == 7
        # another tenant never sees it
        assert (await c.get(f"/v1/responses/{rid}", headers=B)).status_code == 404
        assert (await c.post(f"/v1/responses/{rid}/cancel", headers=B)).status_code == 404
        r = await c.get(f"/v1/responses/{rid}", headers=B, params={"stream": "true"})
        assert r.status_code == 404


async def test_sse_survives_a_disconnect_and_resumes_at_every_point(
    served: ServedApp, fake: FakeOpenAIChat
) -> None:
    fake.add(slow())
    body = {"model": "m", "input": "hi", "background": True, "stream": True}
    seen: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
        async with c.stream("POST", "/v1/responses", headers=A, json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    seen.append(orjson.loads(line[6:]))
                if len(seen) == 5:
                    break  # the client leaves mid-stream
    assert [e["type"] for e in seen[:2]] == ["response.created", "response.in_progress"]
    rid = seen[0]["response"]["id"]
    async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
        done = await poll(c, rid, "completed")
        assert text_of(done) == SLOW_TEXT and fake.disconnects == 0
        whole = frames((await c.get(f"/v1/responses/{rid}", headers=A, params={"stream": "true"})).content)
        assert whole[:5] == seen  # the same events, the same numbers
        assert [e["sequence_number"] for e in whole] == list(range(len(whole)))
        assert whole[-1]["type"] == "response.completed"
        for n in (0, 4, len(whole) - 2):
            params = {"stream": "true", "starting_after": str(n)}
            r = await c.get(f"/v1/responses/{rid}", headers=A, params=params)
            assert frames(r.content) == whole[n + 1 :]
        r = await c.get(f"/v1/responses/{rid}", headers=A, params={"stream": "true", "starting_after": "x"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "starting_after"


async def test_a_resume_while_running_follows_live(served: ServedApp, fake: FakeOpenAIChat) -> None:
    fake.add(slow())
    async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
        r = await c.post("/v1/responses", headers=A, json={"model": "m", "input": "hi", "background": True})
        rid = r.json()["id"]
        await asyncio.sleep(0.6)  # some events are out
        r = await c.get(f"/v1/responses/{rid}", headers=A, params={"stream": "true", "starting_after": "2"})
        events = frames(r.content)
        assert events[0]["sequence_number"] == 3 and events[-1]["type"] == "response.completed"
        delta = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert SLOW_TEXT.endswith(delta) and delta


async def test_cancel_ends_it_cancelled_and_settles(served: ServedApp, fake: FakeOpenAIChat) -> None:
    fake.add(slow(0.5))
    async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
        r = await c.post("/v1/responses", headers=A, json={"model": "m", "input": "hi", "background": True})
        rid = r.json()["id"]
        await asyncio.sleep(0.8)
        began = time.monotonic()
        r = await c.post(f"/v1/responses/{rid}/cancel", headers=A)
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "cancelled" and time.monotonic() - began < 3
        assert (await c.get(f"/v1/responses/{rid}", headers=A)).json()["status"] == "cancelled"
        events = frames((await c.get(f"/v1/responses/{rid}", headers=A, params={"stream": "true"})).content)
        assert events[-1]["type"] == "response.cancelled"
        assert events[-1]["response"]["status"] == "cancelled"
        # cancelling again answers the same resource
        again = await c.post(f"/v1/responses/{rid}/cancel", headers=A)
        assert again.status_code == 200 and again.json()["status"] == "cancelled"
        # the upstream call was cut before its stream ended
        await asyncio.wait_for(fake.disconnected.wait(), 5)
        assert fake.disconnects == 1


async def test_cancel_of_a_foreground_response_is_refused(served: ServedApp, fake: FakeOpenAIChat) -> None:
    fake.add(Reply.text("fine"))
    async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
        rid = (await c.post("/v1/responses", headers=A, json={"model": "m", "input": "hi"})).json()["id"]
        r = await c.post(f"/v1/responses/{rid}/cancel", headers=A)
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_id"
        r = await c.get(f"/v1/responses/{rid}", headers=A, params={"stream": "true"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
        r = await c.post("/v1/responses/resp_nope/cancel", headers=A)
        assert r.status_code == 404


async def test_refusals(served: ServedApp) -> None:
    async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
        body = {"model": "m", "input": "hi", "background": True}
        r = await c.post("/v1/responses", headers=A, json={**body, "store": False})
        assert r.status_code == 400 and r.json()["error"]["param"] == "background"
        r = await c.post("/v1/responses", headers={"Authorization": "Bearer sk-n"}, json=body)
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "store_not_allowed"
        assert r.json()["error"]["param"] == "background"
    async with ws_connect(served, additional_headers=A) as ws:
        [msg] = await run_turn(ws, model="m", input="x", background=True)
        assert msg["type"] == "error" and msg["error"]["param"] == "background"


async def test_the_openai_sdk(served: ServedApp, fake: FakeOpenAIChat) -> None:
    fake.add(slow(0.2))
    fake.add(slow(0.5))
    client = openai.AsyncOpenAI(base_url=served.base_url + "/v1", api_key="sk-a", max_retries=0)
    async with client:
        res = await client.responses.create(model="m", input="hi", background=True)
        assert res.status in ("queued", "in_progress") and res.background
        while res.status in ("queued", "in_progress"):
            await asyncio.sleep(0.1)
            res = await client.responses.retrieve(res.id)
        assert res.status == "completed" and res.output_text == SLOW_TEXT
        stream = await client.responses.retrieve(res.id, stream=True, starting_after=3)
        numbers = [event.sequence_number async for event in stream]
        assert numbers[0] == 4 and numbers[-1] > 10
        other = await client.responses.create(model="m", input="hi", background=True)
        await asyncio.sleep(0.7)
        cancelled = await client.responses.cancel(other.id)
        assert cancelled.status == "cancelled"


async def test_a_continuation_waits_for_the_end(served: ServedApp, fake: FakeOpenAIChat) -> None:
    """``previous_response_id`` of a background response still running is a 400; once it has
    ended, the continuation carries its output."""
    fake.add(slow(0.1))
    fake.add(Reply.text("next"))
    async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
        r = await c.post("/v1/responses", headers=A, json={"model": "m", "input": "hi", "background": True})
        rid = r.json()["id"]
        body = {"model": "m", "input": "and?", "previous_response_id": rid}
        r = await c.post("/v1/responses", headers=A, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "previous_response_id"
        await poll(c, rid, "completed")
        r = await c.post("/v1/responses", headers=A, json=body)
        assert r.status_code == 200, r.text
        sent = fake.requests[-1].body["messages"]
        assert [m["role"] for m in sent] == ["user", "assistant", "user"]
        assert sent[1]["content"] == SLOW_TEXT
