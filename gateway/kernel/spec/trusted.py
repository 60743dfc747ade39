"""Engine models built from values the gateway already holds valid, without a second validation.

The Chat Completions and Messages ingresses validate a request with their own wire models, then
map it to the engine's (``CreateResponseBody`` and its items). Validating that mapping again costs
more than everything else the ingress does (pydantic's ``__init__`` of an item with three fields:
about 13,000 instructions; of ``CreateResponseBody``, 25,000 before its fields), and
``model_construct`` is slower still (a Python loop over every field and its aliases). A
:class:`Trusted` maker does what ``model_construct`` does for the models it is used on (no aliases,
no private attributes, no post-init, extras ignored): the instance's ``__dict__`` is the field
defaults updated with the values, and its fields set are the values' names.

This is the one place that knows how pydantic lays out an instance. A maker checks, once, that its
model has none of what the shortcut leaves out and that an instance it builds equals the one
``model_construct`` builds; if not (a pydantic upgrade changed either), it builds with
``model_construct`` instead, and ``tests/kernel/test_trusted.py`` fails on ``fast``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)
_set = object.__setattr__
_IMMUTABLE = (type(None), str, int, float, bool, tuple, frozenset)


class Trusted(Generic[M]):
    """``Trusted(MessageItem).build(role="user", content="hi")``: a ``MessageItem`` of those values,
    unvalidated. ``probe``: values of a valid instance, for the self-check (the required fields' at
    least)."""

    __slots__ = ("_copied", "_defaults", "build", "fast", "model")

    def __init__(self, model: type[M], /, **probe: Any) -> None:
        self.model = model
        self._defaults: dict[str, Any] = {}
        self._copied: list[tuple[str, Any]] = []  # mutable defaults: a copy for each instance
        self.fast = self._layout() and self._agrees(probe)
        self.build: Callable[..., M] = self._builder() if self.fast else model.model_construct

    def _layout(self) -> bool:
        model = self.model
        fields = getattr(model, "__pydantic_fields__", None)
        if (
            not isinstance(fields, dict)
            or model.model_config.get("extra") == "allow"
            or getattr(model, "__pydantic_root_model__", True)
            or getattr(model, "__pydantic_post_init__", True)
            or getattr(model, "__private_attributes__", True)
        ):
            return False
        for name, field in fields.items():
            if field.alias not in (None, name) or field.validation_alias not in (None, name):
                return False
            if field.is_required():
                continue
            if field.default_factory is not None:
                return False
            if isinstance(field.default, _IMMUTABLE):
                self._defaults[name] = field.default
            else:
                self._copied.append((name, field.default))
        return True

    def _agrees(self, probe: dict[str, Any]) -> bool:
        try:
            ours, theirs = self._fast(**probe), self.model.model_construct(**probe)
        except Exception:
            return False
        return (
            ours == theirs
            and ours.__dict__ == theirs.__dict__
            and ours.model_fields_set == theirs.model_fields_set
            and ours.model_extra == theirs.model_extra
        )

    def _fast(self, **values: Any) -> M:
        m = self.model.__new__(self.model)
        state = self._defaults.copy()
        for name, default in self._copied:
            state[name] = copy.deepcopy(default)
        state.update(values)
        _set(m, "__dict__", state)
        _set(m, "__pydantic_fields_set__", set(values))
        _set(m, "__pydantic_extra__", None)
        _set(m, "__pydantic_private__", None)
        return m

    def _builder(self) -> Callable[..., M]:
        """:meth:`_fast` as a closure over what it reads (the hot path of an ingress: each lookup
        saved counts); a model with mutable defaults keeps :meth:`_fast`."""
        if self._copied:
            return self._fast
        model, defaults, new, setattr_ = self.model, self._defaults, self.model.__new__, _set

        def build(**values: Any) -> M:
            m = new(model)
            setattr_(m, "__dict__", {**defaults, **values})
            setattr_(m, "__pydantic_fields_set__", set(values))
            setattr_(m, "__pydantic_extra__", None)
            setattr_(m, "__pydantic_private__", None)
            return m

        return build
