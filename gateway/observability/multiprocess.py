"""Serving the metrics, in one process or across several (``prometheus_client``'s multiprocess mode).

With ``PROMETHEUS_MULTIPROC_DIR`` set (``serve --workers``: the supervisor sets it for every worker),
``prometheus_client`` writes every sample to files there and a scrape renders them all through
``MultiProcessCollector``; ``serve_port`` is how the supervisor serves ``metrics.port`` for every
worker. Process metrics cannot be summed across processes, so there each worker also reports its
own (``WorkerSampler``: the ``gateway_worker_*{pid}`` gauges). In one process, ``serve_registry``
is ``metrics.port``'s listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable, Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Gauge, generate_latest, process_collector, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
WORKER_SAMPLE_SECONDS = 10.0


def multiprocess_dir() -> str | None:
    """The multiprocess directory, when this process writes its samples there."""
    return os.environ.get(MULTIPROC_ENV) or None


def multiprocess_registry(path: str | None = None) -> CollectorRegistry:
    """A fresh registry over every process's samples in ``path`` (default: $PROMETHEUS_MULTIPROC_DIR),
    plus the process metrics of the process rendering it."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)
    process_collector.ProcessCollector(registry=registry)
    return registry


def render_multiprocess(path: str | None = None) -> bytes:
    return generate_latest(multiprocess_registry(path))


class WorkerSampler:
    """Multiprocess mode: this worker's own process metrics into ``gauges`` (the ``worker``
    families, by name), now and then every ``WORKER_SAMPLE_SECONDS`` until ``stop``."""

    def __init__(self, gauges: Mapping[str, Gauge]) -> None:
        self.gauges = gauges
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        for name, value in _process_samples():
            gauge = self.gauges.get(name)
            if gauge is not None:
                gauge.set(value)

    def start(self) -> None:
        self.sample()
        self._task = asyncio.create_task(self._sample_forever())

    async def _sample_forever(self) -> None:
        while True:
            await asyncio.sleep(WORKER_SAMPLE_SECONDS)
            self.sample()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def _process_samples() -> list[tuple[str, float]]:
    found: list[tuple[str, float]] = []
    collector = process_collector.ProcessCollector(registry=None)
    names = {
        "process_resident_memory_bytes": "resident_memory_bytes",
        "process_cpu_seconds_total": "cpu_seconds",
        "process_open_fds": "open_fds",
    }
    for family in collector.collect():
        for sample in family.samples:
            if sample.name in names:
                found.append((names[sample.name], sample.value))
    return found


class _FreshMultiprocess(Collector):
    """A collector that builds the multiprocess view afresh on every scrape."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def collect(self) -> Iterable[Metric]:
        return multiprocess_registry(self.path).collect()


def serve_registry(host: str, port: int, registry: CollectorRegistry) -> WSGIServer:
    """/metrics of ``registry`` on a listener of its own (a daemon thread); ``stop_serving`` ends it."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server


def serve_port(host: str, port: int, path: str | None = None) -> WSGIServer:
    """The supervisor's call with ``serve --workers``: serve /metrics on ``host:port`` for every
    worker, rendering the multiprocess directory ``path`` (default: $PROMETHEUS_MULTIPROC_DIR) on
    each scrape. Returns the server; ``stop_serving(server)`` closes it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_FreshMultiprocess(path))
    return serve_registry(host, port, registry)


def stop_serving(server: WSGIServer) -> None:
    server.shutdown()
    server.server_close()
