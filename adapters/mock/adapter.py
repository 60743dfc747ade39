"""A deterministic model that needs no network: for trying the gateway and for tests.

Behaviour, exactly:
1. If the last transcript item is a ``function_call_output``, it answers text:
   ``The tool returned: <output>`` (list outputs: their text parts joined).
2. Otherwise, if tools are offered and ``tool_choice`` permits a call (not ``"none"``, and for
   ``allowed_tools`` not mode ``"none"``), it calls one function: the forced one
   (``{"type":"function"}``), else the first offered tool that ``allowed_tools`` names, else the
   first offered tool (no call when none of the forced or allowed names is offered). Its arguments
   are a JSON object built from the tool's ``parameters`` schema: each property gets its
   ``default``, else the first ``enum`` value, else by type: string ``"example"``, integer ``1``,
   number ``1.5``, boolean ``true``, array ``[]``, object (recursively), null ``null``.
3. Otherwise it answers ``Hello! You said: <last user text>`` (``Hello!`` with no user text).
   With a ``json_schema``/``json_object`` text format it answers a JSON object built like (2).
Text and arguments stream in pieces of ``chunk_chars`` characters (default 4); each piece counts
as one output token. With ``max_output_tokens`` smaller than the piece count it stops there and
finishes with ``length`` (the response becomes ``incomplete``). Usage: input tokens are the
transcript's characters divided by 4 (rounded up), output tokens the pieces sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from adapters.base import UpstreamRequest
from adapters.deltas import Delta, Finish, TextDelta, ToolCallArgsDelta, ToolCallStart, Usage
from gateway.kernel.settings import ProviderSettings
from gateway.kernel.tool_choice import parse_tool_choice


def example_value(schema: Any, depth: int = 0) -> Any:
    """A value that satisfies a (simple) JSON schema."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    if "default" in schema:
        return schema["default"]
    if schema.get("enum"):
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return example_value(schema[key][0], depth + 1)
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "null")
    if t == "string":
        return "example"
    if t == "integer":
        return 1
    if t == "number":
        return 1.5
    if t == "boolean":
        return True
    if t == "array":
        return []
    if t == "null":
        return None
    if t == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {name: example_value(sub, depth + 1) for name, sub in props.items()}
    return "example"


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def _chosen_tool(req: UpstreamRequest) -> dict[str, Any] | None:
    if not req.tools:
        return None
    choice = parse_tool_choice(req.tool_choice)
    if choice.mode == "none":
        return None
    if choice.name is None and choice.allowed is None:
        return req.tools[0]
    permitted = choice.permitted(req.tools)
    return next((t for t in req.tools if t["name"] in permitted), None)


class MockAdapter:
    def __init__(self, settings: ProviderSettings | None = None) -> None:
        self.chunk = settings.chunk_chars if settings else 4

    def applied(self, request: UpstreamRequest) -> dict[str, Any]:
        """The mock samples nothing, but it returns no log probabilities either."""
        return {"top_logprobs": 0}

    def _pieces(self, text: str) -> list[str]:
        n = self.chunk
        return [text[i : i + n] for i in range(0, len(text), n)] or [""]

    async def stream(self, request: UpstreamRequest) -> AsyncIterator[Delta]:
        items = request.items
        input_chars = len(request.instructions or "") + sum(len(orjson.dumps(i)) for i in items)
        input_tokens = -(-input_chars // 4)
        budget = request.max_output_tokens
        last = items[-1] if items else None
        tool = None
        if last is not None and last.get("type") == "function_call_output":
            text = "The tool returned: " + _text_of(last.get("output", ""))
        else:
            tool = _chosen_tool(request)
            fmt = request.text_format or {}
            if tool is None and fmt.get("type") in ("json_schema", "json_object"):
                text = orjson.dumps(example_value(fmt.get("schema") or {"type": "object"})).decode()
            else:
                user = next(
                    (
                        _text_of(i.get("content", ""))
                        for i in reversed(items)
                        if i.get("type") == "message" and i.get("role") == "user"
                    ),
                    "",
                )
                text = f"Hello! You said: {user}" if user else "Hello!"
        sent = 0
        if tool is not None:
            args = orjson.dumps(example_value(tool.get("parameters") or {"type": "object"}) or {}).decode()
            yield ToolCallStart(key=0, name=tool["name"])
            for piece in self._pieces(args):
                if budget is not None and sent >= budget:
                    break
                yield ToolCallArgsDelta(key=0, delta=piece)
                sent += 1
        else:
            for piece in self._pieces(text):
                if budget is not None and sent >= budget:
                    break
                yield TextDelta(piece)
                sent += 1
        yield Usage(input_tokens=input_tokens, output_tokens=sent)
        total = len(self._pieces(args if tool is not None else text))
        if budget is not None and sent < total:
            yield Finish("length")
        else:
            yield Finish("tool_calls" if tool is not None else "stop")

    async def aclose(self) -> None:
        return None
