"""The gateway in front of a fake OpenAI-compatible upstream (a real HTTP server on loopback):
what the upstream receives, failures before and after the first event, disconnects, limits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.api.helpers import parse_sse
from tests.fakes.openai_chat import FakeOpenAIChat, Reply, fake_logprobs, smart_reply
from tests.harness import ServedApp, serve_gateway
from tests.helpers import chat_upstream, fake_fixtures

fake_server, fake = fake_fixtures(FakeOpenAIChat, responder=smart_reply)


@pytest.fixture(scope="module")
def served(fake_server: FakeOpenAIChat) -> Iterator[ServedApp]:
    settings = chat_upstream(
        fake_server,
        {"m": {"provider": "up", "upstream_model": "fake-llm"}},
        api_key="sk-upstream-secret",
        timeouts={"connect": 2, "read": 1.0, "total": 30},
        retry={"attempts": 1, "backoff_base": 0.01},
        # one event per upstream chunk, so the event cap and per-delta logprobs count the fake's
        # chunks (the default merges chunks read together: tests/adapters/test_merge.py)
        merge_deltas=False,
    )
    with serve_gateway({**settings, "limits": {"max_events_per_stream": 40}}) as s:
        yield s


async def post(s: ServedApp, body: dict[str, Any], **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=s.base_url, timeout=20) as c:
        return await c.post("/v1/responses", json={"model": "m", **body}, **kw)


def events_of(r: httpx.Response) -> list[dict[str, Any]]:
    return [orjson.loads(d) for _, d in parse_sse(r.content) if d != "[DONE]"]


async def test_upstream_sees_the_chain_in_order(served: ServedApp, fake: FakeOpenAIChat) -> None:
    first = (await post(served, {"input": "first question", "instructions": "sys one"})).json()
    second = (
        await post(
            served,
            {"input": "second question", "previous_response_id": first["id"], "instructions": "sys two"},
        )
    ).json()
    await post(served, {"input": "third question", "previous_response_id": second["id"]})
    msgs = [(m["role"], m["content"]) for m in fake.requests[-1].body["messages"]]
    assert msgs == [
        ("user", "first question"),
        ("assistant", "Hello! You said: first question"),
        ("user", "second question"),
        ("assistant", "Hello! You said: second question"),
        ("user", "third question"),
    ]  # instructions are not inherited
    assert fake.requests[1].body["messages"][0] == {"role": "system", "content": "sys two"}
    assert fake.requests[0].headers["authorization"] == "Bearer sk-upstream-secret"
    assert fake.requests[0].body["model"] == "fake-llm"


async def test_tool_loop_through_the_upstream(served: ServedApp, fake: FakeOpenAIChat) -> None:
    tools = [
        {
            "type": "function",
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        }
    ]
    call = (await post(served, {"input": "find it", "tools": tools})).json()
    fc = call["output"][0]
    assert fc["type"] == "function_call" and fc["name"] == "lookup" and fc["arguments"] == '{"q":"example"}'
    done = (
        await post(
            served,
            {
                "previous_response_id": call["id"],
                "tools": tools,
                "input": [{"type": "function_call_output", "call_id": fc["call_id"], "output": "found"}],
            },
        )
    ).json()
    assert done["output"][0]["content"][0]["text"] == "The tool returned: found"
    sent = fake.requests[-1].body["messages"]
    assert sent[-2]["tool_calls"][0]["id"] == fc["call_id"]
    assert sent[-1] == {"role": "tool", "tool_call_id": fc["call_id"], "content": "found"}


async def test_parallel_calls_and_allowed_tools_enforced(served: ServedApp, fake: FakeOpenAIChat) -> None:
    fake.add(Reply.tool_calls([("a", "{}", "call_a"), ("b", '{"x":1}', "call_b"), ("c", "{}", "call_c")]))
    tools = [{"type": "function", "name": n} for n in ("a", "b", "c")]
    r = await post(
        served,
        {
            "input": "go",
            "tools": tools,
            "stream": True,
            "tool_choice": {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "b"}],
            },
        },
    )
    events = events_of(r)
    calls = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [c["name"] for c in calls] == ["b"]  # a and c never reach the client
    assert [t["function"]["name"] for t in fake.requests[-1].body["tools"]] == ["b"]
    assert events[-1]["response"]["status"] == "completed"


async def test_upstream_errors_before_the_stream_are_plain_http_errors(
    served: ServedApp, fake: FakeOpenAIChat
) -> None:
    secret_body = {"error": {"message": "internal detail at http://10.1.2.3/secret", "type": "x"}}
    fake.add(Reply.error(500, secret_body), Reply.error(500, secret_body))
    r = await post(served, {"input": "x", "stream": True})
    assert r.status_code == 502 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["code"] == "upstream_error"
    for leak in ("10.1.2.3", "secret", fake.base_url, "sk-upstream"):
        assert leak not in r.text
    assert len(fake.requests) == 2  # one retry, then the error
    fake.add(Reply.error(429, headers={"retry-after": "0"}), Reply.error(429, headers={"retry-after": "0"}))
    r = await post(served, {"input": "x"})
    assert r.status_code == 429 and r.json()["error"]["type"] == "too_many_requests"
    fake.add(Reply.error(400, {"error": {"message": "bad", "code": "context_length_exceeded"}}))
    r = await post(served, {"input": "x"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


async def test_a_retry_that_would_overrun_the_deadline_is_not_made(fake_server: FakeOpenAIChat) -> None:
    # A 40 s Retry-After is waited for at most 10 s (retry_after_cap), which would still overrun the
    # request's 5 s deadline (timeouts.total): the 429 and its Retry-After go to the client at once.
    settings = chat_upstream(
        fake_server,
        {"m": {"provider": "up"}},
        timeouts={"total": 5},
        retry={"attempts": 2, "retry_after_cap": 10},
    )
    fake_server.reset()
    with serve_gateway(settings) as gw:
        t0 = time.monotonic()
        for body in ({"input": "x"}, {"input": "x", "stream": True}):
            fake_server.add(Reply.error(429, headers={"retry-after": "40"}))
            r = await post(gw, body)
            assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
            assert r.headers["retry-after"] == "40"
        assert time.monotonic() - t0 < 4
        assert len(fake_server.requests) == 2  # one call each: no retry that could not finish in time


async def test_a_hung_upstream_is_bounded_by_the_total_deadline_across_retries(
    fake_server: FakeOpenAIChat,
) -> None:
    # Each attempt is bounded by what is left of timeouts.total: 3 retries do not multiply it.
    settings = chat_upstream(
        fake_server, {"m": {"provider": "up"}}, timeouts={"total": 1.5}, retry={"attempts": 3}
    )
    fake_server.reset()
    fake_server.add(*(Reply.text("late", delay=20) for _ in range(4)))
    with serve_gateway(settings) as gw:
        for body in ({"input": "x"}, {"input": "x", "stream": True}):
            t0 = time.monotonic()
            r = await post(gw, body)
            assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout", r.text
            assert time.monotonic() - t0 < 4


async def test_failure_after_the_first_event_is_error_then_failed(
    served: ServedApp, fake: FakeOpenAIChat
) -> None:
    reply = Reply.text("one two three four five six", pieces=6)
    reply.disconnect_after = 4
    fake.add(reply)
    r = await post(served, {"input": "x", "stream": True})
    assert r.status_code == 200
    events = events_of(r)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1]["response"]["error"]["code"] == "upstream_error"
    assert r.content.endswith(b"data: [DONE]\n\n")


async def test_read_timeout_mid_stream_fails_with_a_clear_code(
    served: ServedApp, fake: FakeOpenAIChat
) -> None:
    reply = Reply.text("slow answer here", pieces=3, chunk_delay=3.0, split=None)
    reply.chunks = reply.chunks[1:]  # the first write carries text, then the upstream stalls
    fake.add(reply)
    r = await post(served, {"input": "x", "stream": True})
    assert len(fake.requests) == 1  # output was sent: no retry
    events = events_of(r)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "upstream_timeout"


async def test_event_cap(served: ServedApp, fake: FakeOpenAIChat) -> None:
    fake.add(Reply.text("x" * 100, pieces=100))
    r = await post(served, {"input": "x", "stream": True})
    events = events_of(r)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "event_limit_exceeded"
    assert len(events) < 60


async def test_length_becomes_incomplete(served: ServedApp, fake: FakeOpenAIChat) -> None:
    r = await post(served, {"input": "a b c d e f g h i j k l m n o p q r s t u v", "max_output_tokens": 16})
    body = r.json()
    assert fake.requests[-1].body["max_tokens"] == 16
    assert body["status"] == "incomplete" and body["incomplete_details"]["reason"] == "max_output_tokens"


@pytest.mark.parametrize("stream", [True, False])
async def test_client_going_away_cancels_the_upstream(
    served: ServedApp, fake: FakeOpenAIChat, stream: bool
) -> None:
    # Streamed upstream: the answer trickles in; unstreamed (a JSON client): the model "thinks" first.
    reply = Reply.text("a b c d e f g h i j", pieces=10, chunk_delay=0.5, split=None)
    reply.delay = 0.0 if stream else 10.0
    fake.add(reply)
    async with httpx.AsyncClient(base_url=served.base_url, timeout=20) as c:
        if stream:
            async with c.stream(
                "POST", "/v1/responses", json={"model": "m", "input": "x", "stream": True}
            ) as r:
                async for line in r.aiter_lines():
                    if "output_text.delta" in line:
                        break
        else:
            task = asyncio.create_task(c.post("/v1/responses", json={"model": "m", "input": "x"}))
            await asyncio.wait_for(fake.streaming.wait(), timeout=10)  # the upstream call is under way
            await asyncio.sleep(0.1)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    gone_at = time.monotonic()
    await asyncio.wait_for(fake.disconnected.wait(), timeout=1.5)
    assert time.monotonic() - gone_at < 1.5


@pytest.mark.parametrize("stream", [True, False])
async def test_a_json_client_gets_one_unstreamed_upstream_call(
    served: ServedApp, fake: FakeOpenAIChat, stream: bool
) -> None:
    fake.add(Reply.text("one two three", pieces=3, usage=(5, 3)))
    r = await post(served, {"input": "x", "stream": stream})
    assert r.status_code == 200
    final = events_of(r)[-1]["response"] if stream else r.json()
    assert final["status"] == "completed" and final["usage"]["output_tokens"] == 3
    assert final["output"][0]["content"][0]["text"] == "one two three"
    [rec] = fake.requests
    if stream:
        assert rec.body["stream"] is True and rec.body["stream_options"] == {"include_usage": True}
        assert rec.headers["accept"] == "text/event-stream"
    else:
        assert "stream" not in rec.body and "stream_options" not in rec.body
        assert rec.headers["accept"] == "application/json"


@pytest.mark.parametrize("stream", [False, True])
async def test_logprobs_when_the_client_includes_them(
    served: ServedApp, fake: FakeOpenAIChat, stream: bool
) -> None:
    fake.add(Reply.text("one two", pieces=2))
    body = {"input": "x", "stream": stream, "include": ["message.output_text.logprobs"], "top_logprobs": 2}
    r = await post(served, body)
    assert r.status_code == 200, r.text
    [rec] = fake.requests
    assert rec.body["logprobs"] is True and rec.body["top_logprobs"] == 2
    expected = fake_logprobs("one ", 2) + fake_logprobs("two", 2)
    if stream:
        events = events_of(r)
        deltas = [e for e in events if e["type"] == "response.output_text.delta"]
        assert [d["logprobs"] for d in deltas] == [fake_logprobs("one ", 2), fake_logprobs("two", 2)]
        [done] = [e for e in events if e["type"] == "response.output_text.done"]
        assert done["logprobs"] == expected
        final = events[-1]["response"]
    else:
        final = r.json()
    part = final["output"][0]["content"][0]
    assert part["text"] == "one two" and part["logprobs"] == expected
    # not asked for: not requested upstream, not in the output
    fake.reset()
    fake.add(Reply.text("one two", pieces=2))
    plain = await post(served, {"input": "x"})
    assert "logprobs" not in fake.requests[0].body
    assert "logprobs" not in plain.json()["output"][0]["content"][0]
