"""Live reload on the real ``serve`` process: ``POST /admin/reload`` and SIGHUP apply a new config
without dropping a connection or interrupting a turn; an invalid config is refused and the old one
stays; with ``--workers 2`` the reload reaches every worker."""

from __future__ import annotations

import asyncio
import copy
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from tests.api.helpers import cli_env, run_cli
from tests.api.procs import (
    ADMIN,
    SLOW_TEXT,
    bearer,
    completed_text,
    create,
    events,
    post_json,
    post_sse,
    read_turn,
    reload,
    request_pids,
    running,
    slow_reply,
    sse_completed,
    ws,
    ws_turn,
)
from tests.fakes.openai_chat import FakeOpenAIChat
from tests.helpers import fake_fixtures

fake_server, fake = fake_fixtures(FakeOpenAIChat)


def config(fake: FakeOpenAIChat | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "auth": {"api_keys": [{"key": "sk-a", "tenant": "a"}, {"key": "sk-b", "tenant": "b"}]},
        "admin": {"api_keys": [{"key": "sk-admin", "name": "ops"}]},
        "models": {"mock": {"provider": "mock"}, "extra": {"provider": "mock"}},
    }
    if fake is not None:
        cfg["providers"] = {"up": {"kind": "openai-chat", "base_url": fake.base_url, "api_key": "sk-up"}}
        cfg["models"]["slow"] = {"provider": "up", "upstream_model": "x"}
    return cfg


