"""Fixtures for the store contract suite: one ``store`` fixture per implementation."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from state.base import ResponseStore, StoredResponse
from state.memory import MemoryStore
from state.redis import RedisStore
from tests import redis_server

StoreFactory = Callable[..., Awaitable[ResponseStore]]


@pytest.fixture(scope="session")
def redis_url() -> str:
    return redis_server.redis_url()


@pytest.fixture(scope="session")
def key_prefix(redis_url: str) -> Iterator[str]:
    prefix = redis_server.unique_prefix()
    yield prefix
    redis_server.delete_prefix(redis_url, prefix)


@pytest.fixture(params=["memory", "redis"])
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[StoreFactory]:
    """Builds a store of the parametrised kind; every store built is closed afterwards."""
    made: list[ResponseStore] = []

    async def factory(ttl_seconds: int = 60, **memory_kw: Any) -> ResponseStore:
        store: ResponseStore
        if request.param == "memory":
            store = MemoryStore(ttl_seconds=ttl_seconds, **memory_kw)
        else:
            url = request.getfixturevalue("redis_url")
            prefix = request.getfixturevalue("key_prefix")
            store = RedisStore(url, key_prefix=prefix, ttl_seconds=ttl_seconds, timeout_seconds=2.0)
        made.append(store)
        return store

    yield factory
    for store in made:
        await store.aclose()


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
