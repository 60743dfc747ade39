"""No limiter charge without an outcome (gateway/engine/limits.py, state/limits/): clients that
leave while their admission is in flight, and a Redis frozen (SIGSTOP) during a burst, leave no
lease, request count or token charge in Redis beyond what the served requests account for. Each
test has a redis-server of its own, and reads its keys directly."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, cast

import httpx
import orjson
import pytest
import redis

from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.harness import ServedApp
from tests.helpers import chat_upstream
from tests.redis_server import RedisServer, unique_prefix
from tests.ws.helpers import create, serve, ws_connect

KEY = {"Authorization": "Bearer sk-a"}
BODY = {"model": "m", "input": "hello there", "max_output_tokens": 500, "store": False}
LIMITS = {
    "requests_per_minute": 100_000,
    "tokens_per_minute": 10**9,
    "concurrent_requests": 1000,
    "websocket_connections": 1000,
}


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


def settings(fake: FakeOpenAIChat, url: str, prefix: str, **limits: Any) -> dict[str, Any]:
    return {
        **chat_upstream(fake, {"m": {"provider": "up"}}, api_key="sk-up", retry={"attempts": 0}),
        "auth": {"api_keys": [{"key": "sk-a", "tenant": "a"}]},
        "tenants": {"a": {"limits": LIMITS, "budget": {"tokens": 10**12, "period": "month"}}},
        "state": {"redis_url": url, "key_prefix": prefix},
        "limits": limits,
    }


class Charges:
    """What tenant ``a`` has charged in Redis, read from the keys themselves."""

    def __init__(self, url: str, prefix: str) -> None:
        self.db = redis.Redis.from_url(url)
        self.base = f"{prefix}:{{a}}:l:"

    def read(self) -> dict[str, int]:
        db, base = self.db, self.base
        budget = [k for k in db.scan_iter(match=base + "budget:*")]
        records = [k for k in db.scan_iter(match=base + "a:*")]
        open_records = sum(1 for k in records if db.get(k) not in (None, b"v"))
        return {
            "leases": int(db.zcard(base + "conc")) + int(db.zcard(base + "ws")),
            "requests": int(db.hget(base + "rpm", "n") or 0),
            "tokens": int(db.hget(base + "tpm", "n") or 0),
            "budget": sum(int(db.get(k) or 0) for k in budget),
            "unsettled": open_records,  # admissions charged and neither settled nor released
        }

    async def until(self, want: Callable[[dict[str, int]], bool], seconds: float = 20.0) -> dict[str, int]:
        """The charges once ``want`` holds of them (or as they are when ``seconds`` have passed)."""
        deadline = time.monotonic() + seconds
        while True:
            now = self.read()
            if want(now) or time.monotonic() > deadline:
                return now
            await asyncio.sleep(0.1)


def http_request(port: int, body: dict[str, Any]) -> bytes:
    payload = orjson.dumps(body)
    head = (
        f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer sk-a\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def reach_upstream(port: int, fake: FakeOpenAIChat) -> asyncio.StreamWriter:
    """Send a request and wait until the upstream has it (the connection stays open)."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(http_request(port, BODY))
    for _ in range(1000):
        if fake.requests:
            return writer
        await asyncio.sleep(0.01)
    raise AssertionError("the request did not reach the upstream")


