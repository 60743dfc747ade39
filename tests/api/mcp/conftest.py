"""The gateway as the MCP host, in front of the fakes of every adapter (real HTTP servers speaking
each provider's wire format, whose default policy calls the first offered tool) and of real MCP
servers on loopback (tests/fakes/mcp_servers.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.fakes.all import KINDS, gateway_config
from tests.fakes.mcp_servers import McpServers, serve_mcp_servers
from tests.fakes.openai_chat import smart_reply
from tests.harness import ServedApp, serve_gateway

ROUTES = ["mock", "via-openai-chat", "via-openai-responses", "via-anthropic", "via-gemini"]


@pytest.fixture(scope="package")
def mcp_servers() -> Iterator[McpServers]:
    with serve_mcp_servers() as servers:
        yield servers


@pytest.fixture(scope="package")
async def upstreams() -> AsyncIterator[dict[str, Any]]:
    async with contextlib.AsyncExitStack() as stack:
        served = {kind: await stack.enter_async_context(cls.serve()) for kind, cls in KINDS.items()}
        served["openai-chat"].responder = smart_reply  # a test without ``fakes`` gets the same policy
        yield served


@pytest.fixture
def fakes(upstreams: dict[str, Any]) -> dict[str, Any]:
    """The fakes by model name, reset for each test."""
    for fake in upstreams.values():
        fake.reset()
    upstreams["openai-chat"].responder = smart_reply
    return {f"via-{kind}": fake for kind, fake in upstreams.items()}


def mcp_settings(upstreams: dict[str, Any], **mcp: Any) -> dict[str, Any]:
    """Every route, and MCP servers on loopback allowed (an IP entry: loopback is refused unless
    listed)."""
    config = gateway_config({kind: fake.base_url for kind, fake in upstreams.items()})
    config["mcp"] = {"allow": ["127.0.0.1"], **mcp}
    return config


@pytest.fixture(scope="package")
def served(upstreams: dict[str, Any]) -> Iterator[ServedApp]:
    with serve_gateway(mcp_settings(upstreams, call_timeout_seconds=2)) as s:
        yield s


async def post(s: ServedApp, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=s.base_url, timeout=30) as c:
        r = await c.post("/v1/responses", json=body)
    assert r.status_code == status, r.text
    out: dict[str, Any] = r.json()
    return out


def kinds(resource: dict[str, Any]) -> list[str]:
    return [o["type"] for o in resource["output"]]


def text_of(resource: dict[str, Any]) -> str:
    return "".join(
        p.get("text", "")
        for o in resource["output"]
        if o["type"] == "message"
        for p in o["content"]
        if p["type"] == "output_text"
    )
