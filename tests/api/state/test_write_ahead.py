"""The write-ahead record of a ``store: true`` response, against a real Redis and the app under
uvicorn: written before the upstream call, minimal (no conversation content), invisible (a GET,
DELETE or input_items of its id is a 404, for its own tenant as for any other), replaced by the
stored response, dropped when the turn fails or the client leaves; and ``store: false`` writes no
record at all (only the usage ledger's counters reach Redis)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
import redis

from gateway.engine.store_health import MARGIN_SECONDS
from state.redis_background import STALE
from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.harness import ServedApp
from tests.helpers import TWO_TENANTS, A, B, chat_upstream, fake_fixtures, sse_events
from tests.redis_server import Monitor, delete_prefix, redis_url, unique_prefix
from tests.ws.helpers import run_turn, serve, ws_connect

fake_server, fake = fake_fixtures(FakeOpenAIChat)
SECRET = "saffron-4417"  # a conversation's content: never in a write-ahead record
DAY_MS = 24 * 3600 * 1000


@pytest.fixture
def prefix() -> Iterator[str]:
    p = unique_prefix()
    yield p
    delete_prefix(redis_url(), p)


@pytest.fixture
def served(fake: FakeOpenAIChat, prefix: str) -> Iterator[ServedApp]:
    """Two tenants, provider ``up`` the fake (no retries), the store in Redis: the defaults else."""
    cfg = chat_upstream(fake, {"m": {"provider": "up"}}, api_key="sk-up", retry={"attempts": 0})
    cfg["auth"] = TWO_TENANTS
    cfg["state"] = {"redis_url": redis_url(), "key_prefix": prefix}
    with serve(cfg) as gw:
        yield gw


def response_keys(prefix: str) -> dict[str, dict[bytes, bytes]]:
    """Every stored response and write-ahead record under ``prefix``: response id -> its hash."""
    r = redis.Redis.from_url(redis_url())
    try:
        return {
            key.decode().rsplit(":r:", 1)[1]: cast(dict[bytes, bytes], r.hgetall(key))
            for key in r.scan_iter(match=f"{prefix}:*:r:*")
        }
    finally:
        r.close()


def sweep(line: bytes) -> bool:
    """A MONITOR line of the background sweeper's read of a tenant's running index (every few
    seconds, whatever the traffic: gateway/engine/background.py), which writes nothing: its EVALSHA,
    the EVAL a fresh Redis gets instead (NOSCRIPT: the script's text), and the read inside it."""
    return STALE.sha.encode() in line or (b"ZRANGEBYSCORE" in line and b':bg"' in line)


def key_check(line: bytes) -> bool:
    """A MONITOR line of the virtual keys' version check (every 0.25 s, whatever the traffic:
    gateway/engine/vkeys.py), which reads one counter and writes nothing."""
    return b'"GET"' in line and b':{_vkeys}:ver"' in line


async def wait_for(check: Any, what: str, seconds: float = 10.0) -> Any:
    deadline = time.monotonic() + seconds
    while not (found := check()):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)
    return found


async def test_a_response_in_progress_has_only_its_record_and_is_not_found(
    served: ServedApp, fake: FakeOpenAIChat, prefix: str
) -> None:
    fake.add(Reply.text("the answer", delay=1.0))
    async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
        body = {"model": "m", "input": f"my word is {SECRET}"}
        creating = asyncio.create_task(c.post("/v1/responses", headers=A, json=body))
        records = await wait_for(lambda: response_keys(prefix), "no write-ahead record was written")
        [(rid, record)] = records.items()
        assert record.keys() == {b"status", b"tenant", b"created_at"}
        assert record[b"status"] == b"in_progress" and record[b"tenant"] == b"a"
        assert SECRET.encode() not in b"".join((*record.keys(), *record.values()))
        pttl = redis.Redis.from_url(redis_url()).pttl(f"{prefix}:{{a}}:r:{rid}")
        assert 600_000 < pttl <= (600 + MARGIN_SECONDS) * 1000  # timeouts.total + the margin
        for headers in (A, B):  # its own tenant as any other: nothing there yet
            assert (await c.get(f"/v1/responses/{rid}", headers=headers)).status_code == 404
            assert (await c.get(f"/v1/responses/{rid}/input_items", headers=headers)).status_code == 404
            assert (await c.delete(f"/v1/responses/{rid}", headers=headers)).status_code == 404
        done = await creating
        assert done.status_code == 200 and done.json()["id"] == rid
        assert int(record[b"created_at"]) == done.json()["created_at"]
        stored = response_keys(prefix)[rid]  # replaced by the response
        assert stored.keys() == {b"prev", b"blob", b"items"}
        assert redis.Redis.from_url(redis_url()).pttl(f"{prefix}:{{a}}:r:{rid}") > 29 * DAY_MS
        got = await c.get(f"/v1/responses/{rid}", headers=A)
        assert got.status_code == 200 and got.json()["status"] == "completed"
        assert (await c.get(f"/v1/responses/{rid}", headers=B)).status_code == 404


async def test_a_turn_that_ends_unstored_drops_its_record(
    served: ServedApp, fake: FakeOpenAIChat, prefix: str
) -> None:
    async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
        # failed before its first event: a 5xx from the upstream
        fake.add(Reply.error(500))
        r = await c.post("/v1/responses", headers=A, json={"model": "m", "input": "x"})
        assert r.status_code >= 500
        # failed mid-stream: the upstream drops the connection
        fake.add(Reply.text("cut short", pieces=6, disconnect_after=3))
        r = await c.post("/v1/responses", headers=A, json={"model": "m", "input": "y", "stream": True})
        events = sse_events(r.text)
        assert events[-1]["type"] == "response.failed"
        assert len(fake.requests) == 2
        assert response_keys(prefix) == {}
        # the client leaves mid-stream: cancelled
        fake.add(Reply.text("slow " * 20, pieces=20, chunk_delay=0.3, split=None))
        body = {"model": "m", "input": "z", "stream": True}
        async with c.stream("POST", "/v1/responses", headers=A, json=body) as streamed:
            async for line in streamed.aiter_lines():
                if line.startswith("data: ") and "response.created" in line:
                    break
            assert len(response_keys(prefix)) == 1  # its record, while it runs
        await wait_for(lambda: not response_keys(prefix), "the cancelled turn's record stayed")


async def test_store_false_writes_nothing_of_a_response_to_redis(
    served: ServedApp, fake: FakeOpenAIChat, prefix: str
) -> None:
    monitor = Monitor(redis_url())
    try:
        async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
            body = {"model": "m", "input": SECRET, "store": False}
            assert (await c.post("/v1/responses", headers=A, json=body)).status_code == 200
            r = await c.post("/v1/responses", headers=A, json={**body, "stream": True})
            assert sse_events(r.text)[-1]["type"] == "response.completed"
        async with ws_connect(served, additional_headers=A) as ws:
            events = await run_turn(ws, model="m", input=SECRET, store=False)
            assert events[-1]["type"] == "response.completed"
    finally:
        seen = monitor.stop()
    ours = [
        line
        for line in seen.split(b"\r\n")
        if prefix.encode() in line and not sweep(line) and not key_check(line)
    ]
    assert ours, "MONITOR saw none of this gateway's commands"
    others = [line for line in ours if b":u:" not in line]
    assert not others, others  # the usage ledger's counters, nothing else
    # (only this gateway's lines: the Redis server may serve other processes' tests at the same time)
    assert not [line for line in ours if SECRET.encode() in line or b"in_progress" in line], ours
    assert response_keys(prefix) == {}
    assert len(fake.requests) == 3
