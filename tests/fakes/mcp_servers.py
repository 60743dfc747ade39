"""Real MCP servers on loopback for the hosted-tools tests, built with the ``mcp`` SDK's
``MCPServer`` and served by uvicorn, each on a port of its own (``serve_mcp_servers()``; then
``servers.url(name)``):

- ``plain``: ``add(a, b)``, ``echo(text)``, ``lookup(word)`` (annotated ``readOnlyHint``) and
  ``sleep(seconds)``, over streamable HTTP;
- ``needs_header``: the same tools, 401 without an ``X-Api-Key`` header (``header(value)`` makes
  one; ``keys_seen`` lists the values it was sent);
- ``failing``: ``explode()``, a tool that fails (``isError``);
- ``hanging``: ``wait()``, which never answers;
- ``huge``: ``dump()``, a 2 MB result;
- ``sse``: the plain tools over the SSE transport (its URL ends ``/sse``);
- ``redirect``: answers every request with a redirect to the cloud metadata address;
- ``malformed``: not MCP at all: every POST gets ``200 application/json`` with a body that is not
  JSON-RPC.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from tests.harness import ServedApp

Scope = dict[str, Any]


def _tools(server: MCPServer[Any]) -> MCPServer[Any]:
    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> str:
        return str(a + b)

    @server.tool(description="Say the text back.")
    def echo(text: str) -> str:
        return text

    @server.tool(description="Look a word up.", annotations=ToolAnnotations(read_only_hint=True))
    def lookup(word: str) -> str:
        return f"{word}: a word"

    @server.tool(description="Wait, then say so.")
    async def sleep(seconds: float) -> str:
        await asyncio.sleep(min(seconds, 30))
        return f"slept {seconds}"

    return server


def plain() -> Any:
    return _tools(MCPServer("plain")).streamable_http_app()


def failing() -> Any:
    server: MCPServer[Any] = MCPServer("failing")

    @server.tool(description="Always fails.")
    def explode() -> str:
        raise ToolError("the tool exploded")

    return server.streamable_http_app()


def hanging() -> Any:
    server: MCPServer[Any] = MCPServer("hanging")

    @server.tool(description="Never answers.")
    async def wait() -> str:
        await asyncio.sleep(3600)
        return "never"

    return server.streamable_http_app()


def huge() -> Any:
    server: MCPServer[Any] = MCPServer("huge")

    @server.tool(description="Answers two megabytes.")
    def dump() -> str:
        return "x" * (2 * 1024 * 1024)

    return server.streamable_http_app()


def sse() -> Any:
    return _tools(MCPServer("sse")).sse_app()


class NeedsHeader:
    """The plain server behind a check of ``X-Api-Key`` (401 without one)."""

    def __init__(self) -> None:
        self.inner = plain()
        self.keys_seen: list[str] = []

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            key = dict(scope["headers"]).get(b"x-api-key", b"").decode()
            if not key:
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"no key"})
                return
            self.keys_seen.append(key)
        await self.inner(scope, receive, send)


async def malformed(scope: Scope, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b'{"jsonrpc": "2.0", "id": "nope", "result": [1, 2' if scope["method"] == "POST" else b""
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": body})


async def redirect(scope: Scope, receive: Any, send: Any) -> None:
    """Sends every request to the cloud metadata address (a redirect off the allow-list)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    location = b"http://169.254.169.254/latest/meta-data"
    await send({"type": "http.response.start", "status": 307, "headers": [(b"location", location)]})
    await send({"type": "http.response.body", "body": b""})


PATHS = {"sse": "/sse"}


class McpServers:
    """The running servers: ``url(name)`` of each, and what ``needs_header`` was sent."""

    def __init__(self) -> None:
        self.needs_header = NeedsHeader()
        apps = {
            "plain": plain(),
            "needs_header": self.needs_header,
            "failing": failing(),
            "hanging": hanging(),
            "huge": huge(),
            "sse": sse(),
            "malformed": malformed,
            "redirect": redirect,
        }
        self.served = {name: ServedApp(app, timeout_graceful_shutdown=1) for name, app in apps.items()}

    def url(self, name: str) -> str:
        return f"{self.served[name].base_url}{PATHS.get(name, '/mcp')}"

    @staticmethod
    def header(value: str) -> dict[str, str]:
        return {"X-Api-Key": value}

    @property
    def keys_seen(self) -> list[str]:
        return self.needs_header.keys_seen


@contextlib.contextmanager
def serve_mcp_servers() -> Iterator[McpServers]:
    servers = McpServers()
    started: list[ServedApp] = []
    try:
        for app in servers.served.values():
            started.append(app.start())
        yield servers
    finally:
        for app in started:
            app.stop()
