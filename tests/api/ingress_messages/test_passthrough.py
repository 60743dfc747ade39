"""A Messages request routed to an anthropic upstream keeps every field it had: the body the fake
upstream receives through the gateway equals, field by field, the body of the same request sent to
it directly (the model aside, which the route names)."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from tests.fakes.anthropic import Reply
from tests.harness import ServedApp

PDF_SOURCE: dict[str, Any] = {"type": "base64", "media_type": "application/pdf"}
PDF = base64.b64encode(b"%PDF-1.4 tiny").decode()
RICH: dict[str, Any] = {
    "max_tokens": 3000,
    "system": [
        {"type": "text", "text": "You are a careful assistant."},
        {"type": "text", "text": "Cite sources.", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look at these.", "cache_control": {"type": "ephemeral"}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
                {"type": "document", "source": {**PDF_SOURCE, "data": PDF},
                 "title": "doc"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "They want the weather.", "signature": "EqQBCkYIAR+/=="},
                {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_01A", "name": "get_weather",
                 "input": {"city": "Paris", "units": ["c"]}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01A",
                    "is_error": True,
                    "content": [{"type": "text", "text": "timeout"}],
                },
                {"type": "text", "text": "Try again?"},
            ],
        },
    ],
    "tools": [
        {
            "name": "get_weather",
            "description": "Weather.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
            "cache_control": {"type": "ephemeral"},
        }
    ],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "thinking": {"type": "enabled", "budget_tokens": 1500},
    "stop_sequences": ["\n\nHuman:", "END"],
    "temperature": 1.0,
    "top_p": 0.9,
    "top_k": 40,
    "metadata": {"user_id": "user-7f3a"},
    "service_tier": "standard_only",
    "some_future_field": {"nested": [1, 2]},
}  # fmt: skip
HEADERS = {"x-api-key": "sk-fake", "anthropic-version": "2023-06-01"}


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
async def test_fields_reach_anthropic_as_sent_directly(
    all_gateway: ServedApp, fakes: dict[str, Any], stream: bool
) -> None:
    fake = fakes["anthropic"]
    fake.add(Reply.text("direct"), Reply.text("via gateway"))
    body = {**RICH, "stream": stream}
    async with httpx.AsyncClient(timeout=10) as http:
        direct = await http.post(
            fake.base_url + "/v1/messages", json={**body, "model": "fake-model"}, headers=HEADERS
        )
        assert direct.status_code == 200, direct.text
        gw = await http.post(
            all_gateway.base_url + "/v1/messages",
            json={**body, "model": "via-anthropic"},
            headers={"x-api-key": "sk-client", "anthropic-version": "2023-06-01", "anthropic-beta": "x-2025"},
        )
        assert gw.status_code == 200, gw.text
    sent_direct, sent_gw = fake.requests[-2].body, fake.requests[-1].body
    assert sent_gw["model"] == sent_direct["model"] == "fake-model"
    for name in sorted(set(sent_direct) | set(sent_gw)):
        assert sent_gw.get(name) == sent_direct.get(name), name
    assert sent_gw == sent_direct
    assert fake.requests[-1].headers["anthropic-beta"] == "x-2025"  # the client's betas go on with it
    assert fake.requests[-1].headers["x-api-key"] == "sk-fake"  # the provider's key, not the client's
