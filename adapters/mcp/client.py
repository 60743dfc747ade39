"""The MCP client of hosted tools: a request's ``{"type": "mcp"}`` tool resolved to a server the
tenant may reach (policy.py), its tools listed, and calls made, through the official ``mcp`` SDK
(streamable HTTP, or SSE for a URL whose path ends in ``/sse``), over connections pinned to the
checked addresses (pinning.py). One session per listing or call: nothing of one tenant's server
outlives its request.

Failures never escape as the SDK's exceptions: a listing raises ``McpServerError`` (the request
fails before generation); a call returns ``McpCallResult(error=...)`` (a failed ``mcp_call``, and
the model is told). Messages name what went wrong, never the URL, the headers or the server's raw
answer; a tool's own error text (``isError``) is its result, capped like any result."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx2
import orjson
import structlog
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from adapters.mcp.pinning import ResponseTooLarge, pinned_client
from adapters.mcp.policy import Refused, check_url, parse_allow, resolve
from adapters.mcp.types import McpCallResult, McpServer, McpTool
from gateway.kernel.errors import ErrorCode, InvalidRequest, McpServerError
from gateway.kernel.settings import McpSettings, TenantSettings

log = structlog.get_logger("adapters.mcp")


class _TooBig(Exception):
    pass


class McpHost:
    """Every MCP server call of the gateway, bounded by ``McpSettings``."""

    def __init__(self, settings: McpSettings, tenants: Mapping[str, TenantSettings] | None = None) -> None:
        self.settings = settings
        self._default = parse_allow(settings.allow)
        self._tenants = {
            name: parse_allow(t.mcp.allow) for name, t in (tenants or {}).items() if t.mcp.allow is not None
        }

    # -- which server ----------------------------------------------------------------------------
    def resolve(self, tool: Mapping[str, Any], tenant: str, index: int) -> McpServer:
        """The server of one MCP tool param of a request, for ``tenant``: its ``server_url`` on the
        tenant's allow-list, or an operator-declared server named by ``server_label`` alone."""
        label = str(tool["server_label"])
        url = tool.get("server_url")
        if url is None:
            declared = self.settings.servers.get(label)
            if declared is None or (declared.tenants is not None and tenant not in declared.tenants):
                raise InvalidRequest(
                    f"No MCP server is declared with the label '{label}': give its server_url.",
                    param=f"tools[{index}].server_label",
                    code=ErrorCode.INVALID_VALUE,
                )
            headers = {k: v.get_secret_value() for k, v in declared.headers.items()}
            if declared.authorization is not None:
                headers["Authorization"] = f"Bearer {declared.authorization.get_secret_value()}"
            return McpServer(
                label,
                declared.url,
                headers,
                tool.get("server_description") or declared.description,
                sse=_is_sse(declared.url) if declared.transport is None else declared.transport == "sse",
                allow=None,
            )
        allow = self._tenants.get(tenant, self._default)
        try:
            check_url(str(url), allow)
        except Refused as exc:
            raise InvalidRequest(
                f"The MCP server '{label}' cannot be used: {exc}.",
                param=f"tools[{index}].server_url",
                code=ErrorCode.MCP_SERVER_NOT_ALLOWED,
            ) from None
        headers = {str(k): str(v) for k, v in (tool.get("headers") or {}).items()}
        if tool.get("authorization"):
            headers["Authorization"] = f"Bearer {tool['authorization']}"
        return McpServer(
            label,
            str(url),
            headers,
            tool.get("server_description"),
            sse=_is_sse(str(url)),
            allow=allow,
            param=f"tools[{index}].server_url",
        )

    # -- calls -----------------------------------------------------------------------------------
    async def list_tools(self, server: McpServer, *, seconds: float) -> list[McpTool]:
        """The server's tools (at most ``max_tools``); McpServerError when it cannot be listed."""
        try:
            async with asyncio.timeout(seconds):
                async with self._session(server, seconds) as session:
                    listed = await session.list_tools()
        except TimeoutError:
            raise McpServerError(f"The MCP server '{server.label}' did not list its tools in time.") from None
        except Exception as exc:
            reason = _root(exc)
            if isinstance(reason, Refused):  # what its name resolves to, found on connecting
                raise InvalidRequest(
                    f"The MCP server '{server.label}' cannot be used: {reason}.",
                    param=server.param,
                    code=ErrorCode.MCP_SERVER_NOT_ALLOWED,
                ) from None
            log.warning("mcp_list_failed", server_label=server.label, error=_kind(exc))
            raise McpServerError(
                f"The MCP server '{server.label}' could not list its tools ({_kind(exc)})."
            ) from None
        tools = []
        for t in listed.tools[: self.settings.max_tools]:
            annotations = (
                t.annotations.model_dump(by_alias=True, exclude_none=True) if t.annotations else None
            )
            tools.append(
                McpTool(t.name, t.description, dict(t.input_schema or {"type": "object"}), annotations)
            )
        return tools

    async def call_tool(
        self, server: McpServer, name: str, arguments: dict[str, Any], *, seconds: float
    ) -> McpCallResult:
        """The tool's result as text; a failure (the server's, a timeout, a result over
        ``max_result_bytes``) as ``McpCallResult(error=...)``."""
        try:
            async with asyncio.timeout(seconds):
                async with self._session(server, seconds) as session:
                    result = await session.call_tool(name, arguments)
            text = _text(result, self.settings.max_result_bytes)
        except TimeoutError:
            return McpCallResult(None, f"The MCP server did not answer within {seconds:g} s.")
        except Exception as exc:  # the SDK's task groups wrap what failed
            root = _root(exc)
            if isinstance(root, _TooBig | ResponseTooLarge) or "byte limit" in str(root):
                limit = self.settings.max_result_bytes
                return McpCallResult(
                    None, f"The tool's result is larger than this gateway's limit of {limit} bytes."
                )
            if isinstance(root, Refused):
                return McpCallResult(None, f"The MCP server cannot be reached: {root}.")
            log.warning("mcp_call_failed", server_label=server.label, error=_kind(root))
            return McpCallResult(None, f"The call to the MCP server failed ({_kind(root)}).")
        if result.is_error:
            return McpCallResult(None, text or "The tool reported an error.")
        return McpCallResult(text, None)

    async def aclose(self) -> None:
        """Nothing is kept between calls (one session each)."""

    @contextlib.asynccontextmanager
    async def _session(self, server: McpServer, seconds: float) -> AsyncIterator[ClientSession]:
        target = check_url(server.url, server.allow)  # again: a server is a value anyone may build
        addresses = await resolve(target)
        http_timeout = httpx2.Timeout(seconds)
        limit = self.settings.max_result_bytes
        cap = 2 * limit + 65536  # a result's JSON-RPC envelope and escaping, beside the result

        def client(
            headers: dict[str, str] | None = None,
            timeout: httpx2.Timeout | None = None,
            auth: httpx2.Auth | None = None,
        ) -> httpx2.AsyncClient:
            merged = {**server.headers, **(headers or {})}
            return pinned_client(
                target.host, addresses, headers=merged, timeout=timeout or http_timeout, cap=cap, auth=auth
            )

        if server.sse:
            transport = sse_client(
                server.url, timeout=seconds, sse_read_timeout=seconds, httpx_client_factory=client
            )
        else:
            http = client()
            transport = streamable_http_client(server.url, http_client=http, max_sse_event_size=limit + 65536)
        async with contextlib.AsyncExitStack() as stack:
            if not server.sse:
                await stack.enter_async_context(http)
            read, write = await stack.enter_async_context(transport)
            session = await stack.enter_async_context(
                ClientSession(read, write, read_timeout_seconds=seconds)
            )
            await session.initialize()
            yield session


