"""Fixtures for the WebSocket tests: a gateway served on loopback with the production ws options."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import ServedApp
from tests.ws.helpers import serve


@pytest.fixture(scope="module")
def gw() -> Iterator[ServedApp]:
    """Model ``mock``, in-process store, no auth, small frame cap (4 KiB) for the oversize tests."""
    with serve({"limits": {"max_ws_frame_bytes": 4096}}) as served:
        yield served