async def leave_http(port: int, body: dict[str, Any], after: float) -> None:
    """Send the request whole, then hang up ``after`` seconds later."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(http_request(port, body))
    await writer.drain()
    await asyncio.sleep(after)
    writer.transport.abort()


async def leave_ws(served: ServedApp, body: dict[str, Any], after: float) -> None:
    """Open a socket (its own lease), send a create, hang up ``after`` seconds later."""
    ws = await ws_connect(served, additional_headers=KEY)
    fields = {k: v for k, v in body.items() if k != "stream"}
    await ws.send(create(**fields))
    await asyncio.sleep(after)
    ws.transport.abort()


async def storm(leave: Callable[[float], Awaitable[None]], n: int = 200, width: int = 40) -> None:
    gate = asyncio.Semaphore(width)
    rng = random.Random(19)

    async def one() -> None:
        async with gate:
            await leave(rng.uniform(0, 0.05))

    await asyncio.gather(*(one() for _ in range(n)))


async def test_clients_that_leave_early_leave_no_charge(private_redis: RedisServer) -> None:
    """200 clients per transport (JSON, SSE, WebSocket) leave 0–50 ms after sending, 40 at a time,
    while the upstream takes 10 s to answer: afterwards no lease is held, no admission is left
    unsettled, and the request and token counts are exactly those of the admitted requests, each
    charged its estimated input (nothing was produced)."""
    p = unique_prefix()
    charges = Charges(private_redis.url, p)
    async with FakeOpenAIChat.serve() as fake:
        fake.default = Reply.text("never read", delay=10)
        with serve(settings(fake, private_redis.url, p)) as served:
            # one request that reaches the upstream, then leaves: what one admitted request costs
            writer = await reach_upstream(served.port, fake)
            writer.transport.abort()
            one = await charges.until(lambda c: c["leases"] == 0 and c["unsettled"] == 0)
            assert one["requests"] == 1 and one["leases"] == 0, one
            estimate = one["tokens"]
            assert 0 < estimate < 100 and one["budget"] == estimate

            await storm(lambda after: leave_http(served.port, BODY, after))
            await storm(lambda after: leave_http(served.port, {**BODY, "stream": True}, after))
            await storm(lambda after: leave_ws(served, BODY, after))

            def settled(c: dict[str, int]) -> bool:
                return c["leases"] == 0 and c["unsettled"] == 0 and c["tokens"] == c["requests"] * estimate

            after = await charges.until(settled)
            reached = len(fake.requests)
    assert after["leases"] == 0, after
    assert after["unsettled"] == 0, after
    assert after["tokens"] == after["requests"] * estimate, after
    assert after["budget"] == after["tokens"], after
    # every request the upstream saw was admitted and counted; none counted more than once
    assert reached <= after["requests"] <= 601, (reached, after)


@pytest.mark.parametrize("mode", ["allow", "deny"])
async def test_a_frozen_redis_during_a_burst_leaves_no_charge(private_redis: RedisServer, mode: str) -> None:
    """Redis SIGSTOPped (for 3 s, and on until an admission has timed out) while 40 clients send
    requests back to back: the admissions that time out (served unlimited, or refused with 503) run
    when Redis resumes and are undone, the settlements sent meanwhile land; afterwards Redis holds
    exactly the requests that were admitted (the answers with x-ratelimit headers), each charged
    its real usage, and no lease.

    The freeze lasts until an answer shows a timed-out admission: on a loaded machine every client
    may be past its admission when Redis stops, then wait out ``state.timeout_seconds`` on the
    usage ledger's write, and send its next admission only after a fixed freeze has ended."""
    p = unique_prefix()
    charges = Charges(private_redis.url, p)
    answers: list[httpx.Response] = []
    async with FakeOpenAIChat.serve() as fake:
        fake.default = Reply.text("ok", usage=(11, 7))
        with serve(settings(fake, private_redis.url, p, on_limiter_error=mode)) as served:
            loop = asyncio.get_running_loop()
            thawed, timed_out = asyncio.Event(), asyncio.Event()
            async with httpx.AsyncClient(base_url=served.base_url, timeout=30) as client:

                async def worker() -> None:
                    while not thawed.is_set():
                        answer = await client.post("/v1/responses", headers=KEY, json=BODY)
                        answers.append(answer)
                        if "x-ratelimit-limit-requests" not in answer.headers:
                            timed_out.set()
                    stop_at = loop.time() + 1.0  # and on, with Redis answering again
                    while loop.time() < stop_at:
                        answers.append(await client.post("/v1/responses", headers=KEY, json=BODY))

                async def freeze() -> None:
                    await asyncio.sleep(0.8)
                    assert private_redis.proc is not None
                    private_redis.proc.send_signal(signal.SIGSTOP)
                    try:
                        await asyncio.sleep(3.0)
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(timed_out.wait(), 30.0)
                    finally:
                        private_redis.proc.send_signal(signal.SIGCONT)
                        thawed.set()

                await asyncio.gather(freeze(), *(worker() for _ in range(40)))
            admitted = [r for r in answers if "x-ratelimit-limit-requests" in r.headers]
            spared = [r for r in answers if "x-ratelimit-limit-requests" not in r.headers]
            assert admitted and spared, (len(admitted), len(spared))
            assert {r.status_code for r in admitted} == {200}
            assert {r.status_code for r in spared} == {200 if mode == "allow" else 503}
            assert all(r.json()["usage"]["total_tokens"] == 18 for r in admitted)
            want = {"leases": 0, "requests": len(admitted), "tokens": 18 * len(admitted)}
            after = await charges.until(lambda c: {k: c[k] for k in want} == want and c["unsettled"] == 0)
    assert {k: after[k] for k in want} == want, (after, len(spared))
    assert after["budget"] == after["tokens"] and after["unsettled"] == 0, after


async def test_a_lease_lasts_its_requests_deadline(private_redis: RedisServer) -> None:
    """A request on a route whose calls may take 20 s holds its lease for those 20 s plus the
    margin, not for the longest total of any provider (600 s here) plus a minute."""
    p = unique_prefix()
    charges = Charges(private_redis.url, p)
    async with FakeOpenAIChat.serve() as fake:
        fake.default = Reply.text("late", delay=10)
        cfg = settings(fake, private_redis.url, p)
        cfg["providers"]["up"]["timeouts"] = {"total": 20}
        cfg["providers"]["other"] = {"kind": "openai-chat", "base_url": fake.base_url, "api_key": "sk-up"}
        with serve(cfg) as served:
            writer = await reach_upstream(served.port, fake)
            zset = charges.db.zrange(charges.base + "conc", 0, -1, withscores=True)
            [(_, until)] = cast(list[tuple[bytes, float]], zset)
            seconds, micros = charges.db.time()
            left = until / 1000 - (seconds + micros / 1e6)
            writer.transport.abort()
            assert 20 + 60 - 5 < left <= 20 + 60, left
            assert (await charges.until(lambda c: c["leases"] == 0))["leases"] == 0
