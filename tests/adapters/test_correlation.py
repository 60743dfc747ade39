"""Correlation with the upstream, for every HTTP adapter against its fake (a real server on
loopback): the request id goes out as ``X-Request-Id``, and each call ends with one
``upstream_call`` log line naming the provider's own id for it (OpenAI's ``x-request-id``,
Anthropic's ``request-id`` header, Gemini's ``responseId``) — only when that id is id-shaped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import pytest
from structlog.testing import capture_logs

from adapters.base import UpstreamRequest
from adapters.registry import create_adapter
from gateway.kernel.errors import UpstreamError
from gateway.kernel.settings import ProviderSettings
from tests.adapters.helpers import SECRET, user
from tests.fakes import anthropic, gemini, openai_chat, openai_responses


@dataclass(frozen=True)
class Case:
    kind: str
    fake: Any
    reply: Any
    id_header: str | None  # the header the provider names its id in (None: the body's responseId)

    def __str__(self) -> str:
        return self.kind


CASES = [
    Case("openai-chat", openai_chat.FakeOpenAIChat, openai_chat.Reply, "x-request-id"),
    Case("openai-responses", openai_responses.FakeOpenAIResponses, openai_responses.Reply, "x-request-id"),
    Case("anthropic", anthropic.FakeAnthropic, anthropic.Reply, "request-id"),
    Case("gemini", gemini.FakeGemini, gemini.Reply, None),
]
UPSTREAM_ID = "req_011CUpstream.id:42-x"


@pytest.fixture(params=CASES, ids=str, scope="module")
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Case, Any]]:
    case: Case = request.param
    async with case.fake.serve() as fake:
        yield case, fake


@pytest.fixture
def case_fake(served: tuple[Case, Any]) -> tuple[Case, Any]:
    served[1].reset()
    return served


async def run(
    case: Case, fake: Any, request_id: str | None, *, stream: bool = True
) -> list[MutableMapping[str, Any]]:
    """One generation; the ``upstream_call`` lines it logged."""
    settings = ProviderSettings(kind=case.kind, base_url=fake.base_url, api_key=SECRET)
    adapter = create_adapter(settings)
    request = UpstreamRequest(model="fake-model", items=[user("hi")], stream=stream, request_id=request_id)
    try:
        with capture_logs() as logs:
            async with asyncio.timeout(10):
                try:
                    async for _ in adapter.stream(request):
                        pass
                except UpstreamError:
                    pass
    finally:
        await adapter.aclose()
    return [line for line in logs if line["event"] == "upstream_call"]


def headers_for(case: Case, value: str) -> dict[str, str]:
    return {case.id_header: value} if case.id_header else {}


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_request_id_goes_upstream_and_the_upstream_id_is_logged(
    case_fake: tuple[Case, Any], stream: bool
) -> None:
    case, fake = case_fake
    fake.add(case.reply.text("Hi there", headers=headers_for(case, UPSTREAM_ID)))
    (line,) = await run(case, fake, "req-client-7", stream=stream)
    assert fake.requests[0].headers["x-request-id"] == "req-client-7"
    rid = line["upstream_request_id"]
    if case.id_header:
        assert rid == UPSTREAM_ID
    else:  # the fake Gemini's responseId: 16 random hex digits
        assert isinstance(rid, str) and len(rid) == 16 and set(rid) <= set("0123456789abcdef")
    assert line["request_id"] == "req-client-7" and line["kind"] == case.kind
    assert line["status"] == 200 and line["error_code"] is None and line["log_level"] == "info"
    assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0


async def test_a_failed_call_logs_its_status_code_and_upstream_id(case_fake: tuple[Case, Any]) -> None:
    case, fake = case_fake
    fake.add(case.reply.error(429, headers=headers_for(case, UPSTREAM_ID)))
    (line,) = await run(case, fake, "req-client-8")
    assert line["status"] == 429 and line["error_code"] == "rate_limit_exceeded"
    assert line["upstream_request_id"] == (UPSTREAM_ID if case.id_header else None)  # Gemini: no body
    assert line["request_id"] == "req-client-8"


async def test_ids_of_any_other_shape_are_neither_sent_nor_logged(case_fake: tuple[Case, Any]) -> None:
    case, fake = case_fake
    odd = "id with spaces <b>" + "x" * 200
    fake.add(case.reply.text("Hi", headers={"x-request-id": odd[:60], "request-id": "y" * 129}))
    (line,) = await run(case, fake, odd)
    assert "x-request-id" not in fake.requests[0].headers
    if case.id_header:
        assert line["upstream_request_id"] is None
    fake.add(case.reply.text("Hi"))
    (line,) = await run(case, fake, None)
    assert "x-request-id" not in fake.requests[1].headers and line["request_id"] is None
