"""Background responses across replicas: two real gateway processes (``python -m gateway serve``)
on one real Redis, standalone, Cluster and Sentinel. The response runs on one; the other reads it
as it moves, resumes its stream at several ``starting_after`` points (live and after the end),
cancels it (through Redis: the owner's heartbeat reads the flag) and refuses another tenant; and
when the owner is SIGKILLed mid-response, the survivor marks it failed within the lease's bound
and a follower gets that terminal event."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import redis

from gateway.engine.background import FOLLOW_SECONDS, LEASE_SECONDS, SWEEP_SECONDS
from tests.api.procs import SLOW_TEXT, Gateway
from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.helpers import TWO_TENANTS, A, B, fake_fixtures, sse_events
from tests.redis_server import unique_prefix
from tests.redis_topology import Target, standalone_target

fake_server, fake = fake_fixtures(FakeOpenAIChat)


def slow(seconds: float) -> Reply:
    return Reply.text(SLOW_TEXT, pieces=8, chunk_delay=seconds, split=None, comments=False)


@contextlib.asynccontextmanager
async def replicas(
    tmp: Path, fake: FakeOpenAIChat, target: Target, prefix: str | None = None, **extra: Any
) -> AsyncIterator[list[Gateway]]:
    prefix = prefix or unique_prefix()
    cfg = {
        "providers": {
            "up": {
                "kind": "openai-chat",
                "base_url": fake.base_url,
                "api_key": "sk-up",
                "retry": {"attempts": 0},
            }
        },
        "models": {"m": {"provider": "up"}},
        "auth": TWO_TENANTS,
        "state": target.state(prefix),
        **extra,
    }
    gws: list[Gateway] = []
    try:
        for name in ("one", "two"):
            (tmp / name).mkdir()
            gws.append(Gateway(tmp / name, cfg))
        for gw in gws:
            await gw.started()
        yield gws
    finally:
        for gw in gws:
            await gw.stop(seconds=20)
        target.delete_prefix(prefix)


def newest_entry(raw: redis.Redis, key: str) -> dict[bytes, bytes]:
    """The fields of a Stream's newest entry ({} when it has none)."""
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], raw.xrevrange(key, count=1))
    return entries[0][1] if entries else {}


def events_of(body: bytes) -> list[dict[str, Any]]:
    return sse_events(body.decode())


async def status(c: httpx.AsyncClient, rid: str) -> str:
    r = await c.get(f"/v1/responses/{rid}", headers=A)
    assert r.status_code == 200, r.text
    state: str = r.json()["status"]
    return state


async def wait_status(c: httpx.AsyncClient, rid: str, want: str, seconds: float) -> float:
    began = deadline = time.monotonic()
    deadline += seconds
    while (got := await status(c, rid)) != want:
        assert time.monotonic() < deadline, got
        await asyncio.sleep(0.1)
    return time.monotonic() - began


async def test_resume_and_cancel_from_the_other_replica(
    tmp_path: Path, fake: FakeOpenAIChat, target: Target
) -> None:
    fake.add(slow(0.3))
    fake.add(slow(0.5))
    async with replicas(tmp_path, fake, target) as (one, two):
        body = {"model": "m", "input": "hi", "background": True}
        async with httpx.AsyncClient(base_url=one.url, timeout=30) as c:
            r = await c.post("/v1/responses", headers=A, json=body)
            assert r.status_code == 200, r.text
            rid = r.json()["id"]
        async with httpx.AsyncClient(base_url=two.url, timeout=30) as c:
            assert await status(c, rid) == "in_progress"
            # live, from the other replica: replayed up to now, then followed to the end
            r = await c.get(
                f"/v1/responses/{rid}", headers=A, params={"stream": "true", "starting_after": "1"}
            )
            live = events_of(r.content)
            assert live[0]["sequence_number"] == 2 and live[-1]["type"] == "response.completed"
            whole = events_of(
                (await c.get(f"/v1/responses/{rid}", headers=A, params={"stream": "true"})).content
            )
            assert whole[2:] == live
            assert [e["sequence_number"] for e in whole] == list(range(len(whole)))
            for n in (0, 5, len(whole) - 2):
                params = {"stream": "true", "starting_after": str(n)}
                assert (
                    events_of((await c.get(f"/v1/responses/{rid}", headers=A, params=params)).content)
                    == whole[n + 1 :]
                )
            done = (await c.get(f"/v1/responses/{rid}", headers=A)).json()
            assert done["status"] == "completed" and done["output"][0]["content"][0]["text"] == SLOW_TEXT
            # another tenant: not found, whatever it asks
            assert (await c.get(f"/v1/responses/{rid}", headers=B)).status_code == 404
            assert (
                await c.get(f"/v1/responses/{rid}", headers=B, params={"stream": "true"})
            ).status_code == 404
            assert (await c.post(f"/v1/responses/{rid}/cancel", headers=B)).status_code == 404
        # cancelled through the replica that does not run it
        async with httpx.AsyncClient(base_url=one.url, timeout=30) as c:
            other = (await c.post("/v1/responses", headers=A, json=body)).json()["id"]
        await asyncio.sleep(0.8)
        sdk = openai.AsyncOpenAI(base_url=two.url + "/v1", api_key="sk-a", max_retries=0)
        async with sdk:
            cancelled = await sdk.responses.cancel(other)
            assert cancelled.status == "cancelled"
            await asyncio.wait_for(fake.disconnected.wait(), 5)  # the upstream call was cut
            # the owner heard it on its control stream, not at a heartbeat
            await one.wait_log(lambda logs: any(e.get("event") == "background_cancel" for e in logs), 5)
            assert [e["via"] for e in one.events("background_cancel")] == ["control"]
            stream = await sdk.responses.retrieve(other, stream=True, starting_after=0)
            kinds: list[str] = [str(event.type) async for event in stream]  # the SDK types lack it
            assert kinds[-1] == "response.cancelled"
            assert (await sdk.responses.retrieve(other)).status == "cancelled"


