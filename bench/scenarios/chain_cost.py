"""Continuation cost vs chain length, memory vs Redis: ``chain()`` (what a continuation reads)
latency and bytes read, and ``put()`` of the continuation (which extends its ancestors' TTLs).

Run from the repo root: ``python -m bench chain_cost`` (Redis from ``REDIS_URL``, else
127.0.0.1:6379, else a private redis-server). Takes a few seconds.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import Any

from redis.asyncio.connection import AbstractConnection

from bench.lib import redis_server
from state import codec
from state.base import ResponseStore, StoredResponse
from state.memory import MemoryStore
from state.redis import RedisStore

LENGTHS = (1, 10, 100)
ITERATIONS = {1: 400, 10: 300, 100: 100}
TENANT = "bench"


def turn(prev: str | None, i: int) -> StoredResponse:
    """One realistic-ish turn: ~300 characters in, ~700 out."""
    rid = f"resp_{uuid.uuid4().hex}"
    user = {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": f"question {i} " + "q" * 300}],
    }
    text = {"type": "output_text", "text": f"answer {i} " + "a" * 700, "annotations": []}
    answer = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "content": [text]}
    resource = {
        "id": rid,
        "object": "response",
        "status": "completed",
        "model": "mock",
        "previous_response_id": prev,
        "output": [answer],
        "usage": {"input_tokens": 100, "output_tokens": 200, "total_tokens": 300},
    }
    return StoredResponse(rid, TENANT, "mock", prev, [user], resource, 1_700_000_000, time.time())


async def build_chain(store: ResponseStore, n: int) -> str:
    prev: str | None = None
    for i in range(n):
        r = turn(prev, i)
        await store.put(r)
        prev = r.id
    assert prev is not None
    return prev


class RoundTrips:
    """Counts packed sends to Redis (one per request or pipeline)."""

    def __init__(self) -> None:
        self.count = 0
        self._original = AbstractConnection.send_packed_command

    def __enter__(self) -> RoundTrips:
        original = self._original

        async def counting(conn: AbstractConnection, command: Any, check_health: bool = True) -> None:
            self.count += 1
            await original(conn, command, check_health)

        AbstractConnection.send_packed_command = counting  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        AbstractConnection.send_packed_command = self._original  # type: ignore[method-assign]


def p50_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


async def measure(name: str, store: ResponseStore) -> list[tuple[str, int, float, float, int, float, float]]:
    rows = []
    for n in LENGTHS:
        head = await build_chain(store, n)
        got = await store.chain(TENANT, head, 1000)  # warm-up (loads the Lua script once)
        assert got is not None and len(got) == n
        read = sum(len(codec.encode(r)) for r in got)
        times = []
        with RoundTrips() as trips:
            for _ in range(ITERATIONS[n]):
                started = time.perf_counter()
                await store.chain(TENANT, head, 1000)
                times.append(time.perf_counter() - started)
        times.sort()
        p50 = p50_ms(times)
        p95 = times[int(len(times) * 0.95) - 1] * 1000
        puts = []
        for i in range(ITERATIONS[n]):
            continuation = turn(head, n + i)
            started = time.perf_counter()
            await store.put(continuation)
            puts.append(time.perf_counter() - started)
        rows.append((name, n, p50, p95, read, trips.count / ITERATIONS[n], p50_ms(puts)))
    return rows


async def main() -> None:
    with redis_server.redis_url() as url:
        prefix = redis_server.unique_prefix()
        memory = MemoryStore(max_entries=100_000, max_bytes=10**9, ttl_seconds=600)
        redis = RedisStore(url, key_prefix=prefix, ttl_seconds=600, timeout_seconds=2.0)
        try:
            rows = await measure("memory", memory) + await measure("redis", redis)
        finally:
            await redis.aclose()
            redis_server.delete_prefix(url, prefix)
    header = ("store", "turns", "p50 ms", "p95 ms", "bytes read", "B/turn", "RTT/call", "put p50 ms")
    print("{:<7} {:>5} {:>8} {:>8} {:>11} {:>7} {:>8} {:>10}".format(*header))
    for name, n, p50, p95, read, trips, put in rows:
        print(
            f"{name:<7} {n:>5} {p50:>8.3f} {p95:>8.3f} {read:>11} {read // n:>7} {trips:>8.1f} {put:>10.3f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
