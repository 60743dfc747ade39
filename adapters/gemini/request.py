"""Pure request translation: a normalized ``UpstreamRequest`` → a Gemini ``generateContent`` body.

Gemini has no call ids, so ``functionResponse`` parts are named after the transcript's
``function_call`` with the same ``call_id``. A reasoning item's ``encrypted_content`` is a
``thoughtSignature``; it goes back on the next part of the same model turn (the function call it
came with), as the API requires for function calling with thinking models.
"""

from __future__ import annotations

from typing import Any

import orjson

from adapters.base import UpstreamRequest
from adapters.transcript import (
    arguments_object,
    assistant_texts,
    function_tools,
    parse_data_url,
    parse_tool_choice,
    unsupported_content,
)
from gateway.kernel.errors import UpstreamRejected

__all__ = ["build_body", "build_contents", "build_tools", "model_path", "to_gemini_schema"]

_EFFORT_BUDGET = {"none": 0, "minimal": 0, "low": 1024, "medium": 8192, "high": 24576, "xhigh": 32768}
_KEEP = frozenset(
    {
        "description",
        "title",
        "nullable",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
        "minProperties",
        "maxProperties",
        "default",
        "example",
        "propertyOrdering",
    }
)
_FORMATS = {"STRING": {"enum", "date-time"}, "INTEGER": {"int32", "int64"}, "NUMBER": {"float", "double"}}
_MIME_BY_EXT = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "webp": "image/webp",
    "gif": "image/gif",
    "heic": "image/heic",
    "pdf": "application/pdf",
    "txt": "text/plain",
}
_MAX_DEPTH = 16


def model_path(model: str) -> str:
    """``models/{model}`` (a name already carrying a collection, e.g. ``tunedModels/x``, is kept)."""
    return model if "/" in model else f"models/{model}"


def build_body(req: UpstreamRequest) -> dict[str, Any]:
    """The ``:streamGenerateContent`` body for ``req``."""
    system, contents = build_contents(req)
    body: dict[str, Any] = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": [{"text": system}]}
    tools, config = build_tools(req)
    if tools:
        body["tools"] = tools
        if config is not None:
            body["toolConfig"] = {"functionCallingConfig": config}
    generation = _generation_config(req)
    if generation:
        body["generationConfig"] = generation
    return body


def _generation_config(req: UpstreamRequest) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if req.max_output_tokens is not None:
        out["maxOutputTokens"] = req.max_output_tokens
    for ours, theirs in (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ):
        value = getattr(req, ours)
        if value is not None:
            out[theirs] = value
    fmt = req.text_format or {}
    if fmt.get("type") in ("json_object", "json_schema"):
        out["responseMimeType"] = "application/json"
        if fmt.get("type") == "json_schema" and fmt.get("schema"):
            out["responseSchema"] = to_gemini_schema(fmt["schema"])
    reasoning = req.reasoning or {}
    thinking: dict[str, Any] = {}
    if reasoning.get("effort") in _EFFORT_BUDGET:
        thinking["thinkingBudget"] = _EFFORT_BUDGET[reasoning["effort"]]
    if reasoning.get("summary"):
        thinking["includeThoughts"] = True
    if thinking:
        out["thinkingConfig"] = thinking
    if req.top_logprobs is not None or "message.output_text.logprobs" in req.include:
        out["responseLogprobs"] = True
        if req.top_logprobs:
            out["logprobs"] = req.top_logprobs
    return out


# -- contents ---------------------------------------------------------------------------------
class _Contents:
    """Accumulates ``contents`` with merged same-role turns and pending thought signatures."""

    def __init__(self) -> None:
        self.turns: list[dict[str, Any]] = []
        self.signature: str | None = None  # from a reasoning item, for the next model part

    def add(self, role: str, parts: list[dict[str, Any]]) -> None:
        if not parts:
            return
        if role == "model" and self.signature is not None:
            parts[0]["thoughtSignature"] = self.signature
            self.signature = None
        elif role != "model":
            self.flush_signature()
        if self.turns and self.turns[-1]["role"] == role:
            self.turns[-1]["parts"].extend(parts)
        else:
            self.turns.append({"role": role, "parts": parts})

    def flush_signature(self) -> None:
        """A signature with no later model part goes on the model turn's last part."""
        if self.signature is not None and self.turns and self.turns[-1]["role"] == "model":
            self.turns[-1]["parts"][-1].setdefault("thoughtSignature", self.signature)
        self.signature = None