def next_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with a key added (sk-new), a key removed (sk-b) and a model removed (extra)."""
    new = copy.deepcopy(cfg)
    new["auth"]["api_keys"] = [{"key": "sk-a", "tenant": "a"}, {"key": "sk-new", "tenant": "c"}]
    del new["models"]["extra"]
    return new


async def until_streaming(fake: FakeOpenAIChat, count: int = 1) -> None:
    for _ in range(600):
        if len(fake.requests) >= count:
            await asyncio.sleep(0.3)  # a few events have gone out
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the upstream call never started")


async def test_reload_over_open_websockets_adds_a_key_and_removes_a_model(
    tmp_path: Path, fake: FakeOpenAIChat
) -> None:
    fake.default = slow_reply()
    cfg = config(fake)
    async with running(tmp_path, cfg) as gw:
        async with ws(gw, "sk-a") as sock_a, ws(gw, "sk-b") as sock_b:
            assert completed_text(await ws_turn(sock_a, "extra"))  # the model exists for now
            await sock_a.send(create("slow", "in flight"))
            await until_streaming(fake)
            gw.write(next_config(cfg))
            r = await reload(gw)
            assert r.status_code == 200, r.text
            assert r.json() == {
                "object": "gateway.reload",
                "accepted": True,
                "changed": ["auth", "models"],
                "restart_required": [],
            }
            # the turn in flight during the reload completes normally, on the old configuration
            assert completed_text(await read_turn(sock_a)) == SLOW_TEXT
            # the open socket's next turn runs on the new one
            events_ = await ws_turn(sock_a, "extra")
            assert events_ == [
                {
                    "type": "error",
                    "status": 400,
                    "error": {
                        "type": "invalid_request_error",
                        "code": "model_not_found",
                        "message": "The requested model 'extra' does not exist.",
                        "param": "model",
                    },
                }
            ]
            assert completed_text(await ws_turn(sock_a, "mock", "still here")).endswith("still here")
            # the removed key's socket: an authentication error on its next turn
            (refused,) = await ws_turn(sock_b, "mock")
            assert refused["type"] == "error" and refused["status"] == 401
            assert refused["error"]["code"] == "invalid_api_key"
        async with ws(gw, "sk-new") as sock_new:
            assert completed_text(await ws_turn(sock_new, "mock", "new key")).endswith("new key")
        with pytest.raises(InvalidStatus) as info:
            async with ws(gw, "sk-b"):
                pass
        assert info.value.response.status_code == 401
        async with httpx.AsyncClient(base_url=gw.url) as client:
            models = (await client.get("/v1/models", headers=bearer("sk-a"))).json()
        assert sorted(m["id"] for m in models["data"]) == ["mock", "slow"]
        # the replaced gateway was closed once its last turn had ended, not before
        logs = gw.logs()
        retired = next(i for i, e in enumerate(logs) if e.get("event") == "gateway_retired")
        in_flight = next(
            i for i, e in enumerate(logs) if e.get("event") == "request" and e.get("model") == "slow"
        )
        assert in_flight < retired


async def test_an_sse_stream_in_flight_during_a_sighup_reload_completes(
    tmp_path: Path, fake: FakeOpenAIChat
) -> None:
    fake.default = slow_reply()
    cfg = config(fake)
    async with running(tmp_path, cfg) as gw:
        stream = asyncio.create_task(post_sse(gw, "sk-b", "slow"))
        await until_streaming(fake)
        gw.write(next_config(cfg))
        gw.proc.send_signal(signal.SIGHUP)
        await gw.wait_log(lambda logs: bool(events(logs, "config_reloaded")))
        (done,) = gw.events("config_reloaded")
        assert done["source"] == "sighup" and done["changed"] == ["auth", "models"]
        assert (await post_json(gw, "sk-new")).status_code == 200
        assert (await post_json(gw, "sk-b")).status_code == 401
        # the stream of a key that the reload removed still ends normally: it began on the old config
        assert sse_completed(await stream) == SLOW_TEXT


async def test_an_invalid_config_is_refused_and_the_old_one_stays(tmp_path: Path) -> None:
    cfg = config()
    async with running(tmp_path, cfg) as gw:
        bad = next_config(cfg)
        bad["auth"]["api_keys"][1]["models"] = ["nope"]  # a model no route serves
        bad["models"]["gone"] = {"provider": "nowhere"}
        gw.write(bad)
        expected = run_cli("check-config", "--config", str(gw.config_path), env=cli_env())
        assert expected.returncode == 2
        r = await reload(gw)
        assert r.status_code == 400
        answer = r.json()
        assert answer["error"]["type"] == "invalid_request_error"
        assert answer["error"]["code"] == "invalid_config"
        assert answer["error"]["message"] == expected.stderr.strip()  # check-config's own words
        assert answer["accepted"] is False
        assert any(p.startswith("auth.api_keys.1.models.0: unknown model 'nope'") for p in answer["problems"])
        assert "models.gone.provider: unknown provider 'nowhere'" in answer["problems"]
        (line,) = gw.events("config_reload_refused")
        assert line["level"] == "error" and line["detail"] == expected.stderr.strip()
        assert "sk-" not in line["detail"]  # names fields, never the keys
        # the old configuration is still in force
        assert (await post_json(gw, "sk-b", "extra")).status_code == 200
        assert (await post_json(gw, "sk-new")).status_code == 401
        # SIGHUP refuses it the same way
        gw.proc.send_signal(signal.SIGHUP)
        await gw.wait_log(lambda logs: len(events(logs, "config_reload_refused")) == 2)
        assert gw.events("config_reload_refused")[1]["source"] == "sighup"
        assert (await post_json(gw, "sk-b", "extra")).status_code == 200
        # fixed, it is taken; a start-only setting is named as needing a restart, and kept
        good = next_config(cfg)
        good["limits"] = {"max_header_bytes": 4096, "max_body_bytes": 2048}
        gw.write(good)
        r = await reload(gw)
        assert r.status_code == 200
        assert r.json()["changed"] == ["auth", "models", "limits"]
        assert r.json()["restart_required"] == ["limits.max_header_bytes"]
        (restart,) = gw.events("config_needs_restart")
        assert restart["fields"] == ["limits.max_header_bytes"]
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            big = {"model": "mock", "input": "x" * 3000, "store": False}
            r = await client.post("/v1/responses", json=big, headers=bearer("sk-new"))
            assert r.status_code == 413  # max_body_bytes changed live
            r = await client.get("/healthz", headers={"x-pad": "p" * 6000})
            assert r.status_code == 200  # the header bound did not


async def test_the_admin_endpoint_needs_an_admin_key(tmp_path: Path) -> None:
    async with running(tmp_path, config()) as gw:
        for headers, status, code in (
            ({}, 401, "invalid_api_key"),
            (bearer("sk-unknown"), 401, "invalid_api_key"),
            (bearer("sk-a"), 403, "permission_denied"),
        ):
            r = await reload(gw, headers)
            assert r.status_code == status, r.text
            assert r.json()["error"]["code"] == code
        assert not gw.events("config_reloaded")
        r = await reload(gw, ADMIN)
        assert r.status_code == 200 and r.json()["changed"] == []
        async with httpx.AsyncClient(base_url=gw.url) as client:
            r = await client.get("/admin/reload", headers=ADMIN)
        assert r.status_code == 405


async def test_a_reload_on_one_worker_reaches_every_worker(tmp_path: Path) -> None:
    cfg = config()
    async with running(tmp_path, cfg, "--workers", "2", workers=2) as gw:
        assert (await post_json(gw, "sk-new")).status_code == 401
        gw.write(next_config(cfg))
        r = await reload(gw)
        assert r.status_code == 200 and r.json()["accepted"] is True
        reloaded = gw.events("config_reloaded")
        assert len(reloaded) >= 1  # the worker that answered had reloaded before it answered
        await gw.wait_log(lambda logs: len({e["pid"] for e in events(logs, "config_reloaded")}) == 2)
        before = len([e for e in gw.logs() if e.get("event") == "request"])
        for i in range(40):  # each on a connection of its own: whichever worker accepts it
            r = await post_json(gw, "sk-new", text=f"n{i}")
            assert r.status_code == 200, (i, r.text)
            assert (await post_json(gw, "sk-b")).status_code == 401
        later = [e for e in gw.logs() if e.get("event") == "request"][before:]
        assert len(request_pids(later)) == 2, "one worker answered everything"
        # refused by every worker alike: the answering one says so
        bad = next_config(cfg)
        bad["models"]["mock"]["provider"] = "nowhere"
        gw.write(bad)
        r = await reload(gw)
        assert r.status_code == 400
        assert r.json()["problems"] == ["models.mock.provider: unknown provider 'nowhere'"]
        for _ in range(10):
            assert (await post_json(gw, "sk-new")).status_code == 200
