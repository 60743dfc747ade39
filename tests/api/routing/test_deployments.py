"""A model served by several replicas: the real gateway in front of three fake Chat Completions
upstreams on loopback (each answers with its own name, so the output says who served it).

Each strategy's distribution, affinity (a prompt_cache_key, a previous_response_id chain, a
WebSocket connection), passive health (ejection, the retry on another replica before the first
byte, the return after the cooldown, only the ejected replica's keys moving), the log lines, and
the config validation of ``deployments``."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from structlog.testing import capture_logs

from gateway.engine.routing import Router
from tests.api.helpers import cli_env, run_cli
from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.fakes.server import unused_port
from tests.harness import ServedApp
from tests.ws.helpers import run_turn, serve, ws_connect

NAMES = ("a", "b", "c")
NO_RETRY = {"attempts": 0}


def deployments(*names: str, **weights: float) -> list[dict[str, Any]]:
    return [{"provider": n, "upstream_model": "qwen", "weight": weights.get(n, 1)} for n in names]


def settings(fakes: dict[str, FakeOpenAIChat]) -> dict[str, Any]:
    providers: dict[str, Any] = {
        n: {"kind": "openai-chat", "base_url": f.base_url, "api_key": f"sk-{n}", "retry": NO_RETRY}
        for n, f in fakes.items()
    }
    providers["dead"] = {
        "kind": "openai-chat",
        "base_url": f"http://127.0.0.1:{unused_port()}/v1",
        "retry": NO_RETRY,
        "timeouts": {"connect": 2},
    }
    return {
        "auto_providers": False,
        "providers": providers,
        "models": {
            "weighted": {
                "deployments": deployments("a", "b", a=2),
                "routing": {"strategy": "weighted", "affinity": "none"},
            },
            "busy": {"deployments": deployments(*NAMES), "routing": {"affinity": "none"}},
            "fast": {
                "deployments": deployments("a", "b"),
                "routing": {"strategy": "latency", "affinity": "none"},
            },
            "sticky": {"deployments": deployments(*NAMES)},
            "healing": {
                "deployments": deployments(*NAMES),
                "routing": {"eject_after": 2, "cooldown_seconds": 1.5},
            },
            "moving": {
                "deployments": deployments(*NAMES),
                "routing": {"eject_after": 2, "cooldown_seconds": 600},
            },
            "half_dead": {
                "deployments": [{"provider": "dead"}, {"provider": "a"}],
                "upstream_model": "qwen",
                "routing": {"strategy": "weighted", "eject_after": 2, "cooldown_seconds": 600},
            },
        },
    }


@pytest.fixture(scope="module")
async def fakes() -> AsyncIterator[dict[str, FakeOpenAIChat]]:
    async with FakeOpenAIChat.serve() as a, FakeOpenAIChat.serve() as b, FakeOpenAIChat.serve() as c:
        yield {"a": a, "b": b, "c": c}


@pytest.fixture(scope="module")
def served(fakes: dict[str, FakeOpenAIChat]) -> Iterator[ServedApp]:
    with serve(settings(fakes)) as s:
        yield s


@pytest.fixture(autouse=True)
def answering(fakes: dict[str, FakeOpenAIChat]) -> None:
    for name, fake in fakes.items():
        fake.reset()
        fake.responder = lambda body, name=name: Reply.text(f"from-{name}", pieces=1)


def router(served: ServedApp) -> Router:
    r: Router = served.app.state.gateway.router
    return r


def served_by(response: dict[str, Any]) -> str:
    text: str = response["output"][0]["content"][0]["text"]
    assert text.startswith("from-"), response
    return text[5:]


async def ask(c: httpx.AsyncClient, model: str, **body: Any) -> dict[str, Any]:
    r = await c.post("/v1/responses", json={"model": model, "input": "hi", **body})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def client(served: ServedApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=served.base_url, timeout=30)


# -- strategies ----------------------------------------------------------------------------------
async def test_weighted_sends_traffic_in_the_ratio_of_the_weights(served: ServedApp) -> None:
    async with client(served) as c:
        counts: Counter[str] = Counter()
        for _ in range(20):
            batch = await asyncio.gather(*(ask(c, "weighted", store=False) for _ in range(20)))
            counts.update(served_by(r) for r in batch)
    assert set(counts) == {"a", "b"}
    assert 0.58 < counts["a"] / 400 < 0.76, counts  # 2:1


async def test_least_busy_spreads_concurrent_requests(
    served: ServedApp, fakes: dict[str, FakeOpenAIChat]
) -> None:
    for name, fake in fakes.items():
        fake.default = Reply.text(f"from-{name}", pieces=1, delay=1.5)
    async with client(served) as c:
        batch = await asyncio.gather(*(ask(c, "busy", store=False) for _ in range(12)))
    assert Counter(served_by(r) for r in batch) == {"a": 4, "b": 4, "c": 4}
    assert [d["in_flight"] for d in router(served).balancers()["busy"].snapshot()] == [0, 0, 0]


async def test_latency_prefers_the_faster_upstream(
    served: ServedApp, fakes: dict[str, FakeOpenAIChat]
) -> None:
    fakes["b"].default = Reply.text("from-b", pieces=1, delay=0.25)
    async with client(served) as c:
        counts = Counter([served_by(await ask(c, "fast", store=False)) for _ in range(40)])
    assert counts["b"] >= 1  # tried while unexplored
    assert counts["a"] >= 34, counts
    figures = {d["deployment"]: d["ewma_seconds"] for d in router(served).balancers()["fast"].snapshot()}
    assert figures["b"] > figures["a"]


# -- affinity ------------------------------------------------------------------------------------
async def test_one_prompt_cache_key_stays_on_one_upstream(served: ServedApp) -> None:
    async with client(served) as c:
        same = [served_by(await ask(c, "sticky", prompt_cache_key="conv-1", store=False)) for _ in range(30)]
        spread = {
            served_by(await ask(c, "sticky", prompt_cache_key=f"k-{i}", store=False)) for i in range(30)
        }
    assert len(set(same)) == 1
    assert spread == set(NAMES)


async def test_a_previous_response_id_chain_stays_on_its_roots_upstream(served: ServedApp) -> None:
    homes = []
    async with client(served) as c:
        for _ in range(8):
            r = await ask(c, "sticky")
            chain = [served_by(r)]
            for _ in range(4):
                r = await ask(c, "sticky", previous_response_id=r["id"])
                chain.append(served_by(r))
            assert len(set(chain)) == 1, chain
            homes.append(chain[0])
    assert len(set(homes)) > 1  # the roots themselves are balanced (least_busy ties: by weight)


async def test_new_chains_are_spread_by_the_strategy_then_stay(
    served: ServedApp, fakes: dict[str, FakeOpenAIChat]
) -> None:
    for name, fake in fakes.items():
        fake.default = Reply.text(f"from-{name}", pieces=1, delay=1.5)
    async with client(served) as c:
        roots = await asyncio.gather(*(ask(c, "sticky") for _ in range(12)))
        assert Counter(served_by(r) for r in roots) == {"a": 4, "b": 4, "c": 4}  # least_busy
        for fake in fakes.values():
            fake.default = None
        nexts = await asyncio.gather(*(ask(c, "sticky", previous_response_id=r["id"]) for r in roots))
    assert [served_by(r) for r in nexts] == [served_by(r) for r in roots]


async def test_a_websocket_connection_keeps_its_upstream(served: ServedApp) -> None:
    homes = []
    # connections are spread at random: all 12 on one of the 3 deployments has a chance of 3 in 3**12
    for _ in range(12):
        async with ws_connect(served) as ws:
            seen = []
            previous = None
            for i in range(5):
                body: dict[str, Any] = {"model": "sticky", "input": f"turn {i}", "store": i % 2 == 0}
                if i >= 3 and previous is not None:
                    body["previous_response_id"] = previous  # from the connection's cache or the store
                events = await run_turn(ws, **body)
                done = events[-1]
                assert done["type"] == "response.completed", events
                previous = done["response"]["id"]
                seen.append(served_by(done["response"]))
            assert len(set(seen)) == 1, seen
            homes.append(seen[0])
    assert len(set(homes)) > 1


# -- passive health ------------------------------------------------------------------------------
async def test_a_failing_upstream_is_retried_elsewhere_ejected_and_comes_back(
    served: ServedApp, fakes: dict[str, FakeOpenAIChat]
) -> None:
    key = {"prompt_cache_key": "healing-1", "store": False}
    async with client(served) as c:
        home = served_by(await ask(c, "healing", **key))
        fakes[home].add(Reply.error(503), Reply.error(502))
        for _ in range(2):  # the home fails before the first byte: the client never sees it
            other = served_by(await ask(c, "healing", **key))
            assert other != home
        assert len(fakes[home].requests) == 3
        health = {d["deployment"]: d["healthy"] for d in router(served).balancers()["healing"].snapshot()}
        assert health[home] is False
        assert served_by(await ask(c, "healing", **key)) == other  # ejected: not even tried
        assert len(fakes[home].requests) == 3
        await asyncio.sleep(1.6)  # the cooldown
        assert served_by(await ask(c, "healing", **key)) == home  # the trial succeeds: restored
        assert served_by(await ask(c, "healing", **key)) == home
    health = {d["deployment"]: d["healthy"] for d in router(served).balancers()["healing"].snapshot()}
    assert all(health.values())


async def test_client_errors_do_not_eject(served: ServedApp, fakes: dict[str, FakeOpenAIChat]) -> None:
    key = {"prompt_cache_key": "healing-4xx", "store": False}
    async with client(served) as c:
        home = served_by(await ask(c, "healing", **key))
        fakes[home].add(*[Reply.error(400)] * 3)
        for _ in range(3):
            r = await c.post("/v1/responses", json={"model": "healing", "input": "hi", **key})
            assert r.status_code == 400
        assert served_by(await ask(c, "healing", **key)) == home
    assert len(fakes[home].requests) == 5


async def test_an_unreachable_replica_costs_the_client_nothing(
    served: ServedApp, fakes: dict[str, FakeOpenAIChat]
) -> None:
    async with client(served) as c:
        # 20: the weighted pick must try "dead" at least twice (eject_after) to eject it; with 10 it
        # missed about once in a hundred runs
        answers = await asyncio.gather(*(ask(c, "half_dead", store=False) for _ in range(20)))
    assert {served_by(r) for r in answers} == {"a"}
    health = {d["deployment"]: d["healthy"] for d in router(served).balancers()["half_dead"].snapshot()}
    assert health == {"dead": False, "a": True}


async def test_ejecting_an_upstream_moves_only_its_own_keys(
    served: ServedApp, fakes: dict[str, FakeOpenAIChat]
) -> None:
    keys = [f"user-{i}" for i in range(36)]
    async with client(served) as c:
        before = {k: served_by(await ask(c, "moving", prompt_cache_key=k, store=False)) for k in keys}
        assert set(before.values()) == set(NAMES)
        gone = before[keys[0]]
        served_before = len(fakes[gone].requests)
        fakes[gone].default = Reply.error(500)
        after = {k: served_by(await ask(c, "moving", prompt_cache_key=k, store=False)) for k in keys}
    moved = {k for k in keys if before[k] != after[k]}
    assert moved == {k for k in keys if before[k] == gone}
    assert gone not in after.values()
    # the two failures that ejected it (their clients were served elsewhere), then never again
    assert len(fakes[gone].requests) == served_before + 2


# -- what it reports -----------------------------------------------------------------------------
async def test_log_lines_and_the_turn_name_the_deployment(
    served: ServedApp, fakes: dict[str, FakeOpenAIChat]
) -> None:
    async with client(served) as c:
        home = served_by(await ask(c, "healing", prompt_cache_key="logs-1", store=False))
        fakes[home].add(Reply.error(503))
        with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
            r = await c.post(
                "/v1/responses",
                json={"model": "healing", "input": "hi", "prompt_cache_key": "logs-1", "store": False},
                headers={"x-request-id": "req-dep-1"},
            )
            assert r.status_code == 200
            deadline = time.monotonic() + 10
            while not any(ln["event"] == "request" and ln.get("request_id") == "req-dep-1" for ln in logs):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
    mine = [ln for ln in logs if ln.get("request_id") == "req-dep-1"]
    calls = [(ln["status"], ln["deployment"]) for ln in mine if ln["event"] == "upstream_call"]
    other = served_by(r.json())
    assert calls == [(503, home), (200, other)]
    (failed,) = [ln for ln in mine if ln["event"] == "upstream_failed"]
    assert failed["deployment"] == home
    (access,) = [ln for ln in mine if ln["event"] == "request"]
    assert access["deployment"] == other and access["provider"] == other
    for fake in fakes.values():
        assert all(fake.base_url not in str(ln) for ln in logs)


async def test_the_models_list_names_a_deployed_models_first_provider(served: ServedApp) -> None:
    async with client(served) as c:
        data = (await c.get("/v1/models")).json()["data"]
    assert {m["id"]: m["owned_by"] for m in data}["half_dead"] == "dead"


# -- configuration -------------------------------------------------------------------------------
PROVIDERS = (
    "providers:\n"
    "  a: {kind: openai-chat, base_url: 'http://127.0.0.1:9/v1'}\n"
    "  b: {kind: openai-chat, base_url: 'http://127.0.0.1:10/v1'}\n"
)


@pytest.mark.parametrize(
    ("models", "field", "says"),
    [
        ("q: {deployments: [{provider: a}, {provider: ghost}]}", "models.q.deployments.1.provider", "ghost"),
        ("q: {deployments: [{provider: a, weight: 0}]}", "models.q.deployments.0.weight", "greater than 0"),
        ("q: {deployments: [{provider: a, weight: -1}]}", "models.q.deployments.0.weight", "greater than 0"),
        ("q: {deployments: []}", "models.q.deployments", "at least one"),
        ("q: {provider: a, deployments: [{provider: b}]}", "models.q.deployments", "not both"),
        ("q: {upstream_model: x}", "models.q.provider", "give a provider"),
        (
            "q: {deployments: [{provider: a}, {provider: b, name: a}]}",
            "models.q.deployments.1.name",
            "the same name",
        ),
        ("q: {provider: a, routing: {strategy: fastest}}", "models.q.routing.strategy", "least_busy"),
        ("q: {provider: a, routing: {cooldown_seconds: 0}}", "models.q.routing.cooldown_seconds", ""),
        ("q: {provider: a, routing: {eject_after: 0}}", "models.q.routing.eject_after", ""),
    ],
)
def test_check_config_names_the_bad_deployment_field(
    tmp_path: Path, models: str, field: str, says: str
) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(PROVIDERS + "models:\n  " + models + "\n")
    out = run_cli("check-config", "--config", str(cfg), env=cli_env())
    assert out.returncode != 0
    line = next((ln for ln in out.stderr.splitlines() if ln.strip().startswith(field + ":")), None)
    assert line is not None and says in line, out.stderr
    assert "Traceback" not in out.stderr


def test_check_config_accepts_deployments(tmp_path: Path) -> None:
    cfg = tmp_path / "ok.yaml"
    cfg.write_text(
        PROVIDERS + "models:\n"
        "  qwen:\n"
        "    deployments:\n"
        "      - {provider: a, upstream_model: Qwen/Qwen3-8B, weight: 2}\n"
        "      - {provider: b, upstream_model: Qwen/Qwen3-8B, weight: 1}\n"
        "    routing: {strategy: least_busy, affinity: prompt_cache_key, cooldown_seconds: 30}\n"
        "  solo: {provider: a}\n"
    )
    out = run_cli("check-config", "--config", str(cfg), env=cli_env())
    assert out.returncode == 0 and out.stdout.strip() == "configuration ok", out.stderr
