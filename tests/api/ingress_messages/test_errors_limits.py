"""Bad input, authentication and every limit on ``/v1/messages``: refused in Anthropic's error shape
(``{"type": "error", "error": {"type", "message"}}``, the message naming the field) with the status
the anthropic SDK maps to its own exception classes; ``count_tokens`` answers the gateway's estimate;
the requests are counted under ``api="messages"``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from gateway.kernel.estimate import estimate_text
from tests.harness import ServedApp, serve_gateway

KEYS = {
    "api_keys": [
        {"key": "sk-a", "tenant": "a"},
        {"key": "sk-only-other", "tenant": "a", "models": ["other"]},
        {"key": "sk-slow", "tenant": "slow"},
        {"key": "sk-poor", "tenant": "poor"},
    ]
}
SETTINGS: dict[str, Any] = {
    "auth": KEYS,
    "admin": {"api_keys": [{"key": "sk-admin"}]},
    "models": {"mock": {"provider": "mock"}, "other": {"provider": "mock"}},
    "tenants": {
        "slow": {"limits": {"requests_per_minute": 1}},
        "poor": {"budget": {"tokens": 50}},
        "a": {"retention": "none"},
    },
    "limits": {"max_body_bytes": 4096, "max_input_elements": 12, "max_json_depth": 8},
}
DEEP_7: Any = [[[[[[[]]]]]]]  # 7 levels: 11 within a message's block (messages → message → content → block)
OK: dict[str, Any] = {"model": "mock", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def gw() -> Iterator[ServedApp]:
    with serve_gateway(SETTINGS) as served:
        yield served


def post(
    gw: ServedApp, body: Any, key: str | None = "sk-a", path: str = "/v1/messages", **headers: str
) -> httpx.Response:
    hdrs = {"anthropic-version": "2023-06-01", **headers}
    if key is not None:
        hdrs["x-api-key"] = key
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(gw.base_url + path, content=content, headers=hdrs, timeout=10)


def error_of(resp: httpx.Response, status: int, kind: str) -> str:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/json"
    body = resp.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert set(body["error"]) == {"type", "message"}
    assert body["request_id"] == resp.headers["request-id"]
    message: str = body["error"]["message"]
    return message


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "mock", "messages": [{"role": "user", "content": "x"}]}, "max_tokens: Field required"),
        ({**OK, "max_tokens": "9"}, "max_tokens: "),
        ({**OK, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role: "),
        (
            {**OK, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages.0.content.0.text: Field required",
        ),
        ({**OK, "messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages.0.content.0"),
        ({**OK, "messages": []}, "messages: "),
        (
            {**OK, "messages": [{"role": "user", "content": []}]},
            "messages.0: all messages must have non-empty",
        ),
        ({**OK, "temperature": 1.5}, "temperature: "),
        ({**OK, "stream": "yes"}, "stream: "),
        ({**OK, "tools": [{"name": "bad name", "input_schema": {}}]}, "tools.0.name: "),
        ({**OK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type: "),
        ({**OK, "tool_choice": {"type": "tool"}}, "tool_choice.tool.name: Field required"),
        ({**OK, "thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens: "),
        ({**OK, "thinking": {"type": "enabled", "budget_tokens": 2000}}, "max_tokens: must be greater"),
        (
            {**OK, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}]},
            "messages.0.content.0.tool_use_id: unexpected `tool_use_id`",
        ),
        ({**OK, "model": "no such"}, "model: "),
        (
            {
                **OK,
                "tools": [
                    {"name": "t", "input_schema": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {}}}}}}}}}}
                ],
            },
            "tools.0.input_schema: nested more than 8 levels deep",
        ),
        # fields the wire model does not read go upstream as sent: walked as well
        ({**OK, "x_vendor": [[[[[[[[[]]]]]]]]]}, "x_vendor: nested more than 8 levels deep"),
        (
            {**OK, "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "x": DEEP_7}]}]},
            "messages: nested more than 8 levels deep",
        ),
        ({**OK, "messages": [{"role": "user", "content": "x"}] * 13}, "messages: the request has 13"),
        ([1, 2], "The request body must be a JSON object."),
        (b"{nope", "The request body is not valid JSON."),
    ],
)
def test_bad_input_names_the_field(gw: ServedApp, body: Any, field: str) -> None:
    message = error_of(post(gw, body), 400, "invalid_request_error")
    assert message.startswith(field), message


def test_body_too_large_is_request_too_large(gw: ServedApp) -> None:
    big = {**OK, "messages": [{"role": "user", "content": "x" * 5000}]}
    assert "exceeds the limit of 4096 bytes" in error_of(post(gw, big), 413, "request_too_large")


def test_authentication(gw: ServedApp) -> None:
    assert post(gw, OK).status_code == 200  # x-api-key
    assert post(gw, OK, key=None, authorization="Bearer sk-a").status_code == 200
    error_of(post(gw, OK, key=None), 401, "authentication_error")
    error_of(post(gw, OK, key="sk-wrong"), 401, "authentication_error")
    error_of(post(gw, OK, key="sk-wrong", path="/v1/messages/count_tokens"), 401, "authentication_error")


def test_unknown_and_disallowed_models_are_not_found(gw: ServedApp) -> None:
    """As Anthropic's API answers an unknown model: 404 not_found_error, naming the field."""
    message = error_of(post(gw, {**OK, "model": "nope"}), 404, "not_found_error")
    assert message == "model: The requested model 'nope' does not exist."
    message = error_of(post(gw, OK, key="sk-only-other"), 404, "not_found_error")
    assert message.startswith("model: ")
    assert post(gw, {**OK, "model": "other"}, key="sk-only-other").status_code == 200