def build_contents(req: UpstreamRequest) -> tuple[str, list[dict[str, Any]]]:
    """(system instruction text, ``contents`` with roles user/model)."""
    system: list[str] = [req.instructions] if req.instructions else []
    names = {i["call_id"]: i["name"] for i in req.items if i.get("type") == "function_call"}
    acc = _Contents()
    for item in req.items:
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role", "user")
            if role in ("system", "developer"):
                text = "\n".join(p.get("text") or "" for p in item.get("content") or [])
                if text:
                    system.append(text)
            elif role == "assistant":
                acc.add("model", _model_parts(item.get("content")))
            else:
                acc.add("user", _user_parts(item.get("content")))
        elif kind == "function_call":
            call = {"name": item["name"], "args": arguments_object(item.get("arguments"))}
            acc.add("model", [{"functionCall": call}])
        elif kind == "function_call_output":
            acc.add("user", _function_response(item, names.get(item["call_id"], item["call_id"])))
        elif kind == "reasoning" and item.get("encrypted_content"):
            acc.flush_signature()
            acc.signature = item["encrypted_content"]
    acc.flush_signature()
    return "\n\n".join(system), acc.turns


def _model_parts(content: Any) -> list[dict[str, Any]]:
    return [{"text": text} for text in assistant_texts(content)]


def _user_parts(content: Any) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for part in content or []:
        kind = part.get("type")
        if kind in ("input_text", "text", "output_text"):
            if part.get("text"):
                parts.append({"text": part["text"]})
        elif kind == "input_image":
            parts.append(_media(part.get("image_url"), None, "image/jpeg"))
        elif kind == "input_file":
            data = part.get("file_data")
            if data and not data.startswith("data:"):
                mime = _mime_of(part.get("filename"), "application/pdf")
                parts.append({"inlineData": {"mimeType": mime, "data": data}})
            else:
                parts.append(_media(data or part.get("file_url"), part.get("filename"), "application/pdf"))
        elif kind == "input_video":
            parts.append(_media(part.get("video_url"), None, "video/mp4"))
        else:
            raise unsupported_content(kind)
    return parts


def _media(url: str | None, filename: str | None, default_mime: str) -> dict[str, Any]:
    if url and url.startswith("data:"):
        mime, data = parse_data_url(url, default_mime)
        return {"inlineData": {"mimeType": mime, "data": data}}
    if url and url.startswith(("http://", "https://", "gs://")):
        mime = _mime_of(filename or url.split("?")[0], default_mime)
        return {"fileData": {"mimeType": mime, "fileUri": url}}
    raise UpstreamRejected(
        "This model's provider needs media as a URL or a data URL.", code="unsupported_content"
    )


def _mime_of(name: str | None, default: str) -> str:
    ext = (name or "").rsplit(".", 1)[-1].lower() if name and "." in name else ""
    return _MIME_BY_EXT.get(ext, default)


def _function_response(item: dict[str, Any], name: str) -> list[dict[str, Any]]:
    output = item.get("output")
    media: list[dict[str, Any]] = []
    if output is None or isinstance(output, str):
        text = output or ""
    else:
        text = "\n".join(p.get("text") or "" for p in output if p.get("type") in ("input_text", "text"))
        media = _user_parts([p for p in output if p.get("type") not in ("input_text", "text")])
    try:
        parsed = orjson.loads(text) if text else None
    except orjson.JSONDecodeError:
        parsed = None
    # The API wants an object; "output" is its documented key for a plain result.
    response = parsed if isinstance(parsed, dict) else {"output": text}
    return [{"functionResponse": {"name": name, "response": response}}, *media]


