"""POST /v1/responses/compact and compacted windows as input, over real sockets.

A fake Chat Completions upstream (tests/fakes/openai_chat.py) records what reaches the provider:
that is how these tests prove a summary arrives readable and a tampered item never arrives.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import redis

from compact.opener import SUMMARY_MESSAGE_HEADER
from compact.seal import key_id
from compact.strategy import SUMMARY_PROMPT
from gateway.kernel.estimate import estimate
from tests.compact.helpers import (
    assistant,
    bulky_tail,
    compaction_of,
    conversation,
    flip_byte,
    key,
    sent_text,
    upstream_settings,
    user,
    with_envelope,
)
from tests.fakes.openai_chat import FakeOpenAIChat, Reply
from tests.harness import ServedApp, serve_gateway
from tests.helpers import TWO_TENANTS, A, B, chat_upstream
from tests.redis_server import delete_prefix, redis_url, stored_bytes, unique_prefix
from tests.schema import assert_schema

ZERO_USAGE = {
    "input_tokens": 0,
    "output_tokens": 0,
    "total_tokens": 0,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens_details": {"reasoning_tokens": 0},
}


async def post(gw: ServedApp, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=30) as c:
        return await c.post(path, json=body, headers=headers)


def error_of(r: httpx.Response) -> dict[str, Any]:
    assert r.headers["content-type"] == "application/json"
    return r.json()["error"]


# -- the endpoint ----------------------------------------------------------------------------------
async def test_short_input_gives_a_valid_window_with_one_compaction_item(gateway: ServedApp) -> None:
    r = await post(
        gateway, "/v1/responses/compact", {"model": "mock", "input": [user("hi"), assistant("hello")]}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert_schema("CompactResource", body)
    assert body["object"] == "response.compaction" and body["id"].startswith("resp_")
    assert isinstance(body["created_at"], int)
    assert body["usage"] == ZERO_USAGE  # nothing was summarized: no model call, no tokens
    cmp = compaction_of(body["output"])
    assert cmp["id"].startswith("cmp_") and cmp["encrypted_content"].startswith("v1.")
    assert "created_by" not in cmp
    kept = [i for i in body["output"] if i["type"] == "message"]
    assert [(m["role"], m["status"], m["content"][0]["type"]) for m in kept] == [
        ("user", "completed", "input_text"),
        ("assistant", "completed", "output_text"),
    ]
    assert kept[1]["content"][0]["annotations"] == []
    assert all(m["id"].startswith("msg_") for m in kept)


async def test_string_input_and_empty_input(gateway: ServedApp) -> None:
    r = await post(gateway, "/v1/responses/compact", {"model": "mock", "input": "just this"})
    assert r.status_code == 200 and r.json()["output"][-1]["content"][0]["text"] == "just this"
    r = await post(gateway, "/v1/responses/compact", {"model": "mock"})
    assert r.status_code == 200 and [i["type"] for i in r.json()["output"]] == ["compaction"]


async def test_long_input_is_summarized_through_the_upstream() -> None:
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("SUMMARY: the user listed cobalt-0 to cobalt-3.", usage=(321, 12)))
        with serve_gateway(upstream_settings(fake, compaction={"keep_recent_items": 2})) as gw:
            r = await post(
                gw,
                "/v1/responses/compact",
                {
                    "model": "m",
                    "input": conversation(5),
                    "instructions": "Answer in French.",
                    "prompt_cache_key": "k",
                },
            )
        assert r.status_code == 200, r.text
        body = r.json()
        assert_schema("CompactResource", body)
        assert [i["type"] for i in body["output"]] == ["message", "compaction", "message", "message"]
        assert body["output"][0]["role"] == "system"  # pinned in front
        assert [m["content"][0]["text"] for m in body["output"][2:]] == [
            "question 4: remember code word cobalt-4",
            "answer 4",
        ]
        assert compaction_of(body["output"])["created_by"] == "m"
        assert body["usage"]["input_tokens"] == 321 and body["usage"]["output_tokens"] == 12
        assert body["usage"]["total_tokens"] == 333
        # one summarization request, through the same adapter path, with the one prompt
        assert len(fake.requests) == 1
        sent = fake.requests[0].body
        assert sent["model"] == "m"
        assert sent["messages"][0]["role"] in ("system", "developer")
        assert sent["messages"][0]["content"].startswith(SUMMARY_PROMPT)
        assert sent["messages"][0]["content"].endswith("Answer in French.")
        assert "cobalt-0" in sent_text(fake) and "cobalt-3" in sent_text(fake)
        assert "cobalt-4" not in sent_text(fake)  # kept verbatim, not summarized
        assert "tools" not in sent or not sent["tools"]


@pytest.mark.parametrize(
    ("route", "compaction", "budget"),
    [
        ({"context_window": 32_000}, {}, 4_800),  # the default: 15% of the model's window
        ({}, {"keep_recent_tokens": 2_500}, 2_500),  # an absolute budget, on a 128k window
    ],
)
async def test_compacting_a_bulky_tail_shrinks_the_window_to_the_budget(
    route: dict[str, Any], compaction: dict[str, Any], budget: int
) -> None:
    # A 30,000-character tool result then a long assistant message, ~9,400 tokens: over the budget.
    convo = bulky_tail()
    assert estimate(convo) > budget
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("SUMMARY: modules 0-2 reviewed; build.log read, every line ok. " * 8))
        models = {"w": {"provider": "up", **route}}
        settings = {**chat_upstream(fake, models, api_key="sk-up"), "compaction": compaction}
        with serve_gateway(settings) as gw:
            r = await post(gw, "/v1/responses/compact", {"model": "w", "input": convo})
    assert r.status_code == 200, r.text
    window = r.json()["output"]
    summary = compaction_of(window)
    verbatim = [i for i in window if i["type"] != "compaction"]
    assert estimate(verbatim) <= budget
    assert estimate(window) <= budget + estimate([summary])
    assert estimate(window) < estimate(convo) and len(orjson.dumps(window)) < len(orjson.dumps(convo))
    # what is kept is the system message and the newest items, verbatim; the rest was summarized
    assert verbatim[0]["role"] == "system" and len(verbatim) < len(convo)
    texts = [m["content"][0]["text"] for m in verbatim if m["type"] == "message"]
    assert texts[-1] == convo[-1]["content"]
    assert not any(i["type"].startswith("function_call") for i in verbatim)  # the pair went together
    assert "line 00000: compiler output ok" in sent_text(fake) and "call_log" in sent_text(fake)


async def test_missing_model_unknown_model_bad_json_and_auth() -> None:
    with serve_gateway({"auth": TWO_TENANTS}) as gw:
        r = await post(gw, "/v1/responses/compact", {"input": "x"}, A)
        assert r.status_code == 400 and error_of(r)["param"] == "model"
        assert error_of(r)["code"] == "missing_required_parameter"
        r = await post(gw, "/v1/responses/compact", {"model": "nope", "input": "x"}, A)
        assert r.status_code == 400 and error_of(r)["code"] == "model_not_found"
        async with httpx.AsyncClient(base_url=gw.base_url) as c:
            r = await c.post(
                "/v1/responses/compact", content=b"{", headers={**A, "content-type": "application/json"}
            )
        assert r.status_code == 400 and error_of(r)["code"] == "invalid_json"
        r = await post(gw, "/v1/responses/compact", {"model": "mock", "input": "x"})
        assert r.status_code == 401
        r = await post(gw, "/v1/responses/compact", {"model": "mock", "input": [{"type": "bogus"}]}, A)
        assert r.status_code == 400 and error_of(r)["param"].startswith("input")


async def test_previous_response_id_chain_and_tenancy() -> None:
    with serve_gateway({"auth": TWO_TENANTS, "compaction": {"keep_recent_items": 2}}) as gw:
        prev = None
        for n in range(3):
            r = await post(
                gw, "/v1/responses", {"model": "mock", "input": f"turn {n}", "previous_response_id": prev}, A
            )
            assert r.status_code == 200
            prev = r.json()["id"]
        r = await post(gw, "/v1/responses/compact", {"model": "mock", "previous_response_id": prev}, A)
        assert r.status_code == 200, r.text
        out = r.json()["output"]
        assert [i["type"] for i in out] == ["compaction", "message", "message"]
        assert out[1]["content"][0]["text"] == "turn 2" and out[2]["role"] == "assistant"
        assert r.json()["usage"]["input_tokens"] > 0  # turns 0 and 1 were summarized by the model
        # input appended after the chain
        r = await post(
            gw, "/v1/responses/compact", {"model": "mock", "previous_response_id": prev, "input": "more"}, A
        )
        assert r.json()["output"][-1]["content"][0]["text"] == "more"
        # another tenant's id, or an unknown one, is not found
        for headers, rid in ((B, prev), (A, "resp_doesnotexist")):
            r = await post(
                gw, "/v1/responses/compact", {"model": "mock", "previous_response_id": rid}, headers
            )
            assert r.status_code == 400
            assert error_of(r)["code"] == "previous_response_not_found"
            assert error_of(r)["param"] == "previous_response_id"
        # a store:false response is not a compactable chain
        r = await post(gw, "/v1/responses", {"model": "mock", "input": "x", "store": False}, A)
        r = await post(
            gw, "/v1/responses/compact", {"model": "mock", "previous_response_id": r.json()["id"]}, A
        )
        assert r.status_code == 400 and error_of(r)["code"] == "previous_response_not_found"


async def test_the_compaction_id_is_not_a_continuation_handle(gateway: ServedApp) -> None:
    r = await post(gateway, "/v1/responses/compact", {"model": "mock", "input": "x"})
    r = await post(
        gateway, "/v1/responses", {"model": "mock", "input": "y", "previous_response_id": r.json()["id"]}
    )
    assert r.status_code == 400 and error_of(r)["code"] == "previous_response_not_found"


# -- continuing with a compacted window --------------------------------------------------------------
async def test_continuing_after_compaction_reaches_the_upstream_readable() -> None:
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("SUMMARY: code words cobalt-0..cobalt-3 were given."))
        with serve_gateway(upstream_settings(fake, compaction={"keep_recent_items": 2})) as gw:
            r = await post(gw, "/v1/responses/compact", {"model": "m", "input": conversation(5)})
            window = r.json()["output"]
            fake.reset()
            r = await post(gw, "/v1/responses", {"model": "m", "input": [*window, user("Which code words?")]})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "completed" and r.json()["previous_response_id"] is None
        messages = fake.requests[0].body["messages"]
        text = sent_text(fake)
        assert "SUMMARY: code words cobalt-0..cobalt-3 were given." in text
        assert "encrypted_content" not in text and "v1." not in text and "cmp_" not in text
        summary_msg = next(m for m in messages if "SUMMARY:" in str(m["content"]))
        assert summary_msg["role"] == "user"  # derived from the conversation: no instruction authority
        assert SUMMARY_MESSAGE_HEADER.strip() in str(summary_msg["content"])
        roles = [m["role"] for m in messages]
        assert roles[0] == "system" and roles[-1] == "user"
        assert "cobalt-4" in text and "Which code words?" in text


async def test_an_empty_summary_opens_into_nothing() -> None:
    async with FakeOpenAIChat.serve() as fake:
        with serve_gateway(upstream_settings(fake)) as gw:
            r = await post(gw, "/v1/responses/compact", {"model": "m", "input": [user("hello")]})
            assert fake.requests == []  # nothing to summarize: no upstream call
            r = await post(gw, "/v1/responses", {"model": "m", "input": r.json()["output"]})
        assert r.status_code == 200
        assert [m["role"] for m in fake.requests[0].body["messages"]] == ["user"]


async def test_recompaction_folds_the_earlier_summary_and_never_returns_it_in_clear() -> None:
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("FIRST-SUMMARY cobalt"), Reply.text("SECOND-SUMMARY cobalt and slate"))
        with serve_gateway(upstream_settings(fake, compaction={"keep_recent_items": 2})) as gw:
            r = await post(gw, "/v1/responses/compact", {"model": "m", "input": conversation(4)})
            window = r.json()["output"]
            more = [*window, user("slate is the new word"), assistant("noted"), user("and?"), assistant("ok")]
            r = await post(gw, "/v1/responses/compact", {"model": "m", "input": more})
        assert r.status_code == 200, r.text
        assert "FIRST-SUMMARY" not in r.text
        assert len([i for i in r.json()["output"] if i["type"] == "compaction"]) == 1
        second = sent_text(fake, 1)
        assert "[earlier summary]" in second and "FIRST-SUMMARY cobalt" in second
        assert second.index("FIRST-SUMMARY") < second.index("slate is the new word")


async def test_summarization_failure_is_reported_not_sealed() -> None:
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.error(500))
        with serve_gateway(upstream_settings(fake, compaction={"keep_recent_items": 0})) as gw:
            r = await post(gw, "/v1/responses/compact", {"model": "m", "input": conversation(1)})
        assert r.status_code == 502 and "compaction" not in r.text


# -- tampering never reaches the upstream --------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
async def test_a_tampered_item_is_refused_before_any_upstream_call(stream: bool) -> None:
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("SUMMARY"))
        settings = upstream_settings(fake, auth=TWO_TENANTS, compaction={"keep_recent_items": 1})
        with serve_gateway(settings) as gw:
            r = await post(gw, "/v1/responses/compact", {"model": "m", "input": conversation(2)}, A)
            window = r.json()["output"]
            envelope = compaction_of(window)["encrypted_content"]
            index = next(n for n, i in enumerate(window) if i["type"] == "compaction")
            _, kid, blob = envelope.split(".")
            bad = {
                "flipped": flip_byte(envelope),
                "truncated": envelope[:-10],
                "wrong version": f"v9.{kid}.{blob}",
                "unknown key": f"v1.ffffffff.{blob}",
                "not an envelope": "hello",
            }
            fake.reset()
            for name, env in bad.items():
                body = {"model": "m", "input": [*with_envelope(window, env), user("go")], "stream": stream}
                r = await post(gw, "/v1/responses", body, A)
                assert r.status_code == 400, name
                assert r.headers["content-type"] == "application/json", name  # no stream was started
                err = error_of(r)
                assert err["code"] == "invalid_encrypted_content", name
                assert err["param"] == f"input[{index}].encrypted_content", name
            # the authentic window belongs to tenant a only
            r = await post(gw, "/v1/responses", {"model": "m", "input": window, "stream": stream}, B)
            assert r.status_code == 400 and error_of(r)["code"] == "invalid_encrypted_content"
            # ... and compacting it again as tenant b is refused too
            r = await post(gw, "/v1/responses/compact", {"model": "m", "input": window}, B)
            assert r.status_code == 400 and error_of(r)["code"] == "invalid_encrypted_content"
            assert fake.requests == []  # nothing at all went upstream
            r = await post(gw, "/v1/responses", {"model": "m", "input": window, "stream": stream}, A)
            assert r.status_code == 200 and len(fake.requests) == 1


async def test_key_rotation_across_restarts() -> None:
    old, new = key(1), key(2)
    with serve_gateway({"compaction": {"keys": [old]}}) as gw:
        r = await post(gw, "/v1/responses/compact", {"model": "mock", "input": "x"})
        old_window = r.json()["output"]
    assert compaction_of(old_window)["encrypted_content"].split(".")[1] == key_id(bytes([1]) * 32)
    with serve_gateway({"compaction": {"keys": [new, old]}}) as gw:
        r = await post(gw, "/v1/responses", {"model": "mock", "input": old_window})
        assert r.status_code == 200  # the old key still opens
        r = await post(gw, "/v1/responses/compact", {"model": "mock", "input": old_window})
        new_window = r.json()["output"]
    assert compaction_of(new_window)["encrypted_content"].split(".")[1] == key_id(bytes([2]) * 32)
    with serve_gateway({"compaction": {"keys": [new]}}) as gw:
        assert (await post(gw, "/v1/responses", {"model": "mock", "input": new_window})).status_code == 200
        r = await post(gw, "/v1/responses", {"model": "mock", "input": old_window})
        assert r.status_code == 400 and error_of(r)["code"] == "invalid_encrypted_content"


# -- truncation -------------------------------------------------------------------------------------------
def long_conversation() -> list[dict[str, Any]]:
    return [
        {"type": "message", "role": "system", "content": "SYSTEM-RULES"},
        user("OLDEST " + "a" * 400),
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "lookup",
            "arguments": '{"q": "' + "b" * 900 + '"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "RESULT-1"},
        user("MIDDLE " + "c" * 200),
        assistant("REPLY"),
        user("NEWEST question"),
    ]


async def test_truncation_disabled_refuses_before_any_upstream_call() -> None:
    async with FakeOpenAIChat.serve() as fake:
        with serve_gateway(upstream_settings(fake)) as gw:
            for extra in ({}, {"truncation": "disabled"}, {"stream": True}):
                r = await post(gw, "/v1/responses", {"model": "small", "input": long_conversation(), **extra})
                assert r.status_code == 400
                assert error_of(r)["code"] == "context_length_exceeded"
            assert fake.requests == []
            r = await post(gw, "/v1/responses", {"model": "m", "input": long_conversation()})
            assert r.status_code == 200  # the same input fits the default window


async def test_truncation_auto_drops_oldest_keeping_system_and_call_pairs() -> None:
    async with FakeOpenAIChat.serve() as fake:
        with serve_gateway(upstream_settings(fake)) as gw:
            r = await post(
                gw, "/v1/responses", {"model": "small", "input": long_conversation(), "truncation": "auto"}
            )
        assert r.status_code == 200, r.text
        assert r.json()["truncation"] == "auto"
        text = sent_text(fake)
        assert "SYSTEM-RULES" in text and "NEWEST question" in text and "MIDDLE" in text
        assert "OLDEST" not in text
        assert "call_1" not in text and "RESULT-1" not in text  # the call went with its output


async def test_truncation_applies_to_the_previous_response_chain() -> None:
    async with FakeOpenAIChat.serve() as fake:
        with serve_gateway(upstream_settings(fake)) as gw:
            r = await post(
                gw, "/v1/responses", {"model": "small", "input": "FIRST " + "z" * 800, "truncation": "auto"}
            )
            assert r.status_code == 200
            prev = r.json()["id"]
            body = {"model": "small", "input": "SECOND " + "y" * 600, "previous_response_id": prev}
            r = await post(gw, "/v1/responses", body)
            assert r.status_code == 400 and error_of(r)["code"] == "context_length_exceeded"
            fake.reset()
            r = await post(gw, "/v1/responses", {**body, "truncation": "auto"})
        assert r.status_code == 200
        assert "FIRST" not in sent_text(fake) and "SECOND" in sent_text(fake)


async def test_compacting_makes_an_over_long_conversation_fit() -> None:
    async with FakeOpenAIChat.serve() as fake:
        fake.add(Reply.text("SHORT SUMMARY"))
        with serve_gateway(upstream_settings(fake, compaction={"keep_recent_items": 1})) as gw:
            convo = long_conversation()
            r = await post(gw, "/v1/responses", {"model": "small", "input": convo})
            assert r.status_code == 400
            r = await post(gw, "/v1/responses/compact", {"model": "m", "input": convo})
            window = r.json()["output"]
            fake.reset()
            r = await post(gw, "/v1/responses", {"model": "small", "input": window})
        assert r.status_code == 200, r.text
        assert "SHORT SUMMARY" in sent_text(fake) and "SYSTEM-RULES" in sent_text(fake)


async def test_a_stored_turn_keeps_the_compaction_item_sealed() -> None:
    # store=true keeps what the client sent: the sealed item, never the opened summary's plaintext;
    # continuing the chain (or referencing the item) opens it again for the upstream.
    client = redis.Redis.from_url(redis_url())
    p = unique_prefix()
    try:
        async with FakeOpenAIChat.serve() as fake:
            fake.add(Reply.text("SEALED-SUMMARY-4471 of cobalt"))
            state = {"redis_url": redis_url(), "key_prefix": p}
            with serve_gateway(
                upstream_settings(fake, compaction={"keep_recent_items": 1}, state=state)
            ) as gw:
                window = (
                    await post(gw, "/v1/responses/compact", {"model": "m", "input": conversation(3)})
                ).json()
                sealed = next(i for i in window["output"] if i["type"] == "compaction")
                fake.reset()
                r = await post(gw, "/v1/responses", {"model": "m", "input": [*window["output"], user("go")]})
                assert r.status_code == 200, r.text
                first = r.json()
                assert "SEALED-SUMMARY-4471" in sent_text(fake)  # opened for the upstream
                async with httpx.AsyncClient(base_url=gw.base_url) as c:
                    listed = (await c.get(f"/v1/responses/{first['id']}/input_items?order=asc")).json()
                kept = [i for i in listed["data"] if i["type"] == "compaction"]
                assert [(i["id"], i["encrypted_content"]) for i in kept] == [
                    (sealed["id"], sealed["encrypted_content"])
                ]
                for key in client.scan_iter(match=f"{p}:*"):
                    blob = stored_bytes(client, key)
                    assert b"SEALED-SUMMARY-4471" not in blob
                # a continuation and a reference reach the summary again
                fake.reset()
                body = {"model": "m", "previous_response_id": first["id"], "input": "and now?"}
                assert (await post(gw, "/v1/responses", body)).status_code == 200
                assert "SEALED-SUMMARY-4471" in sent_text(fake)
                fake.reset()
                ref = {"model": "m", "input": [{"type": "item_reference", "id": sealed["id"]}, user("x")]}
                assert (await post(gw, "/v1/responses", ref)).status_code == 200
                assert "SEALED-SUMMARY-4471" in sent_text(fake)
    finally:
        client.close()
        delete_prefix(redis_url(), p)
