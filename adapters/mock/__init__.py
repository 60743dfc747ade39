"""The built-in deterministic model ``mock`` (see adapters/mock/adapter.py for its exact behaviour)."""

from adapters.mock.adapter import MockAdapter

__all__ = ["MockAdapter"]
