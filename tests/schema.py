"""Checks against the dated Open Responses OpenAPI document (``../shared/spec``, beside the repository).

``assert_schema(name, obj)`` validates against one component schema; ``assert_event(event)`` against
the streaming event component whose ``type`` is the event's. A missing document, component or event
schema fails the check: it never skips and never passes by default.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC = Path(__file__).resolve().parents[2] / "shared" / "spec" / "openapi-2026-04-24.json"


@cache
def _document() -> dict[str, Any]:
    if not SPEC.exists():
        raise AssertionError(f"the spec document is missing: {SPEC}")
    doc: dict[str, Any] = json.loads(SPEC.read_text())
    return doc


def components() -> dict[str, Any]:
    """The document's component schemas, by name."""
    schemas: dict[str, Any] = _document()["components"]["schemas"]
    return schemas


@cache
def _registry() -> Registry:
    return Registry().with_resource("urn:openresponses", Resource.from_contents(_document(), DRAFT202012))


@cache
def _validator(name: str) -> Draft202012Validator:
    if name not in components():
        raise AssertionError(f"{SPEC.name} has no component schema {name!r}")
    ref = {"$ref": f"urn:openresponses#/components/schemas/{name}"}
    return Draft202012Validator(ref, registry=_registry())


@cache
def event_components() -> dict[str, str]:
    """Streaming event ``type`` → the name of its component schema (``*StreamingEvent``)."""
    found: dict[str, str] = {}
    for name, schema in components().items():
        if not name.endswith("StreamingEvent"):
            continue
        prop = schema.get("properties", {}).get("type", {})
        for value in prop.get("enum") or ([prop["const"]] if "const" in prop else []):
            assert value not in found, f"two schemas for {value!r}: {found[value]}, {name}"
            found[value] = name
    return found


def schema_errors(name: str, obj: Any) -> list[str]:
    errors = sorted(_validator(name).iter_errors(obj), key=lambda e: list(e.absolute_path))
    return [f"{e.json_path}: {e.message[:300]}" for e in errors]


def assert_schema(name: str, obj: Any) -> None:
    """``obj`` is valid against the component schema ``name``."""
    errors = schema_errors(name, obj)
    assert not errors, (name, errors[:5])


def assert_event(event: dict[str, Any]) -> None:
    """``event`` is valid against the streaming event schema of its ``type``."""
    kind = str(event.get("type"))
    name = event_components().get(kind)
    if name is None:
        raise AssertionError(f"{SPEC.name} has no streaming event schema for type {kind!r}")
    assert_schema(name, event)
