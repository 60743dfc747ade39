"""JSON Schema → the OpenAPI-3.0 subset Gemini takes as a ``Schema`` (function parameters and
``responseSchema``); pure.
"""

from __future__ import annotations

from typing import Any

__all__ = ["to_gemini_schema"]

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
_MAX_DEPTH = 16


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