# -- tools ------------------------------------------------------------------------------------
def build_tools(req: UpstreamRequest) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Gemini ``tools`` and ``functionCallingConfig`` (None: omit, i.e. AUTO)."""
    tc = parse_tool_choice(req.tool_choice)
    declarations = []
    for tool in function_tools(req.tools, tc.allowed):
        decl: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            decl["description"] = tool["description"]
        params = to_gemini_schema(tool.get("parameters") or {})
        if params.get("properties"):  # the API refuses an OBJECT with no properties
            decl["parameters"] = params
        declarations.append(decl)
    if not declarations:
        return [], None
    tools = [{"functionDeclarations": declarations}]
    if tc.mode == "none":
        return tools, {"mode": "NONE"}
    if tc.mode == "required":
        config: dict[str, Any] = {"mode": "ANY"}
        if tc.name is not None:
            config["allowedFunctionNames"] = [tc.name]
        return tools, config
    return tools, None


def to_gemini_schema(schema: Any, root: dict[str, Any] | None = None, depth: int = 0) -> dict[str, Any]:
    """A JSON schema → Gemini's OpenAPI-subset ``Schema``.

    ``$ref`` to local ``$defs`` is inlined (bounded depth), type lists become ``nullable`` or
    ``anyOf``, ``const`` becomes a one-value enum, non-string enums and unsupported keywords
    (``additionalProperties``, ``$schema``, ``strict``, ``examples``...) are dropped.
    """
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return {}
    root = schema if root is None else root
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = _resolve(ref, root)
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return to_gemini_schema(merged, root, depth + 1)
    out: dict[str, Any] = {k: v for k, v in schema.items() if k in _KEEP}
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            variants = [v for v in schema[key] if not (isinstance(v, dict) and v.get("type") == "null")]
            if len(variants) < len(schema[key]):
                out["nullable"] = True
            converted = [to_gemini_schema(v, root, depth + 1) for v in variants]
            if len(converted) == 1:
                out.update(converted[0])
            elif converted:
                out["anyOf"] = converted
    if isinstance(schema.get("allOf"), list) and schema["allOf"]:
        for sub in schema["allOf"]:
            for k, v in to_gemini_schema(sub, root, depth + 1).items():
                out.setdefault(k, v)
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) < len(kind):
            out["nullable"] = True
        if len(kinds) == 1:
            kind = kinds[0]
        elif kinds:
            out["anyOf"] = [to_gemini_schema({**schema, "type": k}, root, depth + 1) for k in kinds]
            kind = None
        else:
            kind = "null"
    if "const" in schema and isinstance(schema["const"], str):
        out["enum"] = [schema["const"]]
        kind = kind or "string"
    elif isinstance(schema.get("enum"), list):
        values = [v for v in schema["enum"] if v is not None]
        if values and all(isinstance(v, str) for v in values):
            out["enum"] = values
            kind = kind or "string"
        if len(values) < len(schema["enum"]):
            out["nullable"] = True
    if kind is None and "properties" in schema:
        kind = "object"
    if isinstance(kind, str):
        out["type"] = kind.upper()
        fmt = schema.get("format")
        if isinstance(fmt, str) and fmt in _FORMATS.get(out["type"], ()):
            out["format"] = fmt
    if isinstance(schema.get("properties"), dict) and schema["properties"]:
        out["properties"] = {
            name: to_gemini_schema(sub, root, depth + 1) for name, sub in schema["properties"].items()
        }
        required = [r for r in schema.get("required") or [] if r in out["properties"]]
        if required:
            out["required"] = required
    if isinstance(schema.get("items"), dict):
        out["items"] = to_gemini_schema(schema["items"], root, depth + 1)
    return out


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    if not ref.startswith("#/"):
        return {}
    node: Any = root
    for key in ref[2:].split("/"):
        if not isinstance(node, dict):
            return {}
        node = node.get(key.replace("~1", "/").replace("~0", "~"))
    return node if isinstance(node, dict) else {}
