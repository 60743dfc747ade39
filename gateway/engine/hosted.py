"""Hosted tools: the remote MCP servers a request names, run by the gateway for every provider.

A request's ``{"type": "mcp"}`` tools become, for one turn, a ``HostedTools``: each server resolved
(the tenant's allow-list and the SSRF guard, ``adapters/mcp``), its tools listed once per
conversation (a ``mcp_list_tools`` item in the context is reused; otherwise the server is listed and
the item is the response's first output), and each of its allowed tools offered to the model as an
ordinary function tool named ``<server_label>__<tool>``. The turn runner (turn.py) executes the
model's calls to them between upstream calls, within one response; the builder makes their
``mcp_call`` items and events (or ``mcp_approval_request`` items where approval is required).

The receipts are the context: ``upstream_items`` maps them, in place, to the function calls and
results the model made and saw (``mcp_list_tools`` and unanswered approval requests are nothing to
the model), so a follow-up that sends the output back gives the upstream the same calls and results
as continuing by ``previous_response_id``.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from gateway.engine.telemetry import NOOP_OBSERVER, NOOP_TRACER, Observer, Tracer
from gateway.kernel.errors import ErrorCode, InvalidRequest
from gateway.kernel.ids import new_id
from gateway.kernel.spec.request import McpTool, McpToolFilter

if TYPE_CHECKING:
    from adapters.mcp import McpCallResult, McpHost, McpServer
    from gateway.kernel.settings import McpSettings

Item = dict[str, Any]

MCP_TYPES = frozenset({"mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response"})
DENIED = "The user did not approve this tool call."
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def function_name(label: str, tool: str) -> str:
    """The function name the model sees for ``tool`` of the server ``label``: ``label__tool``, in
    the characters and length (64) every provider takes; a long or odd name is shortened with a
    digest of the original, so the mapping stays one to one and the same on every turn."""
    name = f"{label}__{_UNSAFE.sub('_', tool)}"
    if len(name) <= 64 and _UNSAFE.sub("_", tool) == tool:
        return name
    digest = hashlib.sha256(f"{label}\0{tool}".encode()).hexdigest()[:10]
    return f"{name[:53]}_{digest}"


def has_receipts(items: Iterable[Item]) -> bool:
    for i in items:  # every turn's transcript passes here: a plain loop, no generator
        if i.get("type") in MCP_TYPES:
            return True
    return False


def _result_text(item: Item) -> str:
    """What the model is told a receipt's call returned."""
    output = item.get("output")
    if output is not None:
        return str(output)
    error = item.get("error")
    if isinstance(error, dict):
        message = error.get("message")
        if message is None and "content" in error:
            message = orjson.dumps(error["content"]).decode()
        error = message
    return f"Error: {error or 'the tool call failed.'}"


def upstream_items(items: list[Item]) -> list[Item]:
    """``items`` with the MCP receipts as the model made and saw them: a call and its result as a
    ``function_call`` and its ``function_call_output``, side by side; an approval request, once
    answered, as the call, followed by its answer (the executed ``mcp_call``'s result, or the
    denial). A listing, an unanswered approval request and an approval are nothing to the model."""
    if not has_receipts(items):
        return items
    results: dict[str, str] = {}  # approval request id → what the model is told of it
    for i in items:
        kind = i.get("type")
        if kind == "mcp_call" and i.get("approval_request_id"):
            results[i["approval_request_id"]] = _result_text(i)
        elif kind == "mcp_approval_response" and not i.get("approve"):
            reason = i.get("reason")
            results[i["approval_request_id"]] = f"{DENIED} {reason}" if reason else DENIED
    asked = {i["id"] for i in items if i.get("type") == "mcp_approval_request"}
    out: list[Item] = []
    for item in items:
        kind = item.get("type")
        if kind not in MCP_TYPES:
            out.append(item)
        elif kind == "mcp_approval_request":
            result = results.get(item["id"])
            if result is not None:
                out += (_call(item["id"], item), _output(item["id"], result))
        elif kind == "mcp_call" and item.get("approval_request_id") not in asked:
            out += (_call(item["id"], item), _output(item["id"], _result_text(item)))
    return out