def _is_sse(url: str) -> bool:
    return url.split("?", 1)[0].rstrip("/").endswith("/sse")


def _text(result: Any, limit: int) -> str:
    """A call's content as text: text blocks joined, anything else as JSON; structured content as
    JSON when there is no text. _TooBig past ``limit`` bytes."""
    pieces: list[str] = []
    size = 0
    for block in result.content or ():
        kind = getattr(block, "type", None)
        piece = (
            block.text
            if kind == "text"
            else orjson.dumps(block.model_dump(mode="json", exclude_none=True)).decode()
        )
        size += len(piece.encode())
        if size > limit:
            raise _TooBig
        pieces.append(piece)
    if not pieces and result.structured_content is not None:
        piece = orjson.dumps(result.structured_content).decode()
        if len(piece) > limit:
            raise _TooBig
        pieces.append(piece)
    return "\n".join(pieces)


def _root(exc: BaseException) -> BaseException:
    """The first failure inside the SDK's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _kind(exc: BaseException) -> str:
    """What failed, by kind: never the exception's text (it may quote the URL or the answer)."""
    exc = _root(exc)
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    if isinstance(exc, httpx2.ConnectError | ConnectionError):
        return "connection failed"
    if isinstance(exc, httpx2.TimeoutException):
        return "timed out"
    if isinstance(exc, MCPError):
        return "protocol error"
    if isinstance(exc, ValueError):
        return "malformed answer"
    return type(exc).__name__
