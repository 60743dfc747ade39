"""Every fake upstream at once and a gateway routing ``via-<kind>`` to each (tests/fakes/all.py),
served once for the package; ``fakes`` are reset before each test."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.fakes.all import KINDS, gateway_config
from tests.fakes.openai_chat import FakeOpenAIChat, smart_reply
from tests.harness import ServedApp, serve_gateway

MODELS = ["via-anthropic", "via-openai-chat", "via-openai-responses", "via-gemini", "mock"]


@pytest.fixture(scope="package")
async def fake_servers() -> AsyncIterator[dict[str, Any]]:
    async with contextlib.AsyncExitStack() as stack:
        fakes = {kind: await stack.enter_async_context(cls.serve()) for kind, cls in KINDS.items()}
        yield fakes


@pytest.fixture
def fakes(fake_servers: dict[str, Any]) -> dict[str, Any]:
    for fake in fake_servers.values():
        fake.reset()
        if isinstance(fake, FakeOpenAIChat):
            fake.responder = smart_reply
    return fake_servers


@pytest.fixture(scope="package")
def all_gateway(fake_servers: dict[str, Any]) -> Iterator[ServedApp]:
    cfg = gateway_config({kind: fake.base_url for kind, fake in fake_servers.items()})
    with serve_gateway(cfg) as served:
        yield served
