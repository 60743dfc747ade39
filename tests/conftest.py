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


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build llama-server and fetch its model (tests/llama_cpp/provision.py) before any test runs, when
    a test of tests/llama_cpp/ was collected: outside every test's timeout, once per cache (~12 minutes
    on 2 cores the first time, nothing after)."""
    if any("llama_cpp" in item.nodeid.split("/") for item in session.items):
        from tests.llama_cpp import provision

        provision.ensure_server()
        provision.ensure_model()
