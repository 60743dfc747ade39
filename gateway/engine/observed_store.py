"""The response store as the engine calls it: every call timed (``Observer.store_op``) and, with
tracing on, a span of its own. A thin wrapper at the engine boundary, so the stores themselves
(``state/*``) know nothing of telemetry.

A call failed when the store could not answer (``ServiceUnavailable`` or an unexpected exception,
or a ``ping`` that says no); a refusal about the request itself (a chain too deep) is an answer.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gateway.engine.telemetry import Observer, Tracer
from gateway.kernel.errors import GatewayError, ServiceUnavailable
from state.base import PendingResponse, ResponseStore, StoredResponse

T = TypeVar("T")


class ObservedStore:
    """A ``ResponseStore`` that reports each call; anything else goes to the store it wraps."""

    def __init__(self, store: ResponseStore, observer: Observer, tracer: Tracer) -> None:
        self.inner = store
        self._observer = observer
        self._tracer = tracer
        self._system = "redis" if type(store).__module__.startswith("state.redis") else "memory"

    async def _call(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        span = self._tracer.child(f"state {op}", {"db.operation.name": op, "db.system.name": self._system})
        start = time.perf_counter()
        failed = True
        try:
            with span:
                result = await call()
            failed = op == "ping" and result is False
            return result
        except ServiceUnavailable:
            raise
        except GatewayError:
            failed = False
            raise
        finally:
            self._observer.store_op(op, time.perf_counter() - start, failed)

    async def reserve(self, pending: PendingResponse, ttl_seconds: float) -> None:
        await self._call("reserve", lambda: self.inner.reserve(pending, ttl_seconds))

    async def release(self, tenant: str, response_id: str) -> None:
        await self._call("release", lambda: self.inner.release(tenant, response_id))

    async def put(self, response: StoredResponse) -> None:
        await self._call("put", lambda: self.inner.put(response))

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        return await self._call("get", lambda: self.inner.get(tenant, response_id))

    async def chain(self, tenant: str, response_id: str, max_depth: int) -> list[StoredResponse] | None:
        return await self._call("chain", lambda: self.inner.chain(tenant, response_id, max_depth))

    async def delete(self, tenant: str, response_id: str) -> bool:
        return await self._call("delete", lambda: self.inner.delete(tenant, response_id))

    async def get_items(self, tenant: str, item_ids: list[str]) -> dict[str, dict[str, Any]]:
        return await self._call("get_items", lambda: self.inner.get_items(tenant, item_ids))

    async def ping(self) -> bool:
        return await self._call("ping", self.inner.ping)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
