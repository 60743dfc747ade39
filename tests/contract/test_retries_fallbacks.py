"""Retries, fallbacks and routing conveniences, through the real gateway in front of upstreams
that fail on purpose (each provider's fake), and a provider nobody listens on."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from adapters.anthropic import AnthropicAdapter
from adapters.gemini import GeminiAdapter
from adapters.openai_responses import OpenAIResponsesAdapter
from gateway.engine.routing import Router
from gateway.kernel.errors import ModelNotFound
from gateway.kernel.settings import Settings
from tests.fakes import anthropic, gemini, openai_chat, openai_responses
from tests.fakes.scripted import FakeUpstream
from tests.fakes.server import unused_port
from tests.harness import ServedApp, serve_gateway

FAKES: dict[str, type[FakeUpstream[Any]]] = {
    "openai-chat": openai_chat.FakeOpenAIChat,
    "openai-responses": openai_responses.FakeOpenAIResponses,
    "anthropic": anthropic.FakeAnthropic,
    "gemini": gemini.FakeGemini,
}
REPLIES = {
    "openai-chat": openai_chat.Reply,
    "openai-responses": openai_responses.Reply,
    "anthropic": anthropic.Reply,
    "gemini": gemini.Reply,
}
CAP = 0.5  # retry_after_cap, seconds


@dataclass
class Env:
    kind: str
    fake: Any
    gateway: ServedApp

    @property
    def Reply(self) -> Any:
        return REPLIES[self.kind]


def settings(kind: str, base_url: str) -> dict[str, Any]:
    retry = {"attempts": 2, "backoff_base": 0.01, "backoff_max": 0.02, "retry_after_cap": CAP}
    dead = f"http://127.0.0.1:{unused_port()}"
    return {
        "auto_providers": False,
        "providers": {
            "up": {"kind": kind, "base_url": base_url, "api_key": "sk-up", "retry": retry},
            "dead": {
                "kind": kind,
                "base_url": dead,
                "api_key": "sk-dead",
                "retry": retry,
                "pass_through": False,
            },
        },
        "models": {
            "m": {"provider": "up", "upstream_model": "up-model"},
            "primary": {"provider": "dead", "upstream_model": "dead-model", "fallbacks": ["backup"]},
            "flaky": {"provider": "up", "upstream_model": "flaky-model", "fallbacks": ["backup"]},
            "backup": {"provider": "up", "upstream_model": "backup-model"},
            "lonely": {"provider": "dead", "upstream_model": "dead-model"},
        },
    }


@pytest.fixture(scope="module", params=sorted(FAKES))
async def env_server(request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    kind: str = request.param
    async with FAKES[kind].serve() as fake:
        with serve_gateway(settings(kind, fake.base_url)) as gw:
            yield Env(kind, fake, gw)


@pytest.fixture
async def env(env_server: Env) -> Env:
    env_server.fake.reset()
    return env_server


async def create(env: Env, model: str = "m", **body: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=env.gateway.base_url, timeout=30) as client:
        return await client.post("/v1/responses", json={"model": model, "input": "hi", **body})


def text_of(resource: dict[str, Any]) -> str:
    return "".join(
        p.get("text", "") for i in resource["output"] if i["type"] == "message" for p in i["content"]
    )


def upstream_model(env: Env, n: int = -1) -> str:
    rec = env.fake.requests[n]
    if env.kind == "gemini":
        return rec.path.split("/models/")[1].split(":")[0]
    return rec.body["model"]


# == retries =======================================================================================
async def test_503_then_success_is_retried(env: Env) -> None:
    env.fake.add(env.Reply.error(503), env.Reply.text("Recovered."))
    r = await create(env)
    assert r.status_code == 200 and text_of(r.json()) == "Recovered."
    assert len(env.fake.requests) == 2


async def test_retry_after_is_honoured(env: Env) -> None:
    env.fake.add(env.Reply.error(429, headers={"retry-after": "0.3"}), env.Reply.text("ok"))
    start = time.monotonic()
    r = await create(env)
    assert r.status_code == 200 and time.monotonic() - start >= 0.3
    assert len(env.fake.requests) == 2


async def test_retry_after_is_capped(env: Env) -> None:
    env.fake.add(env.Reply.error(503, headers={"retry-after": "30"}), env.Reply.text("ok"))
    start = time.monotonic()
    r = await create(env)
    elapsed = time.monotonic() - start
    assert r.status_code == 200 and CAP <= elapsed < 10


async def test_429_exhausted_is_a_429_for_the_client(env: Env) -> None:
    env.fake.add(*(env.Reply.error(429, headers={"retry-after": "0"}) for _ in range(3)))
    r = await create(env)
    assert r.status_code == 429
    assert (
        r.json()["error"]["code"] == "rate_limit_exceeded"
        and r.json()["error"]["type"] == "too_many_requests"
    )
    assert len(env.fake.requests) == 3


async def test_no_retry_once_output_was_emitted(env: Env) -> None:
    preamble = {"openai-chat": 1, "openai-responses": 4, "anthropic": 2, "gemini": 0}[env.kind]
    env.fake.add(env.Reply.text("Partial answer that breaks.", pieces=6, disconnect_after=preamble + 2))
    r = await create(env, "flaky", stream=True)
    assert b"response.output_text.delta" in r.content and b"event: response.failed" in r.content
    assert len(env.fake.requests) == 1  # neither a retry nor the fallback


# == fallbacks ====================================================================================
async def test_fallback_on_connect_refused(env: Env) -> None:
    env.fake.add(env.Reply.text("From the backup."))
    r = await create(env, "primary")
    assert r.status_code == 200, r.text
    body = r.json()
    assert text_of(body) == "From the backup." and body["model"] == "primary"
    assert len(env.fake.requests) == 1 and upstream_model(env) == "backup-model"


async def test_fallback_after_retries_are_exhausted(env: Env) -> None:
    env.fake.add(*(env.Reply.error(503) for _ in range(3)), env.Reply.text("Backup answer."))
    r = await create(env, "flaky")
    assert r.status_code == 200 and text_of(r.json()) == "Backup answer."
    assert [upstream_model(env, n) for n in range(4)] == ["flaky-model"] * 3 + ["backup-model"]


async def test_no_fallback_for_a_request_the_upstream_rejects(env: Env) -> None:
    env.fake.add(env.Reply.error(400))
    r = await create(env, "flaky")
    assert r.status_code == 400 and len(env.fake.requests) == 1


async def test_connect_refused_without_fallback_is_a_502(env: Env) -> None:
    r = await create(env, "lonely")
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_connect_error"
    assert "127.0.0.1" not in r.text and "sk-dead" not in r.text
    r = await create(env, "dead/anything")  # that provider does not allow pass-through
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_found"


# == routing conveniences ==========================================================================
async def test_provider_slash_model_passes_through(env: Env) -> None:
    env.fake.add(env.Reply.text("Direct."))
    r = await create(env, "up/native-model-7")
    assert r.status_code == 200 and text_of(r.json()) == "Direct."
    assert r.json()["model"] == "up/native-model-7" and upstream_model(env) == "native-model-7"


async def test_models_endpoint_lists_configured_models(env: Env) -> None:
    async with httpx.AsyncClient(base_url=env.gateway.base_url, timeout=30) as client:
        r = await client.get("/v1/models")
    ids = [m["id"] for m in r.json()["data"]]
    assert {"m", "primary", "flaky", "backup"} <= set(ids)


async def test_providers_auto_registered_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    monkeypatch.setenv("GEMINI_API_KEY", "g-env")
    table = Settings().provider_table()
    assert set(table) == {"mock", "anthropic", "gemini"}
    assert table["anthropic"].resolved_api_key() == "sk-ant-env"
    assert table["anthropic"].resolved_base_url() == "https://api.anthropic.com"
    assert table["gemini"].resolved_base_url() == "https://generativelanguage.googleapis.com/v1beta"
    router = Router(Settings())
    route = router.route("anthropic/claude-sonnet-4-5")
    assert isinstance(route.adapter, AnthropicAdapter) and route.upstream_model == "claude-sonnet-4-5"
    assert isinstance(router.route("gemini/gemini-2.5-flash").adapter, GeminiAdapter)
    with pytest.raises(ModelNotFound):
        router.route("openai/gpt-4o")
    await router.aclose()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    router = Router(Settings())
    assert isinstance(router.route("openai/gpt-4o").adapter, OpenAIResponsesAdapter)
    await router.aclose()
    # a config that names providers turns auto-registration off
    configured = Settings(providers={"local": {"kind": "gemini", "base_url": "http://127.0.0.1:1"}})
    assert set(configured.provider_table()) == {"mock", "local"}
