"""Fixtures for the WebSocket tests: a gateway served on loopback with the production ws options."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest

from gateway.cli import uvicorn_ws_options
from gateway.kernel.settings import Settings
from tests.harness import ServedApp, serve_gateway


def serve(settings: dict[str, Any] | None = None) -> AbstractContextManager[ServedApp]:
    """``serve_gateway`` with the uvicorn WebSocket options the CLI uses."""
    s = Settings(**(settings or {}))
    return serve_gateway(s, **uvicorn_ws_options(s))


@pytest.fixture(scope="module")
def gw() -> Iterator[ServedApp]:
    """Model ``mock``, in-process store, no auth, small frame cap (4 KiB) for the oversize tests."""
    with serve({"limits": {"max_ws_frame_bytes": 4096}}) as served:
        yield served