def _call(call_id: str, item: Item) -> Item:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": function_name(item["server_label"], item["name"]),
        "arguments": item.get("arguments") or "{}",
    }


def _output(call_id: str, text: str) -> Item:
    return {"type": "function_call_output", "id": f"fco_{call_id}", "call_id": call_id, "output": text}


def _covers(rule: McpToolFilter | None, name: str, annotations: Mapping[str, Any] | None) -> bool:
    """Whether a filter names the tool (by name, and by ``readOnlyHint`` when it asks)."""
    if rule is None:
        return False
    if rule.tool_names is not None and name not in rule.tool_names:
        return False
    if rule.read_only is not None and bool((annotations or {}).get("readOnlyHint")) != rule.read_only:
        return False
    return rule.tool_names is not None or rule.read_only is not None


def _allowed(tool: McpTool, name: str, annotations: Mapping[str, Any] | None) -> bool:
    allowed = tool.allowed_tools
    if allowed is None:
        return True
    if isinstance(allowed, list):
        return name in allowed
    return _covers(allowed, name, annotations)


def _needs_approval(tool: McpTool, name: str, annotations: Mapping[str, Any] | None) -> bool:
    """OpenAI's rule: approval unless ``never``; a filter's ``never`` list exempts the tools it
    names, its ``always`` list requires it, and a tool neither names needs approval."""
    rule = tool.require_approval
    if rule is None or rule == "always":
        return True
    if rule == "never":
        return False
    assert not isinstance(rule, str)
    if _covers(rule.always, name, annotations):
        return True
    return not _covers(rule.never, name, annotations)


@dataclass(frozen=True, slots=True)
class HostedFunction:
    """One MCP tool as the model sees it (a function named ``function``)."""

    server: McpServer
    tool: str  # its name on the server
    function: str
    approval: bool  # a call to it needs the client's approval first


@dataclass(slots=True)
class HostedTools:
    """One turn's hosted tools, and the receipts made before its first upstream call."""

    host: McpHost
    settings: McpSettings
    functions: dict[str, HostedFunction] = field(default_factory=dict)  # by function name
    tools: list[Item] = field(default_factory=list)  # the function tools offered upstream
    listings: list[Item] = field(default_factory=list)  # mcp_list_tools items made now
    approved: list[Item] = field(default_factory=list)  # mcp_call items of approvals, executed now
    max_calls: int = 0  # hosted calls the response may make (max_tool_calls)
    calls: int = 0  # made so far
    deadline: float = 0.0  # time.monotonic() by which every hosted call of the response is over
    observer: Observer = NOOP_OBSERVER
    tracer: Tracer = NOOP_TRACER

    @property
    def announced(self) -> list[Item]:
        """The items the response starts with: its listings, then its approved calls."""
        return self.listings + self.approved

    def left(self) -> float:
        return max(0.0, min(self.settings.call_timeout_seconds, self.deadline - time.monotonic()))

    async def call(self, function: HostedFunction, arguments: str, item_id: str) -> McpCallResult | str:
        """Execute one call: its result, or the reason it was not made (``max_tool_calls``
        reached, the response's time for hosted calls spent, arguments that are no JSON object)."""
        if self.calls >= self.max_calls:
            return f"max_tool_calls ({self.max_calls}) reached: this call was not made."
        self.calls += 1
        timeout = self.left()
        if timeout <= 0:
            return "The response's time for tool calls ran out: this call was not made."
        try:
            args = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError:
            return "The call's arguments are not valid JSON."
        if not isinstance(args, dict):
            return "The call's arguments are not a JSON object."
        label = function.server.label
        attrs = {
            "gen_ai.tool.name": function.tool,
            "gateway.mcp.server_label": label,
            "gen_ai.tool.call.id": item_id,
        }
        start = time.perf_counter()
        outcome = "cancelled"
        with self.tracer.child(f"mcp.call {label}", attrs, client=True) as span:
            try:
                result = await self.host.call_tool(function.server, function.tool, args, seconds=timeout)
                outcome = "ok" if result.error is None else "error"
                span.set("gateway.mcp.status", "completed" if result.error is None else "failed")
                if result.error is not None:
                    span.fail("mcp_call_failed")
                return result
            finally:
                self.observer.mcp_call(label, outcome, time.perf_counter() - start)


