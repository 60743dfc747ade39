"""Shared fixtures: a gateway served on loopback with the embedded defaults (model ``mock``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import ServedApp, serve_gateway


@pytest.fixture(scope="session")
def gateway() -> Iterator[ServedApp]:
    """The gateway with no config at all: model ``mock``, in-process state, no auth."""
    with serve_gateway() as served:
        yield served
