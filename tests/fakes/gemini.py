"""A fake Gemini API upstream (``POST /v1beta/models/{m}:streamGenerateContent?alt=sse``): a real
HTTP server on loopback that streams ``GenerateContentResponse`` chunks as server-sent events with
CRLF line endings, the last one carrying ``finishReason`` and ``usageMetadata``.

    async with FakeGemini.serve() as fake:
        fake.add(Reply.tool_calls([("a", "{}", None), ("b", "{}", None)]))  # parallel: one chunk
        settings = ProviderSettings(kind="gemini", base_url=fake.base_url, api_key="g-test")

Like the real API it refuses a missing ``x-goog-api-key``, roles other than user/model, empty
parts, a ``functionResponse`` turn that does not answer the previous ``functionCall`` turn name
for name, schema keywords outside its OpenAPI subset (``additionalProperties``, ``$schema``...),
OBJECT parameters without properties, and ``allowedFunctionNames`` outside mode ANY.
``python -m tests.fakes.gemini --port 9103`` serves it standalone.
"""

from __future__ import annotations

import os
import re
from typing import Any

import orjson

from tests.fakes.scripted import Ask, Event, Reject, Reply, ScriptedFake, pieces, run_main

__all__ = ["FakeGemini", "Reply"]

_PATH = re.compile(r"^/v1beta/models/([^/:]+):(streamGenerateContent|generateContent)$")
_WHOLE = "|whole"  # route() marks a :generateContent call on the model name it returns
_ERRORS = {
    "rate_limit": (429, "RESOURCE_EXHAUSTED"),
    "overloaded": (503, "UNAVAILABLE"),
    "server": (500, "INTERNAL"),
    "invalid": (400, "INVALID_ARGUMENT"),
    "auth": (403, "PERMISSION_DENIED"),
    "not_found": (404, "NOT_FOUND"),
}
_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY"}
_SCHEMA_KEYS = {
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "maxItems",
    "minItems",
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "example",
    "anyOf",
    "propertyOrdering",
    "default",
    "items",
    "minimum",
    "maximum",
}
_PART_KEYS = {"text", "inlineData", "fileData", "functionCall", "functionResponse"}


def _check_schema(schema: Any, where: str) -> None:
    if not isinstance(schema, dict):
        raise Reject(400, f"Invalid JSON payload received. {where}: expected an object.")
    for key in schema:
        if key not in _SCHEMA_KEYS:
            raise Reject(
                400, f"Invalid JSON payload received. Unknown name \"{key}\" at '{where}': Cannot find field."
            )
    if (
        str(schema.get("type", "")).upper() == "OBJECT"
        and "properties" in schema
        and not schema["properties"]
    ):
        raise Reject(400, f"{where}.properties: should be non-empty for OBJECT type")
    for name, sub in (schema.get("properties") or {}).items():
        _check_schema(sub, f"{where}.properties[{name}]")
    if "items" in schema:
        _check_schema(schema["items"], f"{where}.items")
    for n, sub in enumerate(schema.get("anyOf") or []):
        _check_schema(sub, f"{where}.anyOf[{n}]")


