"""Background responses past the tenant's concurrency limit wait ``queued`` (not refused), are run
in FIFO order, each taking the slot the previous one freed; past ``background_queue_size`` waiting
a request is a 429 ``background_queue_full``; a queued response cancelled never reaches the
upstream. With the limiter in memory and in a real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import orjson
import pytest

from tests.api.background.test_background_http import config, poll, slow
from tests.fakes.openai_chat import FakeOpenAIChat
from tests.harness import ServedApp
from tests.helpers import A, fake_fixtures, sse_events
from tests.redis_server import delete_prefix, redis_url, unique_prefix
from tests.ws.helpers import serve

fake_server, fake = fake_fixtures(FakeOpenAIChat)


@pytest.fixture(params=["memory", "redis"])
def served(request: pytest.FixtureRequest, fake: FakeOpenAIChat) -> Iterator[ServedApp]:
    prefix = unique_prefix()
    cfg = config(fake, request.param, prefix)
    cfg["tenants"]["a"] = {"limits": {"concurrent_requests": 1}}
    cfg["limits"] = {"background_queue_size": 2}
    with serve(cfg) as gw:
        yield gw
    if request.param == "redis":
        delete_prefix(redis_url(), prefix)


def said(body: dict[str, object]) -> str:
    messages = body["messages"]
    assert isinstance(messages, list)
    return str(messages[-1]["content"])


async def test_past_the_limit_they_queue_in_order(served: ServedApp, fake: FakeOpenAIChat) -> None:
    for _ in range(3):
        fake.add(slow(0.1))
    async with httpx.AsyncClient(base_url=served.base_url, timeout=30) as c:
        made = []
        for n in range(3):
            body = {"model": "m", "input": f"n{n}", "background": True}
            r = await c.post("/v1/responses", headers=A, json=body)
            assert r.status_code == 200, r.text
            made.append(r.json())
        assert [m["status"] for m in made] == ["in_progress", "queued", "queued"]
        r = await c.post("/v1/responses", headers=A, json={"model": "m", "input": "n3", "background": True})
        assert r.status_code == 429 and r.json()["error"]["code"] == "background_queue_full"
        # a foreground request past the limit is still refused as before
        r = await c.post("/v1/responses", headers=A, json={"model": "m", "input": "fg"})
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
        assert (await c.get(f"/v1/responses/{made[2]['id']}", headers=A)).json()["status"] == "queued"
        for m in made:
            await poll(c, m["id"], "completed")
        assert [said(req.body) for req in fake.requests] == ["n0", "n1", "n2"]  # FIFO
        await asyncio.sleep(0.3)  # the ledger's hook comes after the store's
        totals = (await c.get("/v1/usage", headers=A)).json()["totals"]
        assert totals["requests"] == 3 and totals["output_tokens"] == 3 * 7  # each once
        events = sse_events(
            (await c.get(f"/v1/responses/{made[1]['id']}", headers=A, params={"stream": "true"})).text
        )
        kinds = [e["type"] for e in events]
        assert kinds[:3] == ["response.created", "response.queued", "response.in_progress"]
        assert events[0]["response"]["status"] == "queued"
        assert [e["sequence_number"] for e in events] == list(range(len(events)))


async def test_a_queued_response_cancelled_never_runs(served: ServedApp, fake: FakeOpenAIChat) -> None:
    fake.add(slow(0.2))
    fake.add(slow(0.05))
    async with httpx.AsyncClient(base_url=served.base_url, timeout=30) as c:
        first = (
            await c.post("/v1/responses", headers=A, json={"model": "m", "input": "a", "background": True})
        ).json()
        body = {"model": "m", "input": "b", "background": True, "stream": True}
        async with c.stream("POST", "/v1/responses", headers=A, json=body) as r:
            lines = r.aiter_lines()
            queued = []
            async for line in lines:
                if line.startswith("data: "):
                    queued.append(orjson.loads(line[6:]))
                if len(queued) == 2:
                    break
        assert [e["type"] for e in queued] == ["response.created", "response.queued"]
        rid = queued[0]["response"]["id"]
        r = await c.post(f"/v1/responses/{rid}/cancel", headers=A)
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
        await poll(c, first["id"], "completed")
        await asyncio.sleep(0.3)
        assert [said(req.body) for req in fake.requests] == ["a"]
        events = sse_events((await c.get(f"/v1/responses/{rid}", headers=A, params={"stream": "true"})).text)
        assert [e["type"] for e in events] == ["response.created", "response.queued", "response.cancelled"]