def receipt(result: McpCallResult | str) -> Item:
    """The fields of an executed (or refused) call's ``mcp_call`` item: output, or error."""
    if isinstance(result, str):
        return {"output": None, "error": _protocol_error(result), "status": "failed"}
    if result.error is not None:
        return {"output": None, "error": _protocol_error(result.error), "status": "failed"}
    return {"output": result.output, "error": None, "status": "completed"}


def _protocol_error(message: str) -> dict[str, Any]:
    return {"type": "mcp_protocol_error", "code": -32000, "message": message}


async def plan(
    tools: list[McpTool],
    context: list[Item],
    new_items: list[Item],
    *,
    tenant: str,
    host: McpHost | None,
    settings: McpSettings,
    max_tool_calls: int | None,
    client_functions: Iterable[str],
    indexes: list[int],
    observer: Observer = NOOP_OBSERVER,
    tracer: Tracer = NOOP_TRACER,
) -> HostedTools:
    """The hosted tools of a request whose ``tools`` name MCP servers (``indexes``: their places
    in ``tools[]``, for errors): servers resolved, tools listed unless ``context`` lists them,
    and the approvals among ``new_items`` executed. A refusal is a 400 naming the field; a server
    that cannot be listed fails the request (``McpUnavailable``) before anything is generated."""
    if host is None:
        raise InvalidRequest(
            "MCP tools are not enabled on this gateway.", param="tools", code=ErrorCode.INVALID_VALUE
        )
    if len(tools) > settings.max_servers:
        raise InvalidRequest(
            f"At most {settings.max_servers} MCP servers may be used in one request.",
            param="tools",
            code=ErrorCode.INVALID_VALUE,
        )
    hosted = HostedTools(
        host=host,
        settings=settings,
        max_calls=max_tool_calls or settings.max_tool_calls,
        deadline=time.monotonic() + settings.response_timeout_seconds,
        observer=observer,
        tracer=tracer,
    )
    reserved = set(client_functions)
    listed = _listings(context)
    labels: set[str] = set()
    servers: dict[str, tuple[McpServer, McpTool]] = {}
    for tool, index in zip(tools, indexes, strict=True):
        if tool.connector_id is not None:
            raise InvalidRequest(
                "Service connectors (connector_id) are not available: give the server's server_url.",
                param=f"tools[{index}].connector_id",
                code=ErrorCode.INVALID_VALUE,
            )
        if tool.server_label in labels:
            raise InvalidRequest(
                f"Two MCP tools have the server_label '{tool.server_label}'.",
                param=f"tools[{index}].server_label",
                code=ErrorCode.INVALID_VALUE,
            )
        labels.add(tool.server_label)
        server = host.resolve(tool.model_dump(exclude_none=True), tenant, index)
        servers[tool.server_label] = (server, tool)
    listings = await asyncio.gather(
        *(_listing(hosted, server, listed.get(label)) for label, (server, _) in servers.items())
    )
    for (label, (server, tool)), (listing, made) in zip(servers.items(), listings, strict=True):
        if made:
            hosted.listings.append(listing)
        for entry in listing["tools"]:
            name, annotations = entry["name"], entry.get("annotations")
            if not _allowed(tool, name, annotations):
                continue
            fn = function_name(label, name)
            if fn in reserved:
                raise InvalidRequest(
                    f"The function '{fn}' clashes with the tool '{name}' of the MCP server '{label}'.",
                    param="tools",
                    code=ErrorCode.INVALID_VALUE,
                )
            reserved.add(fn)
            hosted.functions[fn] = HostedFunction(server, name, fn, _needs_approval(tool, name, annotations))
            hosted.tools.append(
                {
                    "type": "function",
                    "name": fn,
                    "description": entry.get("description") or f"{name} (MCP server {label})",
                    "parameters": entry.get("input_schema") or {"type": "object", "properties": {}},
                    "strict": False,
                }
            )
    await _approvals(hosted, context, new_items)
    return hosted


