"""What the store is promised, against a real Redis: a ``store: true`` turn is refused before any
upstream spend while the store is down, and a truncated turn stores what the client sent (its
compaction items still sealed), never the opened or truncated view the upstream saw."""

from __future__ import annotations

import asyncio
import base64
import signal
import time
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
import redis

from compact.seal import Sealer
from tests.compact.helpers import conversation, user
from tests.fakes.openai_chat import FakeOpenAIChat
from tests.harness import ServedApp, serve_gateway
from tests.helpers import chat_upstream, fake_fixtures, sse_events
from tests.observability.traffic import scrape
from tests.redis_server import RedisServer, delete_prefix, redis_url, unique_prefix
from tests.ws.helpers import run_turn, serve, ws_connect

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
    r = redis.Redis.from_url(url)  # no decode_responses: every reply is bytes
    out: list[bytes] = []
    for key in r.scan_iter(match=f"{prefix}*"):
        kind = r.type(key)
        if kind == b"string":
            out.append(cast(bytes | None, r.get(key)) or b"")
        elif kind == b"hash":
            for k, v in cast(dict[bytes, bytes], r.hgetall(key)).items():
                out += [k, v]
        elif kind == b"list":
            out += cast(list[bytes], r.lrange(key, 0, -1))
        elif kind == b"set":
            out += cast(set[bytes], r.smembers(key))
        elif kind == b"zset":
            out += [m for m, _ in cast(list[tuple[bytes, float]], r.zrange(key, 0, -1, withscores=True))]
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


async def _create(gw: ServedApp, transport: str, body: dict[str, Any]) -> tuple[int, str]:
    """A create over ``transport`` (json, sse, websocket): (status, error code or terminal type).
    A refusal is the API's error: the HTTP status, or the WebSocket envelope's ``status``."""
    if transport == "websocket":
        async with ws_connect(gw) as ws:
            events = await run_turn(ws, **body)
        last = events[-1]
        if last["type"] == "error":
            return last["status"], last["error"]["code"]
        return 200, last["type"]
    r = await post(gw.base_url, {**body, "stream": transport == "sse"})
    if r.status_code != 200:
        return r.status_code, r.json()["error"]["code"]
    if transport == "sse":
        return 200, sse_events(r.text)[-1]["type"]
    return 200, "response." + r.json()["status"]


@pytest.mark.parametrize(
    ("transport", "outage", "compacting"),
    [
        ("json", "killed", False),
        ("sse", "killed", False),
        ("websocket", "killed", False),
        ("json", "frozen", False),
        ("sse", "killed", True),
    ],
)
async def test_store_true_spends_no_upstream_call_right_after_the_store_went_down(
    fake: FakeOpenAIChat, prefix: str, transport: str, outage: str, compacting: bool
) -> None:
    """Within the health check's interval (1 s by default) of a successful store, the store goes
    down: the next ``store: true`` request is still refused before its upstream call, and before
    the summarizing call of its inline compaction (``compacting``)."""
    server = RedisServer().start()
    frozen = False
    try:
        cfg = chat_upstream(fake, {"m": {"provider": "up"}}, api_key="sk-up")
        cfg["state"] = {"redis_url": server.url, "key_prefix": prefix}  # the default timings
        with serve(cfg) as gw:
            assert await _create(gw, transport, {"model": "m", "input": "kept"}) == (
                200,
                "response.completed",
            )
            calls = len(fake.requests)
            assert server.proc is not None
            if outage == "frozen":
                server.proc.send_signal(signal.SIGSTOP)  # keeps its sockets, answers nothing
                frozen = True
            else:
                server.stop()
            await asyncio.sleep(0.3)
            body: dict[str, Any] = {"model": "m", "input": "not kept"}
            if compacting:  # over the threshold: a summarizing call would come first
                managed = [*conversation(6), user("not kept")]
                compaction = [{"type": "compaction", "compact_threshold": 100}]
                body = {**body, "input": managed, "context_management": compaction}
            assert await _create(gw, transport, body) == (503, "service_unavailable")
            assert len(fake.requests) == calls  # no upstream tokens for an answer that cannot be kept
            body = {"model": "m", "input": "not kept"}
            zero = await _create(gw, transport, {**body, "store": False})
            assert zero == (200, "response.completed")  # store: false needs no store
            assert len(fake.requests) == calls + 1
    finally:
        if frozen and server.proc is not None:
            server.proc.send_signal(signal.SIGCONT)
        server.stop()


async def _store_errors(c: httpx.AsyncClient) -> dict[str, float]:
    """``gateway_state_store_errors_total`` by op, from /metrics."""
    family = scrape((await c.get("/metrics")).text)["gateway_state_store_errors"]
    return {s.labels["op"]: s.value for s in family.samples if s.name.endswith("_total") and s.value}


async def test_a_failed_store_check_counts_as_a_store_error(fake: FakeOpenAIChat, prefix: str) -> None:
    """Each check a ``store: true`` request's refusal rests on is a failed store call in
    ``gateway_state_store_errors_total``; a refusal made on what the last check showed is not."""
    server = RedisServer().start()
    try:
        cfg = chat_upstream(fake, {"m": {"provider": "up"}}, api_key="sk-up")
        cfg["state"] = {"redis_url": server.url, "key_prefix": prefix}  # the default timings
        with serve_gateway(cfg) as gw:
            async with httpx.AsyncClient(base_url=gw.base_url, timeout=15) as c:
                assert (
                    await c.post("/v1/responses", json={"model": "m", "input": "kept"})
                ).status_code == 200
                assert await _store_errors(c) == {}
                server.stop()
                await asyncio.sleep(1.2)  # past the health interval: nothing cached says "down"
                body = {"model": "m", "input": "not kept"}
                assert (await c.post("/v1/responses", json=body)).status_code == 503
                assert await _store_errors(c) == {"reserve": 1}  # the write-ahead record failed
                assert (await c.post("/v1/responses", json=body)).status_code == 503
                assert await _store_errors(c) == {"reserve": 1}  # known down: refused without a call
                await asyncio.sleep(1.2)
                assert (await c.post("/v1/responses", json=body)).status_code == 503
                assert await _store_errors(c) == {"reserve": 1, "ping": 1}  # the recheck's probe
            assert len(fake.requests) == 1
    finally:
        server.stop()
