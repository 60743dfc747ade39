"""Checks against the Open Responses 2026-04-24 schemas, as the test extra installs them.

The schemas come from ``openresponses-types`` (mozilla.ai, Apache-2.0): pydantic models generated
from the dated OpenAPI document. It ships no copy of the document, so the JSON Schema of every model
(and enum) is generated once by pydantic into one document whose ``$defs`` stand for the
OpenAPI components, and objects are validated against it with ``jsonschema`` (Draft 2020-12) as
they would be against the OpenAPI document: the JSON as the client reads it, no coercion
(``"0"`` is no integer), every required field present, every enum value one of the listed.

``assert_schema(name, obj)`` validates against one component schema; ``assert_event(event)`` against
the streaming event component whose ``type`` is the event's. A missing component or event schema
fails the check: it never skips and never passes by default. (Three unions of the document,
``ItemField``, ``ItemParam`` and ``TextFormatParam``, were inlined by the generator where they are
used: they are checked there, and asking for one by name fails.)
"""

from __future__ import annotations

import inspect
from enum import Enum
from functools import cache
from typing import Any, cast

import openresponses_types
from jsonschema import Draft202012Validator
from openresponses_types import types as generated
from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import GenerateJsonSchema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC_VERSION = "2026-04-24"
SOURCE = f"openresponses-types {openresponses_types.__version__}"
URN = "urn:openresponses"

# Where the generator named a model otherwise than its component: the component ``Error`` (a
# response's ``error``) is ``Error1``, the name ``Error`` went to the WebSocket error's inline payload.
RENAMED = {"Error": "Error1"}

# What the server sends (with every ``*StreamingEvent``), and every schema these reach.
SERVER_SENT = ("ResponseResource", "CompactResource", "ErrorPayload", "WebSocketErrorEvent")
# The generator makes every optional field nullable (``X | None = None``), which the document does not:
# of the optional fields in what the server sends, it lets only the WebSocket error's ``param`` be
# null. So there the null is dropped, and ``"logprobs": null`` on an output text part still fails.
# (Request-side schemas keep it: there the document makes most optional fields nullable.)
NULLABLE_OPTIONAL = {("Error", "param")}  # (model, field): the model ``Error`` is that payload


@cache
def _generated() -> dict[str, type[BaseModel] | type[Enum]]:
    """The generated models and enums, by their names (not pydantic's parametrized ``RootModel[...]``)."""
    if openresponses_types.__spec_version__ != SPEC_VERSION:
        found = openresponses_types.__spec_version__
        raise AssertionError(f"{SOURCE} holds the {found} spec, not the {SPEC_VERSION} one")
    return {
        name: obj
        for name, obj in vars(generated).items()
        if name.isidentifier()
        and inspect.isclass(obj)
        and issubclass(obj, BaseModel | Enum)
        and obj.__module__ == generated.__name__
        and obj.__name__ == name
    }


@cache
def _document() -> dict[str, Any]:
    """The JSON Schema of every model and enum in one document, each under ``$defs`` by its name."""
    generator = GenerateJsonSchema(ref_template=URN + "#/$defs/{model}")
    refs, generated = generator.generate_definitions(
        [(name, "validation", TypeAdapter(obj).core_schema) for name, obj in _generated().items()]
    )
    defs = cast(dict[str, dict[str, Any]], generated)  # its keys are DefsRef, a NewType of str
    for (name, _), ref in refs.items():  # each definition is under its own name
        assert ref == {"$ref": f"{URN}#/$defs/{name}"}, (name, ref)
    roots = [*SERVER_SENT, *(name for name in defs if name.endswith("StreamingEvent"))]
    for name in _reached(defs, roots):
        _drop_optional_nulls(name, defs[name])
    return {"$defs": defs}


def _reached(defs: dict[str, Any], roots: list[str]) -> set[str]:
    """The definitions ``roots`` name or reach by ``$ref``."""
    reached: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += [ref.rsplit("/", 1)[1] for ref in _refs(defs[name])]
    return reached


def _refs(schema: Any) -> list[str]:
    if isinstance(schema, dict):
        return [schema["$ref"]] if "$ref" in schema else [r for v in schema.values() for r in _refs(v)]
    if isinstance(schema, list):
        return [r for v in schema for r in _refs(v)]
    return []


def _drop_optional_nulls(name: str, schema: dict[str, Any]) -> None:
    required = set(schema.get("required", ()))
    for field, prop in schema.get("properties", {}).items():
        if field in required or (name, field) in NULLABLE_OPTIONAL or "anyOf" not in prop:
            continue
        kept = [branch for branch in prop["anyOf"] if branch != {"type": "null"}]
        del prop["anyOf"]
        prop.update(kept[0] if len(kept) == 1 else {"anyOf": kept})


def components() -> dict[str, Any]:
    """The component schemas, by name (``Error`` is the component, as in the OpenAPI document)."""
    defs: dict[str, Any] = _document()["$defs"]
    return {**defs, **{component: defs[model] for component, model in RENAMED.items()}}


@cache
def _registry() -> Registry:
    return Registry().with_resource(URN, Resource.from_contents(_document(), DRAFT202012))


@cache
def _validator(name: str) -> Draft202012Validator:
    if name not in components():
        raise AssertionError(f"{SOURCE} has no component schema {name!r}")
    ref = {"$ref": f"{URN}#/$defs/{RENAMED.get(name, name)}"}
    return Draft202012Validator(ref, registry=_registry())


@cache
def event_components() -> dict[str, str]:
    """Streaming event ``type`` → the name of its component schema (``*StreamingEvent``)."""
    found: dict[str, str] = {}
    for name, model in _generated().items():
        if not (name.endswith("StreamingEvent") and issubclass(model, BaseModel)):
            continue
        kind = model.model_fields["type"].annotation
        assert inspect.isclass(kind) and issubclass(kind, Enum), (name, kind)
        for member in kind:
            value = member.value
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
        raise AssertionError(f"{SOURCE} has no streaming event schema for type {kind!r}")
    assert_schema(name, event)
