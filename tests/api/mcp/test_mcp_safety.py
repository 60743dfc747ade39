"""MCP safety: server URLs off the tenant's allow-list (loopback, link-local and private addresses
included) are refused; the secrets a request gives (``headers``, ``authorization``) and operators
hold (declared servers) reach the MCP server and nowhere else: not the response, the store,
Redis, the log lines or the spans; a ``store: false`` turn writes nothing of the tools' results to
Redis. The gateway runs as ``python -m gateway serve`` on a real Redis, exporting spans over OTLP."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.api.helpers import cli_env, serve_cli, wait_until_up
from tests.api.mcp.conftest import kinds, mcp_settings, post
from tests.fakes.all import gateway_config
from tests.fakes.mcp_servers import McpServers
from tests.fakes.openai_chat import Reply, smart_reply
from tests.harness import ServedApp, free_port, serve_gateway
from tests.observability.test_otlp import Receiver, receiver  # noqa: F401  (a fixture)
from tests.redis_server import Monitor, redis_url, unique_prefix

SECRET = "sk-mcp-secret-4f1c9a"
OPERATOR_SECRET = "sk-operator-held-77b2e0"
RESULT_MARK = "needle-result-9d3e1b"


@pytest.fixture(scope="module")
def strict(upstreams: dict[str, Any]) -> Iterator[ServedApp]:
    """A gateway with the default MCP settings: no allow-list at all."""
    config = gateway_config({kind: fake.base_url for kind, fake in upstreams.items()})
    with serve_gateway(config) as s:
        yield s


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/mcp",  # loopback, not listed
        "http://169.254.169.254/latest/meta-data",  # link-local: cloud metadata
        "http://10.1.2.3/mcp",  # private
        "http://[::1]:9/mcp",
        "https://mcp.example.com/mcp",  # public, but not on the list
        "file:///etc/passwd",
    ],
)
async def test_a_server_off_the_allow_list_is_refused(strict: ServedApp, url: str) -> None:
    tool = {"type": "mcp", "server_label": "x", "server_url": url, "require_approval": "never"}
    err = await post(strict, {"model": "mock", "input": "hi", "tools": [tool]}, status=400)
    assert err["error"]["param"] == "tools[0].server_url"
    assert err["error"]["type"] == "invalid_request_error"


async def test_a_listed_hostname_resolving_to_loopback_is_refused(
    upstreams: dict[str, Any], mcp_servers: McpServers
) -> None:
    """DNS rebinding: listing a name is no licence for the private address it resolves to."""
    url = mcp_servers.url("plain").replace("127.0.0.1", "localhost")
    with serve_gateway(mcp_settings(upstreams, allow=["localhost"])) as s:
        tool = {"type": "mcp", "server_label": "x", "server_url": url, "require_approval": "never"}
        err = await post(s, {"model": "mock", "input": "hi", "tools": [tool]}, status=400)
    assert err["error"]["param"] == "tools[0].server_url"


async def test_a_redirect_off_the_allow_list_is_not_followed(
    served: ServedApp, mcp_servers: McpServers, fakes: dict[str, Any]
) -> None:
    tool = {"type": "mcp", "server_label": "r", "server_url": mcp_servers.url("redirect")}
    err = await post(served, {"model": "via-openai-chat", "input": "hi", "tools": [tool]}, status=424)
    assert err["error"]["code"] == "mcp_server_error" and "169.254" not in err["error"]["message"]
    assert fakes["via-openai-chat"].requests == []


async def test_an_unknown_label_without_url_is_refused(served: ServedApp) -> None:
    tool = {"type": "mcp", "server_label": "nowhere", "require_approval": "never"}
    err = await post(served, {"model": "mock", "input": "hi", "tools": [tool]}, status=400)
    assert err["error"]["param"].startswith("tools[0]")


async def test_a_server_that_needs_a_header_gets_it(served: ServedApp, mcp_servers: McpServers) -> None:
    base = {"type": "mcp", "server_label": "locked", "server_url": mcp_servers.url("needs_header")}
    base["require_approval"] = "never"
    refused = await post(served, {"model": "mock", "input": "hi", "tools": [base]}, status=424)
    assert SECRET not in str(refused)
    ok = await post(
        served, {"model": "mock", "input": "hi", "tools": [{**base, "headers": mcp_servers.header(SECRET)}]}
    )
    assert kinds(ok) == ["mcp_list_tools", "mcp_call", "message"]
    assert SECRET not in orjson.dumps(ok).decode()


@pytest.mark.timeout(180)
async def test_secrets_and_results_stay_out_of_logs_spans_and_redis(
    upstreams: dict[str, Any],
    mcp_servers: McpServers,
    receiver: Receiver,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    chat = upstreams["openai-chat"]
    chat.reset()
    chat.responder = smart_reply
    prefix = unique_prefix()
    config = mcp_settings(
        upstreams,
        servers={
            "vault": {
                "url": mcp_servers.url("needs_header"),
                "headers": mcp_servers.header(OPERATOR_SECRET),
            }
        },
    )
    config["state"] = {"redis_url": redis_url(), "key_prefix": prefix}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    env = cli_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="50")
    proc = serve_cli(
        port, "--config", str(path), env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    base = f"http://127.0.0.1:{port}"
    monitor: Monitor | None = None
    try:
        await asyncio.to_thread(wait_until_up, proc, port)
        monitor = Monitor(redis_url())
        given = {
            "type": "mcp",
            "server_label": "locked",
            "server_url": mcp_servers.url("needs_header"),
            "headers": mcp_servers.header(SECRET),
            "authorization": SECRET,
            "require_approval": "never",
        }
        declared = {"type": "mcp", "server_label": "vault", "require_approval": "never"}
        async with httpx.AsyncClient(base_url=base, timeout=30) as c:
            stored = []
            for tool in (given, declared):
                r = await c.post(
                    "/v1/responses", json={"model": "via-openai-chat", "input": "hi", "tools": [tool]}
                )
                assert r.status_code == 200, r.text
                assert kinds(r.json()) == ["mcp_list_tools", "mcp_call", "message"]
                stored.append(r.json())
                again = await c.get(f"/v1/responses/{r.json()['id']}")
                assert again.status_code == 200 and again.json()["output"] == r.json()["output"]
            # store false: the tool's result (it echoes its input) is never written to Redis
            plain = {"type": "mcp", "server_label": "calc", "server_url": mcp_servers.url("plain")}
            plain["require_approval"] = "never"
            upstreams["openai-chat"].add(
                Reply.tool_calls([("calc__echo", f'{{"text": "{RESULT_MARK}"}}', "c1")])
            )
            r = await c.post(
                "/v1/responses",
                json={"model": "via-openai-chat", "input": "Say it.", "tools": [plain], "store": False},
            )
            assert r.json()["output"][1].get("output") == RESULT_MARK, r.json()
            assert r.status_code == 200 and kinds(r.json()) == ["mcp_list_tools", "mcp_call", "message"]
        deadline = time.monotonic() + 30
        while sum(s.name.startswith("mcp.call") for _, s in receiver.spans()) < 3:
            assert time.monotonic() < deadline, [s.name for _, s in receiver.spans()]
            await asyncio.sleep(0.05)
    finally:
        seen = monitor.stop() if monitor is not None else b""
        proc.terminate()
        _, err = await asyncio.to_thread(proc.communicate, timeout=60)
    spans = [s for _, s in receiver.spans()]
    for secret in (SECRET, OPERATOR_SECRET):
        assert secret not in err
        assert secret.encode() not in seen
        assert secret not in str(spans)
        assert secret not in str(stored)
    assert prefix.encode() in seen  # MONITOR saw the gateway's own writes
    assert RESULT_MARK.encode() not in seen
    call_spans = [s for s in spans if s.name.startswith("mcp.call")]
    assert {s.name for s in call_spans} == {"mcp.call locked", "mcp.call vault", "mcp.call calc"}
    for span in call_spans:
        assert RESULT_MARK not in str(span)
    lines = [orjson.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any(line.get("event") == "request" for line in lines)