async def test_the_owner_killed_mid_response_is_marked_failed(
    tmp_path: Path, fake: FakeOpenAIChat, target: Target
) -> None:
    fake.add(slow(5))  # ~40 s: far longer than the test
    async with replicas(tmp_path, fake, target) as (one, two):
        async with httpx.AsyncClient(base_url=one.url, timeout=30) as c:
            r = await c.post(
                "/v1/responses", headers=A, json={"model": "m", "input": "hi", "background": True}
            )
            rid = r.json()["id"]
        async with httpx.AsyncClient(base_url=two.url, timeout=60) as c:
            await asyncio.sleep(1.0)
            assert await status(c, rid) == "in_progress"
            follower = asyncio.create_task(
                c.get(f"/v1/responses/{rid}", headers=A, params={"stream": "true"})
            )
            await asyncio.sleep(0.5)
            one.proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            r = await asyncio.wait_for(follower, LEASE_SECONDS + 10)
            took = time.monotonic() - killed
            assert took <= LEASE_SECONDS + 2 * FOLLOW_SECONDS + 1, took
            events = events_of(r.content)
            assert events[0]["type"] == "response.created"
            last = events[-1]
            assert last["type"] == "response.failed"
            assert last["sequence_number"] == events[-2]["sequence_number"] + 1
            assert last["response"]["error"]["code"] == "server_error"
            assert "stopped while generating" in last["response"]["error"]["message"]
            res = (await c.get(f"/v1/responses/{rid}", headers=A)).json()
            assert res["status"] == "failed" and res["error"]["code"] == "server_error"
            assert res["background"] is True


async def test_a_drain_finishes_what_it_can_and_fails_the_rest(
    tmp_path: Path, fake: FakeOpenAIChat, redis_url: str
) -> None:
    """SIGTERM with ``ws_drain_seconds: 2``: a background response that ends within the drain
    completes, one that cannot ends failed with the drain's message; nothing is left running."""
    fake.add(slow(0.1))  # ~1 s
    fake.add(slow(5))  # ~40 s
    target = standalone_target(redis_url)
    async with replicas(tmp_path, fake, target, limits={"ws_drain_seconds": 2}) as (one, two):
        body = {"model": "m", "input": "hi", "background": True}
        async with httpx.AsyncClient(base_url=one.url, timeout=30) as c:
            quick = (await c.post("/v1/responses", headers=A, json=body)).json()["id"]
            long = (await c.post("/v1/responses", headers=A, json=body)).json()["id"]
        await asyncio.sleep(0.3)
        one.proc.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal it drained on
        assert await asyncio.to_thread(one.proc.wait, 20) in (0, -signal.SIGTERM)
        async with httpx.AsyncClient(base_url=two.url, timeout=30) as c:
            assert await status(c, quick) == "completed"
            res = (await c.get(f"/v1/responses/{long}", headers=A)).json()
            assert res["status"] == "failed", res["status"]
            assert "shut down" in res["error"]["message"]
            events = events_of(
                (await c.get(f"/v1/responses/{long}", headers=A, params={"stream": "true"})).content
            )
            assert events[-1]["type"] == "response.failed"


async def test_a_dead_owners_response_is_swept_when_nobody_looks(
    tmp_path: Path, fake: FakeOpenAIChat, redis_url: str
) -> None:
    """SIGKILL of the owner, and no client reads the response: the survivor's sweeper marks it
    failed within the lease plus a sweep (its terminal event is in its Redis Stream before any
    read), and drops it from the tenant's running index."""
    fake.add(slow(5))
    prefix = unique_prefix()
    async with replicas(tmp_path, fake, standalone_target(redis_url), prefix) as (one, two):
        async with httpx.AsyncClient(base_url=one.url, timeout=30) as c:
            r = await c.post(
                "/v1/responses", headers=A, json={"model": "m", "input": "hi", "background": True}
            )
            rid = r.json()["id"]
        await asyncio.sleep(1.0)
        raw = redis.Redis.from_url(redis_url)
        try:
            assert raw.zscore(f"{prefix}:{{a}}:bg", rid) is not None
            one.proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            while (last := newest_entry(raw, f"{prefix}:{{a}}:e:{rid}")).get(b"t") != b"1":
                assert time.monotonic() - killed < LEASE_SECONDS + SWEEP_SECONDS + 3, "never swept"
                await asyncio.sleep(0.2)
            assert b"response.failed" in last[b"d"]
            assert raw.zscore(f"{prefix}:{{a}}:bg", rid) is None
        finally:
            raw.close()
        async with httpx.AsyncClient(base_url=two.url, timeout=30) as c:
            res = (await c.get(f"/v1/responses/{rid}", headers=A)).json()
            assert res["status"] == "failed" and res["error"]["code"] == "server_error"