def test_rate_limit_and_budget(gw: ServedApp) -> None:
    assert post(gw, OK, key="sk-slow").status_code == 200
    resp = post(gw, OK, key="sk-slow")
    error_of(resp, 429, "rate_limit_error")
    assert int(resp.headers["retry-after"]) >= 1
    assert resp.headers["x-ratelimit-limit-requests"] == "1"
    big = {**OK, "max_tokens": 500}
    assert "budget" in error_of(post(gw, big, key="sk-poor"), 429, "rate_limit_error").lower()


async def test_sdk_exceptions(gw: ServedApp) -> None:
    c = anthropic.AsyncAnthropic(base_url=gw.base_url, api_key="sk-a", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as bad:
        no_source: Any = [{"role": "user", "content": [{"type": "image"}]}]
        await c.messages.create(model="mock", max_tokens=10, messages=no_source)
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    wrong = anthropic.AsyncAnthropic(base_url=gw.base_url, api_key="sk-nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        await wrong.messages.create(**OK)
    slow = anthropic.AsyncAnthropic(base_url=gw.base_url, api_key="sk-slow", max_retries=0)
    with pytest.raises(anthropic.RateLimitError):
        for _ in range(3):
            await slow.messages.create(**OK)


async def test_count_tokens_is_the_gateway_estimate(gw: ServedApp) -> None:
    c = anthropic.AsyncAnthropic(base_url=gw.base_url, api_key="sk-a", max_retries=0)
    text = "How many tokens is this sentence, by the gateway's reckoning?"
    system = "Be brief."
    plain = await c.messages.count_tokens(model="mock", messages=[{"role": "user", "content": text}])
    assert plain.input_tokens > estimate_text(text)  # the text plus the item's overhead
    with_system = await c.messages.count_tokens(
        model="mock", system=system, messages=[{"role": "user", "content": text}]
    )
    assert with_system.input_tokens == plain.input_tokens + estimate_text(system)
    with pytest.raises(anthropic.NotFoundError):
        await c.messages.count_tokens(model="nope", messages=[{"role": "user", "content": text}])
    with pytest.raises(anthropic.BadRequestError):
        await c.messages.count_tokens(model="mock", messages=[])


def test_method_not_allowed(gw: ServedApp) -> None:
    resp = httpx.get(gw.base_url + "/v1/messages", timeout=10)
    assert resp.status_code == 405 and resp.headers["allow"] == "POST"


def test_requests_counted_as_messages(gw: ServedApp) -> None:
    assert post(gw, {**OK, "stream": True}).status_code == 200
    metrics = httpx.get(
        gw.base_url + "/metrics", headers={"authorization": "Bearer sk-admin"}, timeout=10
    ).text
    lines = [line for line in metrics.splitlines() if line.startswith("gateway_requests_total{")]
    assert any('api="messages"' in line and 'status="completed"' in line for line in lines), lines
    assert any('api="messages"' in line and 'status="400"' in line for line in lines), lines


def test_the_ledger_counts_messages_turns_as_their_clients_saw_them() -> None:
    """The usage ledger totals are the usage the Messages answers reported (in the engine's terms:
    input includes cached), JSON and SSE alike; refusals are not turns."""
    with serve_gateway({"auth": {"api_keys": [{"key": "sk-l", "tenant": "ledger"}]}}) as served:
        seen_in = seen_out = 0
        for stream in (False, True, False):
            resp = post(served, {**OK, "stream": stream}, key="sk-l")
            assert resp.status_code == 200
            if stream:
                deltas = [
                    orjson.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: ")
                ]
                usage = next(e for e in deltas if e["type"] == "message_delta")["usage"]
            else:
                usage = resp.json()["usage"]
            seen_in += (
                usage["input_tokens"]
                + usage["cache_read_input_tokens"]
                + usage["cache_creation_input_tokens"]
            )
            seen_out += usage["output_tokens"]
        assert post(served, {**OK, "max_tokens": "x"}, key="sk-l").status_code == 400
        report = httpx.get(
            served.base_url + "/v1/usage", headers={"authorization": "Bearer sk-l"}, timeout=10
        )
        totals = report.json()["totals"]
        assert totals["requests"] == 3
        assert totals["input_tokens"] == seen_in and totals["output_tokens"] == seen_out