def _listings(context: list[Item]) -> dict[str, Item]:
    """The latest successful listing of each server label in the context."""
    found: dict[str, Item] = {}
    for item in context:
        if item.get("type") == "mcp_list_tools" and not item.get("error"):
            found[item["server_label"]] = item
    return found


async def _listing(hosted: HostedTools, server: McpServer, known: Item | None) -> tuple[Item, bool]:
    """The server's listing: the context's (False), or a new one (True)."""
    if known is not None:
        return known, False
    start = time.perf_counter()
    outcome = "error"
    attrs = {"gateway.mcp.server_label": server.label, "gen_ai.operation.name": "mcp.list_tools"}
    with hosted.tracer.child(f"mcp.list_tools {server.label}", attrs, client=True) as span:
        try:
            tools = await hosted.host.list_tools(server, seconds=hosted.settings.call_timeout_seconds)
            outcome = "ok"
        except BaseException as exc:
            span.fail(getattr(exc, "code", None) or "error")
            raise
        finally:
            hosted.observer.mcp_call(server.label, outcome, time.perf_counter() - start, list_tools=True)
    entries: list[Item] = []
    for t in tools:
        entry: Item = {"name": t.name, "input_schema": t.input_schema, "description": t.description}
        if t.annotations is not None:
            entry["annotations"] = t.annotations
        entries.append(entry)
    item = {
        "type": "mcp_list_tools",
        "id": new_id("mcpl"),
        "server_label": server.label,
        "tools": entries,
        "error": None,
    }
    return item, True


async def _approvals(hosted: HostedTools, context: list[Item], new_items: list[Item]) -> None:
    """Execute the calls this request approves (its ``mcp_approval_response`` items that approve
    a request of the context not yet executed); a denial needs nothing (``upstream_items``)."""
    requests = {i["id"]: i for i in context if i.get("type") == "mcp_approval_request"}
    done = {i.get("approval_request_id") for i in context if i.get("type") == "mcp_call"}
    for index, item in enumerate(new_items):
        if item.get("type") != "mcp_approval_response":
            continue
        rid = item["approval_request_id"]
        request = requests.get(rid)
        if request is None:
            raise InvalidRequest(
                f"No MCP approval request found with id '{rid}'.",
                param=f"input[{index}].approval_request_id",
                code=ErrorCode.INVALID_VALUE,
            )
        if rid in done or not item.get("approve"):
            continue
        done.add(rid)
        fn = hosted.functions.get(function_name(request["server_label"], request["name"]))
        if fn is None:
            raise InvalidRequest(
                f"The approved call is to the tool '{request['name']}' of the MCP server "
                f"'{request['server_label']}', which this request's tools do not offer.",
                param=f"input[{index}].approval_request_id",
                code=ErrorCode.INVALID_VALUE,
            )
        call_id = new_id("mcp")
        result = await hosted.call(fn, request["arguments"], call_id)
        hosted.approved.append(
            {
                "type": "mcp_call",
                "id": call_id,
                "server_label": request["server_label"],
                "name": request["name"],
                "arguments": request["arguments"],
                "approval_request_id": rid,
                **receipt(result),
            }
        )
