"""Compaction and the tenancy limits: a compacting request is admitted before its summarizing
call (a refused one spends no summary), and ``/v1/responses/compact`` counts as a request even
when there is nothing to summarize. Against a fake upstream that records every call."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.compact.helpers import conversation, upstream_settings, user
from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.harness import serve_gateway

KEY = {"Authorization": "Bearer sk-a"}
CM = [{"type": "compaction", "compact_threshold": 100}]  # conversation(6) + a question: ~135 tokens


def limited(fake: FakeOpenAIChat, **limits: Any) -> dict[str, Any]:
    return upstream_settings(
        fake, auth={"api_keys": [{"key": "sk-a", "tenant": "a"}]}, tenants={"a": {"limits": limits}}
    )


async def post(base_url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as c:
        return await c.post(path, json=body, headers=KEY)


async def test_a_compacting_request_is_admitted_before_its_summary() -> None:
    """One request a minute: the compacting request is that request (its summarizing call is
    not another one), and the next is refused before any summary is made for it."""
    body = {"model": "m", "input": [*conversation(6), user("what now?")], "context_management": CM}
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("SUMMARY: cobalt"), Reply.text("Carry on."))
        with serve_gateway(limited(fake, requests_per_minute=1)) as gw:
            first = await post(gw.base_url, "/v1/responses", body)
            assert first.status_code == 200, first.text
            assert first.json()["output"][0]["type"] == "compaction"
            assert first.headers["x-ratelimit-remaining-requests"] == "0"
            assert len(fake.requests) == 2  # the summary, then the answer
            refused = await post(gw.base_url, "/v1/responses", {**body, "stream": True})
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"
            assert len(fake.requests) == 2  # no summary was spent on it


async def test_a_compacting_request_refused_by_concurrency_spends_no_summary() -> None:
    """The lease is taken before the summary too: while one compacting request is held up in its
    summarizing call, a second one is refused without any upstream call of its own."""
    body = {"model": "m", "input": [*conversation(6), user("what now?")], "context_management": CM}
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("SUMMARY: cobalt", delay=1.0), Reply.text("Carry on."))
        with serve_gateway(limited(fake, concurrent_requests=1)) as gw:
            held = asyncio.ensure_future(post(gw.base_url, "/v1/responses", body))
            for _ in range(500):
                if fake.requests:
                    break
                await asyncio.sleep(0.01)
            refused = await post(gw.base_url, "/v1/responses", body)
            assert refused.status_code == 429, refused.text
            assert "concurrent requests" in refused.json()["error"]["message"]
            assert (await held).status_code == 200
            assert len(fake.requests) == 2


async def test_a_compaction_with_nothing_to_summarize_still_counts() -> None:
    async with FakeOpenAIChat.serve() as fake:
        with serve_gateway(limited(fake, requests_per_minute=1)) as gw:
            first = await post(gw.base_url, "/v1/responses/compact", {"model": "m", "input": "hi"})
            assert first.status_code == 200, first.text
            assert first.json()["usage"]["total_tokens"] == 0
            assert first.headers["x-ratelimit-remaining-requests"] == "0"
            refused = await post(gw.base_url, "/v1/responses/compact", {"model": "m", "input": "hi"})
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"
            assert "retry-after" in refused.headers
            assert len(fake.requests) == 0
