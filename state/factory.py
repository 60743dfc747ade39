"""Build the configured ResponseStore, usage ledger and limiter: Redis (standalone, Cluster or
Sentinel, ``state.redis_mode``) when ``state.redis_url`` is set, else in-process."""

from __future__ import annotations

from gateway.kernel.settings import StateSettings
from state.background import BackgroundLog, MemoryBackgroundLog
from state.base import ResponseStore
from state.keys import MemoryKeyStore, RedisKeyStore, VirtualKeyStore
from state.limits.base import Limiter
from state.limits.memory import MemoryLimiter
from state.memory import MemoryStore
from state.topology import Topology
from state.usage import MemoryLedger, UsageLedger


def create_store(settings: StateSettings) -> ResponseStore:
    if settings.redis_url is not None:
        from state.redis import RedisStore  # imported only when configured: ~6 MB of RSS otherwise

        return RedisStore(
            Topology.from_settings(settings),
            key_prefix=settings.key_prefix,
            ttl_seconds=settings.ttl_seconds,
            timeout_seconds=settings.timeout_seconds,
            max_chain_depth=settings.max_chain_depth,
            wait_replicas=settings.wait_replicas,
        )
    return MemoryStore(
        max_entries=settings.memory_max_entries,
        max_bytes=settings.memory_max_bytes,
        ttl_seconds=settings.ttl_seconds,
        max_chain_depth=settings.max_chain_depth,
    )


def create_ledger(settings: StateSettings, store: ResponseStore) -> UsageLedger:
    """The usage ledger beside ``store`` (made by ``create_store(settings)``): in the same Redis,
    sharing its client, else in process."""
    if settings.redis_url is not None:
        from state.redis import RedisStore
        from state.redis_usage import RedisLedger

        assert isinstance(store, RedisStore)
        return RedisLedger(store)
    return MemoryLedger()


def create_limiter(settings: StateSettings) -> Limiter:
    """The tenancy limits' counters: in Redis (shared by every replica) when ``redis_url`` is set,
    in the same topology as the store."""
    if settings.redis_url is not None:
        from state.limits.redis import RedisLimiter

        return RedisLimiter(
            Topology.from_settings(settings),
            key_prefix=settings.key_prefix,
            timeout_seconds=settings.timeout_seconds,
        )
    return MemoryLimiter()


def create_background_log(settings: StateSettings, store: ResponseStore) -> BackgroundLog:
    """Background responses' event logs and leases beside ``store``: in the same Redis, sharing
    its client, else in process (one process only)."""
    if settings.redis_url is not None:
        from state.redis import RedisStore
        from state.redis_background import RedisBackgroundLog

        assert isinstance(store, RedisStore)
        return RedisBackgroundLog(store)
    return MemoryBackgroundLog()


def create_key_store(settings: StateSettings, store: ResponseStore) -> VirtualKeyStore:
    """Virtual keys' records beside ``store``: in the same Redis, sharing its client, else in
    process."""
    if settings.redis_url is not None:
        from state.redis import RedisStore

        assert isinstance(store, RedisStore)
        return RedisKeyStore(store)
    return MemoryKeyStore()
