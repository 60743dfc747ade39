"""The gateway in front of one fake upstream of each kind, a model routed through each adapter
(chat→{openai-chat, openai-responses, anthropic, gemini, mock}), for the Chat Completions ingress."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.gemini import FakeGemini
from tests.fakes.openai_chat import FakeOpenAIChat, smart_reply
from tests.fakes.openai_responses import FakeOpenAIResponses
from tests.harness import ServedApp, serve_gateway

KINDS: dict[str, Any] = {
    "openai-chat": FakeOpenAIChat,
    "openai-responses": FakeOpenAIResponses,
    "anthropic": FakeAnthropic,
    "gemini": FakeGemini,
}
# the model named after each route; the openai-chat one keeps its name upstream, so that a request
# through the gateway and the same request sent straight to the fake can be compared whole
ROUTES = ["openai-chat", "openai-responses", "anthropic", "gemini", "mock"]


@pytest.fixture(scope="module")
async def servers() -> AsyncIterator[dict[str, Any]]:
    async with contextlib.AsyncExitStack() as stack:
        yield {kind: await stack.enter_async_context(cls.serve()) for kind, cls in KINDS.items()}


@pytest.fixture
def fakes(servers: dict[str, Any]) -> dict[str, Any]:
    for fake in servers.values():
        fake.reset()
    servers["openai-chat"].responder = smart_reply
    return servers


def settings_for(servers: dict[str, Any], **extra: Any) -> dict[str, Any]:
    providers = {
        kind: {"kind": kind, "base_url": servers[kind].base_url, "api_key": "sk-up", "retry": {"attempts": 0}}
        for kind in KINDS
    }
    models: dict[str, Any] = {kind: {"provider": kind, "upstream_model": kind} for kind in KINDS}
    models["mock"] = {"provider": "mock"}
    return {"providers": providers, "models": models, **extra}


@pytest.fixture(scope="module")
def served(servers: dict[str, Any]) -> Iterator[ServedApp]:
    with serve_gateway(settings_for(servers)) as s:
        yield s
