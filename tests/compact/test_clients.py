"""Real clients against the gateway: the openai SDK's ``responses.compact()`` and the
openai-agents ``OpenAIResponsesCompactionSession`` (which insists on an OpenAI model name, so
``gpt-4.1`` is routed to the built-in mock model here)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, SQLiteSession, set_tracing_disabled
from agents.memory import OpenAIResponsesCompactionSession

from tests.compact.helpers import conversation, flip_byte
from tests.harness import ServedApp, serve_gateway

set_tracing_disabled(True)


@pytest.fixture(scope="module")
def gw() -> Iterator[ServedApp]:
    settings = {"models": {"gpt-4.1": {"provider": "mock"}}, "compaction": {"keep_recent_items": 2}}
    with serve_gateway(settings) as served:
        yield served


def client_for(gw: ServedApp) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.base_url + "/v1", api_key="sk-none", max_retries=0)


async def test_sdk_compact_then_continue(gw: ServedApp) -> None:
    client = client_for(gw)
    compacted = await client.responses.compact(model="mock", input=conversation(4), instructions="Be terse.")  # type: ignore[arg-type]
    assert compacted.object == "response.compaction"
    kinds = [item.type for item in compacted.output]
    assert kinds == ["message", "compaction", "message", "message"]
    assert compacted.usage.input_tokens > 0 and compacted.usage.total_tokens == (
        compacted.usage.input_tokens + compacted.usage.output_tokens
    )
    window: list[Any] = [item.model_dump(exclude_none=True, warnings=False) for item in compacted.output]
    response = await client.responses.create(
        model="mock", input=[*window, {"role": "user", "content": "and now?"}], store=False
    )
    assert response.status == "completed"
    assert response.output_text == "Hello! You said: and now?"


async def test_sdk_compact_errors(gw: ServedApp) -> None:
    client = client_for(gw)
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.compact(model="mock", previous_response_id="resp_missing")
    assert info.value.code == "previous_response_not_found"
    compacted = await client.responses.compact(model="mock", input="hi")
    window = [item.model_dump(exclude_none=True, warnings=False) for item in compacted.output]
    for item in window:
        if item["type"] == "compaction":
            item["encrypted_content"] = flip_byte(item["encrypted_content"])
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model="mock", input=window)  # type: ignore[arg-type]
    assert info.value.code == "invalid_encrypted_content"


def agent_for(gw: ServedApp, store: bool = True) -> Agent:
    return Agent(
        name="assistant",
        instructions="Be brief.",
        model=OpenAIResponsesModel(model="gpt-4.1", openai_client=client_for(gw)),
        model_settings=ModelSettings(store=store),
    )


@pytest.mark.parametrize("mode", ["previous_response_id", "input"])
async def test_agents_compaction_session(gw: ServedApp, mode: str) -> None:
    session = OpenAIResponsesCompactionSession(
        session_id=f"s-{mode}",
        underlying_session=SQLiteSession(f"s-{mode}"),
        client=client_for(gw),
        model="gpt-4.1",
        compaction_mode=mode,  # type: ignore[arg-type]
        should_trigger_compaction=lambda ctx: len(ctx["session_items"]) >= 6,
    )
    agent = agent_for(gw)
    for n in range(4):
        result = await Runner.run(agent, f"message {n}", session=session)
        assert result.final_output == f"Hello! You said: message {n}"
    items = await session.get_items()
    compactions = [i for i in items if isinstance(i, dict) and i.get("type") == "compaction"]
    assert len(compactions) == 1, items  # compacted automatically after a turn, then kept compacting
    assert len(items) < 8
    # the compacted history is sent back as input on the next turn, and it works
    result = await Runner.run(agent, "after compaction", session=session)
    assert result.final_output == "Hello! You said: after compaction"
    # a manual, forced compaction of the whole session also works
    await session.run_compaction({"force": True, "compaction_mode": "input"})
    items = await session.get_items()
    assert [i.get("type") for i in items if isinstance(i, dict)].count("compaction") == 1
    result = await Runner.run(agent, "last", session=session)
    assert result.final_output == "Hello! You said: last"