class FakeGemini(ScriptedFake):
    """A fake Gemini API (base URL ends with ``/v1beta``)."""

    base_path = "/v1beta"
    line_ending = "\r\n"
    named_events = False

    def route(self, method: str, path: str, query: str) -> str | None:
        match = _PATH.match(path)
        if method != "POST" or match is None:
            return None
        if match.group(2) == "generateContent":
            return match.group(1) + _WHOLE
        return match.group(1) if "alt=sse" in query.split("&") else None

    def whole(self, reply: Reply, body: dict[str, Any], model: str) -> dict[str, Any] | None:
        """``:generateContent``: the stream's chunks merged into one response (a reply scripted to
        fail or stop mid-stream still streams: the gateway must cope with either)."""
        if not model.endswith(_WHOLE) or reply.stream_error or not reply.terminal or reply.events:
            return None
        if reply.disconnect_after is not None:
            return None
        chunks = [data for _, data in self.render(reply, body, model) if isinstance(data, dict)]
        parts: list[dict[str, Any]] = []
        for chunk in chunks:
            for part in chunk["candidates"][0]["content"]["parts"]:
                last = parts[-1] if parts else None
                if (
                    last is not None
                    and "text" in part
                    and "text" in last
                    and bool(part.get("thought")) == bool(last.get("thought"))
                    and "thoughtSignature" not in part
                ):
                    last["text"] += part["text"]
                elif part.get("text") != "" or "thoughtSignature" in part:
                    parts.append(dict(part))
        final = chunks[-1]
        candidate = {**final["candidates"][0], "content": {"parts": parts, "role": "model"}}
        return {**final, "candidates": [candidate]}

    def check(self, headers: dict[str, str], body: Any) -> None:
        if not headers.get("x-goog-api-key"):
            raise Reject(403, "Method doesn't allow unregistered callers.", "auth")
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            raise Reject(400, "* GenerateContentRequest.contents: contents is not specified")
        calls: list[str] = []
        for n, content in enumerate(contents):
            role = content.get("role")
            if role not in ("user", "model"):
                raise Reject(400, f"Please use a valid role: user, model. (contents[{n}])")
            parts = content.get("parts")
            if not parts:
                raise Reject(
                    400, f"* GenerateContentRequest.contents[{n}].parts: contents.parts must not be empty."
                )
            for m, part in enumerate(parts):
                data = set(part) & _PART_KEYS
                if len(data) != 1:
                    raise Reject(400, f"contents[{n}].parts[{m}]: exactly one data field is required")
                if "text" in part and not isinstance(part["text"], str):
                    raise Reject(400, f"contents[{n}].parts[{m}].text: invalid")
                if "functionCall" in part and role != "model":
                    raise Reject(400, f"contents[{n}]: functionCall parts need role model")
            answers = [p["functionResponse"].get("name") for p in parts if "functionResponse" in p]
            if answers and sorted(answers) != sorted(calls):
                raise Reject(
                    400,
                    "Please ensure that the number of function response parts is equal to the number of "
                    "function call parts of the function call turn.",
                )
            if calls and not answers:
                raise Reject(
                    400,
                    "Please ensure that function call turn comes immediately after a user turn or "
                    "after a function response turn.",
                )
            calls = [p["functionCall"].get("name") for p in parts if "functionCall" in p]
        for tool in body.get("tools") or []:
            for n, decl in enumerate(tool.get("functionDeclarations") or []):
                if "parameters" in decl:
                    _check_schema(decl["parameters"], f"tools[0].function_declarations[{n}].parameters")
        config = (body.get("toolConfig") or {}).get("functionCallingConfig") or {}
        if config.get("allowedFunctionNames") and config.get("mode") != "ANY":
            raise Reject(400, "allowed_function_names can only be set when the mode is ANY.")
        schema = (body.get("generationConfig") or {}).get("responseSchema")
        if schema is not None:
            _check_schema(schema, "generation_config.response_schema")

    def ask(self, body: dict[str, Any]) -> Ask:
        gen = body.get("generationConfig") or {}
        thinking = gen.get("thinkingConfig") or {}
        ask = Ask(max_tokens=gen.get("maxOutputTokens"), reasoning=bool(thinking.get("includeThoughts")))
        contents = body.get("contents") or []
        for content in contents:
            if content.get("role") != "user":
                continue
            texts = [p["text"] for p in content["parts"] if "text" in p]
            if texts:
                ask.user_text = " ".join(texts)
            ask.images += sum(1 for p in content["parts"] if "inlineData" in p or "fileData" in p)
        last = contents[-1] if contents else {}
        responses = [p["functionResponse"] for p in last.get("parts") or [] if "functionResponse" in p]
        if responses:
            response = responses[-1].get("response") or {}
            result = response.get("output", response)
            ask.tool_result = result if isinstance(result, str) else orjson.dumps(result).decode()
        for tool in body.get("tools") or []:
            for decl in tool.get("functionDeclarations") or []:
                ask.tools.append((decl["name"], _lower_types(decl.get("parameters") or {"type": "object"})))
        config = (body.get("toolConfig") or {}).get("functionCallingConfig") or {}
        ask.mode = {"ANY": "required", "NONE": "none"}.get(config.get("mode", "AUTO"), "auto")
        names = config.get("allowedFunctionNames")
        if names:
            ask.forced = names[0]
        return ask

    def error_body(self, status: int, message: str, kind: str) -> dict[str, Any]:
        code, state = _ERRORS.get(kind, (status, "INTERNAL"))
        return {"error": {"code": status or code, "message": message, "status": state}}

    def render(self, reply: Reply, body: dict[str, Any], model: str) -> list[Event]:
        model = model.removesuffix(_WHOLE)
        r = reply
        rid = os.urandom(8).hex()
        out: list[Event] = []
        signature = r.signature

        def usage(final: bool) -> dict[str, Any]:
            prompt = r.usage[0] if r.usage else 0
            meta: dict[str, Any] = {"promptTokenCount": prompt}
            if final and r.usage:
                meta.update(
                    candidatesTokenCount=r.usage[1] - r.reasoning_tokens,
                    totalTokenCount=prompt + r.usage[1],
                )
                if r.reasoning_tokens:
                    meta["thoughtsTokenCount"] = r.reasoning_tokens
                if r.cached:
                    meta["cachedContentTokenCount"] = r.cached
            return meta

        def chunk(parts: list[dict[str, Any]], finish: str | None = None) -> None:
            candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
            if finish:
                candidate["finishReason"] = finish
            out.append(
                (
                    None,
                    {
                        "candidates": [candidate],
                        "usageMetadata": usage(finish is not None),
                        "modelVersion": model,
                        "responseId": rid,
                    },
                )
            )

        for piece in pieces(r.reasoning or "", r.pieces):
            chunk([{"text": piece, "thought": True}])
        texts = pieces(r.answer or "", r.pieces)
        for n, piece in enumerate(texts):
            part: dict[str, Any] = {"text": piece}
            if n == 0 and signature and not r.calls:
                part["thoughtSignature"] = signature
                signature = None
            chunk([part])
        if r.calls:
            parts = []
            for name, args, call_id in r.calls:
                call: dict[str, Any] = {"name": name, "args": orjson.loads(args or "{}")}
                if call_id:
                    call["id"] = call_id
                part = {"functionCall": call}
                if signature:  # only the first call of a parallel set carries it
                    part["thoughtSignature"] = signature
                    signature = None
                parts.append(part)
            chunk(parts)
        if r.stream_error:
            status, state = _ERRORS.get(r.stream_error, (500, "INTERNAL"))
            out.append(
                (None, {"error": {"code": status, "message": "The model is overloaded.", "status": state}})
            )
            return out
        if not r.terminal:
            return out
        final: list[dict[str, Any]] = (
            [{"text": "", "thoughtSignature": signature}] if signature else [{"text": ""}]
        )
        chunk(final, _FINISH.get(r.finish_reason, "STOP"))
        return out


if __name__ == "__main__":
    run_main(FakeGemini, 9103)


def _lower_types(schema: Any) -> Any:
    """A Gemini schema (``"type": "INTEGER"``) as JSON Schema spells it, for the example arguments."""
    if isinstance(schema, dict):
        return {
            k: v.lower() if k == "type" and isinstance(v, str) else _lower_types(v) for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [_lower_types(v) for v in schema]
    return schema
