"""Fixtures for the store contract suite: one ``store`` fixture per implementation."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from state.base import PendingResponse, ResponseStore, StoredResponse
from state.memory import MemoryStore
from state.redis import RedisStore
from tests import redis_server
from tests.redis_topology import (
    ClusterTopology,
    SentinelTopology,
    Target,
    cluster_target,
    sentinel_target,
    standalone_target,
)

StoreFactory = Callable[..., Awaitable[ResponseStore]]


@pytest.fixture(scope="session")
def redis_url() -> str:
    return redis_server.redis_url()


@pytest.fixture(scope="session")
def key_prefix(redis_url: str) -> Iterator[str]:
    prefix = redis_server.unique_prefix()
    yield prefix
    redis_server.delete_prefix(redis_url, prefix)


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterTopology]:
    """A private 3-master Redis Cluster for the whole session."""
    topo = ClusterTopology().start()
    yield topo
    topo.stop()


@pytest.fixture(scope="session")
def sentinel() -> Iterator[SentinelTopology]:
    """A private master + replica + 3 sentinels for the whole session."""
    topo = SentinelTopology().start()
    yield topo
    topo.stop()


REDIS_MODES = ["redis", "cluster", "sentinel"]  # "redis": standalone (the test ids predate modes)


def target_of(request: pytest.FixtureRequest, mode: str) -> Target:
    """The Redis of ``mode``, started on first use; keys under ``key_prefix`` are deleted at the
    end of the session."""
    if mode == "cluster":
        target = cluster_target(request.getfixturevalue("cluster"))
    elif mode == "sentinel":
        target = sentinel_target(request.getfixturevalue("sentinel"))
    else:
        target = standalone_target(request.getfixturevalue("redis_url"))
    return target


@pytest.fixture(scope="session", params=REDIS_MODES)
def target(request: pytest.FixtureRequest, key_prefix: str) -> Iterator[Target]:
    """Each Redis mode in turn."""
    found = target_of(request, request.param)
    yield found
    found.delete_prefix(key_prefix)


@pytest.fixture(params=["memory", *REDIS_MODES])
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[StoreFactory]:
    """Builds a store of the parametrised kind; every store built is closed afterwards."""
    made: list[ResponseStore] = []
    prefix = request.getfixturevalue("key_prefix")
    target = None if request.param == "memory" else target_of(request, request.param)

    async def factory(ttl_seconds: int = 60, **memory_kw: Any) -> ResponseStore:
        store: ResponseStore
        if target is None:
            store = MemoryStore(ttl_seconds=ttl_seconds, **memory_kw)
        else:
            store = RedisStore(
                target.topology, key_prefix=prefix, ttl_seconds=ttl_seconds, timeout_seconds=2.0
            )
        made.append(store)
        return store

    yield factory
    for store in made:
        await store.aclose()
    if target is not None:
        target.delete_prefix(prefix)


@pytest.fixture
async def store(make_store: StoreFactory) -> ResponseStore:
    return await make_store()


def new_id(prefix: str = "resp") -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def make_response(
    tenant: str = "tenant-a",
    prev: str | None = None,
    *,
    text: str = "hello",
    response_id: str | None = None,
) -> StoredResponse:
    """A response with one input message and one output message, each with a fresh item id."""
    rid = response_id or new_id()
    return StoredResponse(
        id=rid,
        tenant=tenant,
        model="mock-model",
        previous_response_id=prev,
        input_items=[
            {
                "id": new_id("msg"),
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": f"in: {text}"}],
            },
        ],
        resource={
            "id": rid,
            "object": "response",
            "status": "completed",
            "previous_response_id": prev,
            "output": [
                {
                    "id": new_id("msg"),
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": f"out: {text}", "annotations": []}],
                },
            ],
        },
        created_at=1_700_000_000,
        stored_at=1_700_000_000.25,
    )


def pending_of(response: StoredResponse) -> PendingResponse:
    """The write-ahead record of ``response``."""
    return PendingResponse(response.id, response.tenant, response.created_at)


async def put_chain(
    store: ResponseStore, n: int, tenant: str = "tenant-a", text: str = "x"
) -> list[StoredResponse]:
    """Store ``n`` turns, each continuing the previous; returns them oldest first."""
    out: list[StoredResponse] = []
    prev: str | None = None
    for i in range(n):
        r = make_response(tenant, prev, text=f"{text}-{i}")
        await store.put(r)
        out.append(r)
        prev = r.id
    return out
