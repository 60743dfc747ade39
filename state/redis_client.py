"""The redis-py client for the configured Redis topology, and what every Redis caller shares: Lua
scripts by digest, and a hard time bound on each call.

- ``standalone``: ``Redis.from_url``.
- ``cluster``: ``RedisCluster``, seeded by the URL's node; it learns the slot map, follows MOVED
  and ASK, and re-learns the map after a failover or a resharding. A script is routed by its
  KEYS, which must all share one slot: every key of a tenant carries the hash tag ``{<tenant>}``.
- ``sentinel``: the master the sentinels name (``Sentinel.master_for``); a failed or demoted
  master's connections are dropped and the next connection asks the sentinels again, so a
  failover is followed without a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from hashlib import sha1
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from gateway.kernel.errors import ServiceUnavailable
from state.topology import Topology

log = logging.getLogger(__name__)
T = TypeVar("T")

Client = Redis | RedisCluster


class _Cluster(RedisCluster):
    """``RedisCluster`` whose calls wait for the slot map first: redis-py 8.1 resolves a command's
    policy before it initializes, and concurrent first calls (or calls right after a node failed)
    then race on half-made connections and fail with spurious errors."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self._initialize:
            await self.initialize()  # one at a time (its lock), a no-op once done
        return await super().execute_command(*args, **kwargs)


def connect(topology: Topology, timeout: float) -> Client:
    """A client whose every socket operation is bounded by ``timeout`` (``bounded`` bounds the
    whole call, retries and rediscovery included)."""
    # Sockets give up a little before the call's bound, so that redis-py itself sees the timeout
    # and acts on it (drops the connection; in a cluster, re-reads the slot map: a frozen master
    # answers nothing, not even MOVED, so nothing else would make it look elsewhere).
    socket = timeout * 0.75
    common: dict[str, Any] = {"socket_timeout": socket, "socket_connect_timeout": socket}
    if topology.mode == "cluster":
        # Retries (a node down, MOVED after a failover) happen inside the call's time bound; the
        # cluster client re-reads the slot map when a node fails.
        return _Cluster.from_url(topology.url, retry=Retry(NoBackoff(), 2), **common)
    # one immediate retry on a fresh connection covers pooled sockets a Redis restart broke
    common["retry"] = Retry(NoBackoff(), 1)
    if topology.mode == "sentinel":
        opts = parse_url(topology.url)
        ssl = opts.pop("connection_class", None) is not None  # rediss://: SSLConnection
        for name in ("host", "port", "path"):
            opts.pop(name, None)
        sentinel_kwargs = {**common, "password": topology.sentinel_password}
        sentinel_kwargs.pop("retry")
        sentinel = Sentinel(list(topology.sentinels), sentinel_kwargs=sentinel_kwargs)
        master: Redis = sentinel.master_for(topology.sentinel_master, ssl=ssl, **opts, **common)
        return master
    return Redis.from_url(topology.url, **common)


async def ping(client: Client) -> bool:
    """Every master answers (in a cluster, a down master is a third of the tenants down)."""
    if isinstance(client, RedisCluster):
        return bool(await client.ping(target_nodes=RedisCluster.PRIMARIES))
    return bool(await client.ping())


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script, run by its digest. It may touch only keys of one slot, all named in KEYS or
    sharing KEYS[1]'s hash tag (Cluster routes it by KEYS)."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", sha1(self.source.encode()).hexdigest())

    async def run(self, client: Client, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # a restarted or flushed Redis (or a new cluster master) forgot it; EVAL runs it and
            # caches it again
            return await client.eval(self.source, len(keys), *keys, *args)

    async def run_replicated(
        self, client: Redis, keys: Sequence[Any], args: Sequence[Any], replicas: int, wait_ms: int
    ) -> Any:
        """``run``, then WAIT until ``replicas`` replicas have its writes (at most ``wait_ms``), on
        the same connection (WAIT counts the connection's own writes): fewer is a RedisError."""
        for command in ("EVALSHA", "EVAL"):
            pipe = client.pipeline(transaction=False)
            pipe.execute_command(
                command, self.sha if command == "EVALSHA" else self.source, len(keys), *keys, *args
            )
            pipe.execute_command("WAIT", replicas, wait_ms)
            try:
                result, acked = await pipe.execute()
            except NoScriptError:
                continue  # a restarted or flushed Redis forgot it: EVAL runs it and caches it again
            finally:
                await pipe.reset()
            if int(acked) < replicas:
                raise RedisError(f"WAIT: {acked} of {replicas} replicas")
            return result
        raise RedisError("the script could not be run")


async def bounded(awaitable: Awaitable[T], seconds: float, what: str, *, log_errors: bool = True) -> T:
    """Bound the whole operation by ``seconds``; a down Redis is a 503, never a hang and never a
    message naming the server. ``what``: the store or the limiter, in the log line and message."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait((task,), timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        # Give up now; redis-py's own cleanup of a cancelled call can take seconds against a
        # silent server, and the caller must not wait for it.
        task.cancel()
        task.add_done_callback(_consume)
        if log_errors:
            log.warning("%s error: %s", what, "timeout")
        raise ServiceUnavailable(f"{what} unavailable") from None
    try:
        return task.result()
    except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
        if log_errors:
            log.warning("%s error: %s", what, type(exc).__name__)
        raise ServiceUnavailable(f"{what} unavailable") from None


def _consume(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned call's outcome so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()
