"""``generate: false`` (a warm-up) over HTTP: the input is kept as a turn (stored when ``store`` is
true), the response completes with empty output and zero usage, the upstream hears nothing, and a
later turn continuing from its id gets the warmed-up input in its context. Through the openai SDK
too (``extra_body``: the HTTP create params have no ``generate``), against an Anthropic upstream."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson

from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.anthropic import Reply as AnthropicReply
from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.harness import ServedApp, serve_gateway
from tests.helpers import chat_upstream, sse_events

ZERO_USAGE = {
    "input_tokens": 0,
    "output_tokens": 0,
    "total_tokens": 0,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens_details": {"reasoning_tokens": 0},
}


def settings(fake: FakeOpenAIChat, **extra: Any) -> dict[str, Any]:
    cfg = chat_upstream(fake, {"m": {"provider": "up"}}, api_key="sk-up", retry={"attempts": 0})
    cfg.update(extra)
    return cfg


async def post(gw: ServedApp, body: dict[str, Any], path: str = "/v1/responses", **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=30) as c:
        return await c.post(path, json=body, **kw)


async def test_warm_up_json_then_continue_with_its_id() -> None:
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("Your word is heliotrope."))
        with serve_gateway(settings(fake)) as gw:
            r = await post(
                gw,
                {
                    "model": "m",
                    "instructions": "Be terse.",
                    "input": [{"role": "user", "content": "Remember the word heliotrope."}],
                    "generate": False,
                },
            )
            assert r.status_code == 200, r.text
            warm = r.json()
            assert warm["status"] == "completed" and warm["output"] == []
            assert warm["usage"] == ZERO_USAGE and warm["store"] is True
            assert isinstance(warm["completed_at"], int)
            assert fake.requests == []  # no upstream call

            stored = await httpx.AsyncClient(base_url=gw.base_url).get(f"/v1/responses/{warm['id']}")
            assert stored.status_code == 200 and stored.json()["output"] == []
            r = await post(gw, {"model": "m", "input": "Which word?", "previous_response_id": warm["id"]})
            assert r.status_code == 200, r.text
            assert r.json()["output"][0]["content"][0]["text"] == "Your word is heliotrope."
            assert len(fake.requests) == 1
            messages = fake.requests[0].body["messages"]
            # (instructions are not inherited through previous_response_id)
            assert [(m["role"], m["content"]) for m in messages] == [
                ("user", "Remember the word heliotrope."),
                ("user", "Which word?"),
            ]


async def test_warm_up_sse_is_created_in_progress_completed() -> None:
    async with FakeOpenAIChat.serve() as fake:
        with serve_gateway(settings(fake)) as gw:
            r = await post(gw, {"model": "m", "input": "hi", "generate": False, "stream": True})
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r.text)
            assert [e["type"] for e in events] == [
                "response.created",
                "response.in_progress",
                "response.completed",
            ]
            assert [e["sequence_number"] for e in events] == [0, 1, 2]
            done = events[-1]["response"]
            assert done["output"] == [] and done["usage"] == ZERO_USAGE
            assert fake.requests == []


async def test_warm_up_store_false_is_not_kept_over_http() -> None:
    async with FakeOpenAIChat.serve() as fake:
        with serve_gateway(settings(fake)) as gw:
            r = await post(gw, {"model": "m", "input": "hi", "generate": False, "store": False})
            assert r.status_code == 200 and r.json()["store"] is False
            r = await post(gw, {"model": "m", "input": "x", "previous_response_id": r.json()["id"]})
            assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found"
            assert fake.requests == []


async def test_warm_up_is_validated_like_any_turn() -> None:
    async with FakeOpenAIChat.serve() as fake:
        with serve_gateway(settings(fake)) as gw:
            r = await post(gw, {"model": "m", "input": "hi", "generate": "no"})
            assert r.status_code == 400 and r.json()["error"]["param"] == "generate"
            r = await post(
                gw, {"model": "m", "input": "hi", "generate": False, "previous_response_id": "resp_x"}
            )
            assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found"
            orphan = [{"type": "function_call_output", "call_id": "c1", "output": "x"}]
            r = await post(gw, {"model": "m", "input": orphan, "generate": False})
            assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].call_id"
            assert fake.requests == []


async def test_warm_up_is_metered_as_a_request_without_tokens_and_spends_no_token_limit() -> None:
    async with FakeOpenAIChat.serve() as fake:
        # a token budget smaller than any real request's reservation: only warm-ups get through
        tenants = {
            "default": {"limits": {"requests_per_minute": 3}, "budget": {"tokens": 10, "period": "day"}}
        }
        with serve_gateway(settings(fake, tenants=tenants)) as gw:
            for _ in range(3):
                r = await post(gw, {"model": "m", "input": "hi", "generate": False})
                assert r.status_code == 200, r.text
                assert r.headers["x-ratelimit-limit-requests"] == "3"
                assert r.headers["x-ratelimit-limit-tokens"] == "2147483647"  # no limit applies to it
            r = await post(gw, {"model": "m", "input": "hi", "generate": False})
            assert r.status_code == 429  # the request rate counts warm-ups
            async with httpx.AsyncClient(base_url=gw.base_url) as c:
                report = (await c.get("/v1/usage")).json()
            assert report["totals"]["requests"] == 3 and report["totals"]["total_tokens"] == 0
            assert fake.requests == []


async def test_openai_sdk_warm_up_against_anthropic() -> None:
    async with FakeAnthropic.serve() as fake:
        fake.add(AnthropicReply.text("You asked about the ferry."))
        cfg = {
            "providers": {"ant": {"kind": "anthropic", "base_url": fake.base_url, "api_key": "sk-ant"}},
            "models": {"claude": {"provider": "ant", "upstream_model": "claude-x"}},
        }
        with serve_gateway(cfg) as gw:
            client = openai.AsyncOpenAI(base_url=gw.base_url + "/v1", api_key="sk-none", max_retries=0)
            warm = await client.responses.create(
                model="claude", input="Context: the ferry leaves at 9.", extra_body={"generate": False}
            )
            assert warm.status == "completed" and warm.output == [] and warm.output_text == ""
            assert warm.usage is not None and warm.usage.total_tokens == 0
            assert fake.requests == []
            answer = await client.responses.create(
                model="claude", input="When does it leave?", previous_response_id=warm.id
            )
            assert answer.output_text == "You asked about the ferry."
            assert len(fake.requests) == 1
            texts = orjson.dumps(fake.requests[0].body["messages"]).decode()
            assert "the ferry leaves at 9." in texts and "When does it leave?" in texts
