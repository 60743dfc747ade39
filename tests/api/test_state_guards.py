"""What the store is promised, against a real Redis: a ``store: true`` turn is refused before any
upstream spend while the store is down, and a truncated turn stores what the client sent (its
compaction items still sealed), never the opened or truncated view the upstream saw."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from compact.seal import Sealer
from tests.fakes.openai_chat import FakeOpenAIChat
from tests.harness import serve_gateway
from tests.helpers import chat_upstream, fake_fixtures
from tests.redis_server import RedisServer, delete_prefix, redis_url, unique_prefix

fake_server, fake = fake_fixtures(FakeOpenAIChat)
KEY = bytes(range(32))
SUMMARY = "PLAINTEXT-OF-THE-SUMMARY-7f3a9c: the user's code word is cobalt"


@pytest.fixture(scope="module")
def prefix() -> Iterator[str]:
    p = unique_prefix()
    yield p
    delete_prefix(redis_url(), p)


async def post(base_url: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base_url, timeout=15) as c:
        return await c.post("/v1/responses", json=body)


async def test_store_true_is_refused_before_the_upstream_while_the_store_is_down(
    fake: FakeOpenAIChat, prefix: str
) -> None:
    server = RedisServer().start()
    try:
        cfg = chat_upstream(fake, {"m": {"provider": "up"}}, api_key="sk-up", retry={"attempts": 0})
        cfg["state"] = {
            "redis_url": server.url,
            "key_prefix": prefix,
            "timeout_seconds": 0.5,
            "health_recheck_seconds": 0.2,
        }
        with serve_gateway(cfg) as gw:
            ok = await post(gw.base_url, {"model": "m", "input": "before"})
            assert ok.status_code == 200, ok.text
            assert len(fake.requests) == 1
            server.stop()
            await asyncio.sleep(0.3)  # past the recheck interval: the next store: true request probes
            for body in ({"model": "m", "input": "x"}, {"model": "m", "input": "y", "stream": True}):
                t0 = time.monotonic()
                r = await post(gw.base_url, body)
                assert r.status_code == 503, r.text
                assert r.json()["error"]["code"] == "service_unavailable"
                assert time.monotonic() - t0 < 3  # no wait beyond the state timeout
            assert len(fake.requests) == 1  # no upstream tokens spent on answers that cannot be kept
            zero = await post(gw.base_url, {"model": "m", "input": "z", "store": False})
            assert zero.status_code == 200 and len(fake.requests) == 2  # store: false is unaffected
            server.start()
            await asyncio.sleep(0.3)
            again = await post(gw.base_url, {"model": "m", "input": "after"})
            assert again.status_code == 200, again.text
    finally:
        server.stop()


def _redis_values(url: str, prefix: str) -> bytes:
    """Every value under ``prefix`` in the real Redis, concatenated (strings, hashes, lists, sets)."""
    r = redis.Redis.from_url(url)
    out: list[bytes] = []
    for key in r.scan_iter(match=f"{prefix}*"):
        kind = r.type(key)
        if kind == b"string":
            out.append(r.get(key) or b"")
        elif kind == b"hash":
            for k, v in r.hgetall(key).items():
                out += [k, v]
        elif kind == b"list":
            out += r.lrange(key, 0, -1)
        elif kind in (b"set", b"zset"):
            out += (
                list(r.smembers(key))
                if kind == b"set"
                else [m for m, _ in r.zrange(key, 0, -1, withscores=True)]
            )
    r.close()
    return b"\n".join(out)


async def test_truncation_keeps_the_stored_input_as_sent_and_sealed(prefix: str) -> None:
    p = prefix + "-seal"
    cfg = {
        "models": {"small": {"provider": "mock", "upstream_model": "mock", "context_window": 300}},
        "compaction": {"keys": [base64.b64encode(KEY).decode()]},
        "state": {"redis_url": redis_url(), "key_prefix": p},
    }
    sealed = Sealer([KEY]).seal(
        {
            "v": 1,
            "id": "cmp_test",
            "summary": SUMMARY,
            "created_at": 0,
            "model": "small",
            "summarized_items": 3,
        },
        "default",
    )
    items = [
        {"type": "compaction", "id": "cmp_test", "encrypted_content": sealed},
        {"type": "message", "role": "user", "content": "OLDER " + "z" * 900},
        {"type": "message", "role": "user", "content": "the newest question"},
    ]
    try:
        with serve_gateway(cfg) as gw:
            r = await post(gw.base_url, {"model": "small", "input": items, "truncation": "auto"})
            assert r.status_code == 200, r.text
            rid = r.json()["id"]
            async with httpx.AsyncClient(base_url=gw.base_url, timeout=15) as c:
                listed = (await c.get(f"/v1/responses/{rid}/input_items", params={"order": "asc"})).json()
        kinds = [i["type"] for i in listed["data"]]
        assert kinds == ["compaction", "message", "message"]  # what was sent, truncation or not
        assert listed["data"][0]["encrypted_content"] == sealed
        stored = _redis_values(redis_url(), p)
        assert stored, "nothing was stored"
        assert b"OLDER zzzz" in stored  # the dropped item is still part of the stored input
        assert SUMMARY.encode() not in stored and b"PLAINTEXT-OF-THE-SUMMARY" not in stored
    finally:
        delete_prefix(redis_url(), p)
