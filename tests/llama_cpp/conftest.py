"""Fixtures for the tests against llama.cpp's llama-server: one server for the module, the gateway
routed to it on every adapter that speaks its wire formats."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import ServedApp
from tests.llama_cpp.server import LlamaServer, gateway_settings
from tests.ws.helpers import serve


@pytest.fixture(scope="session")
def llama() -> Iterator[LlamaServer]:
    with LlamaServer() as server:
        yield server


@pytest.fixture(scope="session")
def llama_gateway(llama: LlamaServer) -> Iterator[ServedApp]:
    with serve(gateway_settings(llama, compaction={"summary_max_tokens": 48})) as served:
        yield served
