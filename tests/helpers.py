"""What tests in more than one package share: two tenants' API keys, gateway settings that route
to a fake Chat Completions upstream, and the fixtures that serve a fake upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest

from tests.fakes.openai_chat import FakeOpenAIChat

TWO_TENANTS = {"api_keys": [{"key": "sk-a", "tenant": "a"}, {"key": "sk-b", "tenant": "b"}]}
A = {"Authorization": "Bearer sk-a"}
B = {"Authorization": "Bearer sk-b"}


def chat_upstream(fake: FakeOpenAIChat, models: dict[str, Any], **provider: Any) -> dict[str, Any]:
    """Gateway settings with one provider ``up`` (kind openai-chat, at ``fake``; ``provider`` adds
    to it: api_key, retry, timeouts) and ``models`` routed to it."""
    return {
        "providers": {"up": {"kind": "openai-chat", "base_url": fake.base_url, **provider}},
        "models": models,
    }


def fake_fixtures(fake_cls: Any, responder: Callable[[Any], Any] | None = None) -> tuple[Any, Any]:
    """The ``fake_server`` (served once per module) and ``fake`` (reset for each test, then given
    ``responder`` when there is one) fixtures.

    Use as ``fake_server, fake = fake_fixtures(FakeX)`` at a test module's top level.
    """

    @pytest.fixture(scope="module")
    async def fake_server() -> AsyncIterator[Any]:
        async with fake_cls.serve() as fake:
            yield fake

    @pytest.fixture
    async def fake(fake_server: Any) -> Any:
        fake_server.reset()
        if responder is not None:
            fake_server.responder = responder
        return fake_server

    return fake_server, fake


def sse_events(text: str) -> list[dict[str, Any]]:
    """The JSON events of an SSE body that ends with ``data: [DONE]``."""
    lines = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [orjson.loads(line) for line in lines[:-1]]
