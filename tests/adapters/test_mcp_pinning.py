"""adapters/mcp/pinning.py relies on httpx2's internals (its transport's httpcore2 pool and the
pool's ``network_backend``): this fails loudly when an upgrade moves them. And a pinned client
connects where the SSRF check said, whatever the host name resolves to, never elsewhere."""

from __future__ import annotations

import httpx2
import pytest

from adapters.mcp.pinning import pinned_client, supported
from tests.fakes.mcp_servers import serve_mcp_servers


def test_the_internals_pinning_replaces_are_where_it_expects_them() -> None:
    assert supported(), "httpx2/httpcore2 changed: adapters/mcp/pinning.py must be revisited"


async def test_a_pinned_client_connects_to_the_checked_address_not_the_names() -> None:
    with serve_mcp_servers() as servers:
        port = servers.served["malformed"].port
        # a name that resolves nowhere: the connection goes to the pinned loopback address anyway
        async with pinned_client(
            "mcp.invalid", ["127.0.0.1"], headers=None, timeout=httpx2.Timeout(5), cap=1 << 16
        ) as client:
            r = await client.post(f"http://mcp.invalid:{port}/mcp", content=b"{}")
            assert r.status_code == 200
            with pytest.raises(httpx2.ConnectError):  # another host is never connected to
                await client.get(f"http://127.0.0.1:{port}/")


async def test_a_response_past_the_cap_is_cut_off() -> None:
    with serve_mcp_servers() as servers:
        port = servers.served["malformed"].port
        async with pinned_client(
            "127.0.0.1", ["127.0.0.1"], headers=None, timeout=httpx2.Timeout(5), cap=8
        ) as client:
            with pytest.raises(Exception, match="exceeded 8 bytes"):
                await client.post(f"http://127.0.0.1:{port}/mcp", content=b"{}")
