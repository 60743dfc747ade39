"""Prometheus metrics through ``prometheus_client``: the families (README "Metrics"), their bounded
labels, the engine's ``Observer``, and rendering, in one process or across several.

Single process: the families live in the app's own ``CollectorRegistry`` (several apps may share a
process, as the tests do), with the default process, platform and GC collectors. With
``PROMETHEUS_MULTIPROC_DIR`` set (``serve --workers``: the supervisor sets it for every worker),
``prometheus_client`` writes every sample to files there and a scrape renders them all through
``MultiProcessCollector``; ``serve_port`` is how the supervisor serves ``metrics.port`` for every
worker. Process metrics cannot be summed across processes, so there each worker also reports its
own as ``gateway_worker_*{pid}`` gauges.

Label values are bounded: a tenant is one the config names (else ``_other``), a model one it routes
(pass-through models up to ``metrics.max_pass_through_models``; anything not routed is ``_other``),
everything else a closed set with ``_other`` for anything unexpected; ``-`` means none (a tenant,
provider or error code not known: refused before it was).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    gc_collector,
    generate_latest,
    platform_collector,
    process_collector,
    start_http_server,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from gateway.engine.routing import Deployment, Route
from gateway.engine.telemetry import Observer
from gateway.kernel.errors import ErrorCode
from gateway.kernel.settings import Settings

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OTHER = "_other"
NONE = "-"

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
WORKER_SAMPLE_SECONDS = 10.0
_CACHE_MAX = 4096  # cached label combinations per kind (the label values themselves are bounded)

TRANSPORTS = frozenset({"http", "websocket", "compact"})
STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled", "in_progress"})
OUTCOMES = frozenset(
    {"ok", "rate_limited", "timeout", "connect_error", "rejected", "server_error", "error", "cancelled"}
)
STORE_OPS = frozenset({"reserve", "release", "put", "get", "chain", "delete", "get_items", "ping"})
LIMITS = frozenset(
    {"requests_per_minute", "tokens_per_minute", "concurrent_requests", "budget", "websocket_connections"}
)
COMPACTIONS = frozenset({"compact", "truncation"})
TOKEN_KINDS = ("input", "output", "cached", "reasoning")
# Error codes are the gateway's own, but an upstream's error body may name one (adapters/
# upstream_errors.py): beyond the known ones, this many more get a label, then "_other".
MAX_EXTRA_ERROR_CODES = 32
MAX_DEPLOYMENTS = 256
_CODE_RE = re.compile(r"^[a-z0-9_.]{1,64}$")
_KNOWN_CODES: frozenset[str] = frozenset(ErrorCode)  # every code the gateway answers itself


def multiprocess_dir() -> str | None:
    """The multiprocess directory, when this process writes its samples there."""
    return os.environ.get(MULTIPROC_ENV) or None


def _closed(value: object, allowed: frozenset[str]) -> str:
    if value is None or value == "":
        return NONE
    text = str(value)
    return text if text in allowed else OTHER


class _Bounded:
    """Label values admitted up to a cap (pass-through models, upstream-named error codes)."""

    __slots__ = ("cap", "fixed", "seen")

    def __init__(self, fixed: frozenset[str], cap: int) -> None:
        self.fixed = fixed
        self.cap = cap
        self.seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self.fixed or value in self.seen:
            return value
        if len(self.seen) >= self.cap:
            return OTHER
        self.seen.add(value)
        return value


class Metrics(Observer):
    """Every family of the gateway, and the engine's ``Observer``."""

    def __init__(self, settings: Settings | None = None) -> None:
        settings = settings or Settings()
        self.settings = settings
        self.multiprocess = multiprocess_dir() is not None
        self.registry = CollectorRegistry()
        self._codes = _Bounded(_KNOWN_CODES, MAX_EXTRA_ERROR_CODES)
        self._ws_open = 0
        self.relabel(settings)
        self._store_cache: dict[str, tuple[Any, Any]] = {}
        self._sampler: asyncio.Task[None] | None = None
        self._listener: WSGIServer | None = None
        reg = self.registry

        self.requests = Counter(
            "gateway_requests_total",
            "Requests (HTTP and compaction requests, WebSocket turns, refused WebSocket upgrades) by how "
            "they ended: status is the HTTP status of a refused request or the final status of a response.",
            ["transport", "model", "provider", "tenant", "status", "error_code"],
            registry=reg,
        )
        self.duration = Histogram(
            "gateway_request_duration_seconds",
            "Time from a request's arrival (a WebSocket turn's message) to its end.",
            ["transport", "model"],
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Streamed turns: time from the start of the upstream call (retries and fallbacks "
            "included) to the first delta from the provider.",
            ["model", "provider"],
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.upstream = Histogram(
            "gateway_upstream_request_duration_seconds",
            "One upstream attempt, from the call to the end of its stream (or its failure).",
            ["provider", "deployment", "outcome"],
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self.retries = Counter(
            "gateway_upstream_retries_total",
            "Upstream attempts retried on the same provider after a retryable failure.",
            ["provider"],
            registry=reg,
        )
        self.fallbacks = Counter(
            "gateway_fallbacks_total",
            "Turns that moved on to a fallback model after their route was exhausted.",
            ["model", "fallback"],
            registry=reg,
        )
        self.tokens = Counter(
            "gateway_tokens_total",
            "Tokens by kind (input, output, and of those cached input and reasoning output).",
            ["tenant", "model", "kind"],
            registry=reg,
        )
        self.ws_connections_gauge = Gauge(
            "gateway_websocket_connections",
            "Open WebSocket connections.",
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.ws_turns = Counter(
            "gateway_websocket_turns_total",
            "WebSocket turns (response.create messages) by how they ended.",
            ["tenant", "status"],
            registry=reg,
        )
        self.refusals = Counter(
            "gateway_rate_limited_total",
            "Requests and WebSocket connections refused by a tenancy limit.",
            ["tenant", "limit"],
            registry=reg,
        )
        self.limiter_errors = Counter(
            "gateway_limiter_errors_total",
            "Calls to the tenancy limits' limiter that failed (limits.on_limiter_error decided).",
            registry=reg,
        )
        self.store_duration = Histogram(
            "gateway_state_store_duration_seconds",
            "Calls to the response store, by operation.",
            ["op"],
            buckets=STORE_BUCKETS,
            registry=reg,
        )
        self.store_errors = Counter(
            "gateway_state_store_errors_total",
            "Calls to the response store that failed (the store could not answer).",
            ["op"],
            registry=reg,
        )
        self.compactions = Counter(
            "gateway_compactions_total",
            "Compactions: compact (POST /v1/responses/compact) and truncation (truncation: auto).",
            ["kind"],
            registry=reg,
        )
        if self.multiprocess:
            self._worker = {
                name: Gauge(
                    f"gateway_worker_{name}",
                    f"{help_text} (one series per live worker process).",
                    registry=reg,
                    multiprocess_mode="liveall",
                )
                for name, help_text in (
                    ("resident_memory_bytes", "Resident memory size in bytes"),
                    ("cpu_seconds", "User and system CPU time spent, in seconds"),
                    ("open_fds", "Open file descriptors"),
                )
            }
        else:
            process_collector.ProcessCollector(registry=reg)
            platform_collector.PlatformCollector(registry=reg)
            gc_collector.GCCollector(registry=reg)

    # -- label values ----------------------------------------------------------------------------
    def model(self, value: str | None) -> str:
        """A routed model's label; ``_other`` for anything else (none given: refused before it was
        routed; or past the pass-through cap)."""
        if not value:
            return OTHER
        return self._models(value) if len(value) <= 200 else OTHER

    def tenant(self, value: str | None) -> str:
        return _closed(value, self._tenants)

    def provider(self, value: str | None) -> str:
        return _closed(value, self._providers)

    def status(self, value: int | str) -> str:
        if isinstance(value, int):
            return str(value) if 100 <= value <= 599 else OTHER
        return _closed(value, STATUSES)

    def error_code(self, value: str | None) -> str:
        if not value:
            return NONE
        return self._codes(value) if _CODE_RE.match(value) else OTHER

    # -- a request's end (api/common.py RequestLog) ------------------------------------------------
    def observe(
        self,
        transport: str,
        model: str | None,
        status: int | str,
        seconds: float,
        usage: Mapping[str, Any] | None,
        *,
        tenant: str | None = None,
        provider: str | None = None,
        error_code: str | None = None,
        turn: bool = True,
    ) -> None:
        """One request's end. ``turn``: a WebSocket one is a turn (gateway_websocket_turns_total),
        unless it is a refused upgrade."""
        key = (transport, model, status, tenant, provider, error_code, turn)
        hit = self._request_cache.get(key)
        if hit is None:
            hit = self._request_children(*key)
            if len(self._request_cache) < _CACHE_MAX:
                self._request_cache[key] = hit
        requests, duration, turns, tokens = hit
        requests.inc()
        duration.observe(seconds)
        if turns is not None:
            turns.inc()
        if usage:
            for child, n in zip(tokens, _token_counts(usage), strict=True):
                if n > 0:
                    child.inc(n)

    def _request_children(
        self,
        transport: str,
        model: str | None,
        status: int | str,
        tenant: str | None,
        provider: str | None,
        error_code: str | None,
        turn: bool,
    ) -> tuple[Any, Any, Any, tuple[Any, ...]]:
        """The series one kind of request end goes to (looked up once, then cached: ``labels()``
        costs a microsecond or two each time)."""
        transport = _closed(transport, TRANSPORTS)
        model = self.model(model)
        tenant = self.tenant(tenant)
        status_label = self.status(status)
        requests = self.requests.labels(
            transport, model, self.provider(provider), tenant, status_label, self.error_code(error_code)
        )
        turns = self.ws_turns.labels(tenant, status_label) if turn and transport == "websocket" else None
        tokens = tuple(self.tokens.labels(tenant, model, kind) for kind in TOKEN_KINDS)
        return requests, self.duration.labels(transport, model), turns, tokens

    # -- WebSocket connections (gateway/api/ws.py counts with +=/-=) -------------------------------
    @property
    def ws_connections(self) -> int:
        return self._ws_open

    @ws_connections.setter
    def ws_connections(self, value: int) -> None:
        self._ws_open = value
        self.ws_connections_gauge.set(value)  # livesum: each worker sets its own; a scrape adds them

    def relabel(self, settings: Settings) -> None:
        """The label values ``settings`` allows (at the start, and after a live reload): its tenants,
        routed models and providers; anything else is ``_other``."""
        table = settings.provider_table()
        routed = set(settings.models)
        if settings.serves_mock_model(table):
            routed.add("mock")
        self._models = _Bounded(frozenset(routed), settings.metrics.max_pass_through_models)
        self._providers = frozenset(table)
        # a deployment: its name (the provider's, unless a model lists deployments), capped
        self._deployments = _Bounded(self._providers, MAX_DEPLOYMENTS)
        tenants = {k.tenant for k in settings.auth.api_keys or ()} | set(settings.tenants)
        self._tenants = frozenset(tenants | ({"default"} if not settings.auth.enabled else set()))
        # label values → their series, so that the hot path calls labels() once per combination
        self._request_cache: dict[tuple[Any, ...], tuple[Any, Any, Any, tuple[Any, ...]]] = {}
        self._attempt_cache: dict[tuple[str, str, str], Any] = {}
        self._ttft_cache: dict[tuple[str, str], Any] = {}

    # -- the engine's Observer ---------------------------------------------------------------------
    def upstream_attempt(self, target: Deployment, outcome: str, seconds: float) -> None:
        key = (target.provider, target.name, outcome)
        child = self._attempt_cache.get(key)
        if child is None:
            child = self.upstream.labels(
                self.provider(target.provider), self._deployments(target.name), _closed(outcome, OUTCOMES)
            )
            if len(self._attempt_cache) < _CACHE_MAX:
                self._attempt_cache[key] = child
        child.observe(seconds)

    def upstream_retry(self, target: Deployment) -> None:
        self.retries.labels(self.provider(target.provider)).inc()

    def fallback(self, primary: Route, fallback: Route) -> None:
        self.fallbacks.labels(self.model(primary.model), self.model(fallback.model)).inc()

    def first_token(self, primary: Route, target: Deployment, seconds: float) -> None:
        key = (primary.model, target.provider)
        child = self._ttft_cache.get(key)
        if child is None:
            child = self.ttft.labels(self.model(primary.model), self.provider(target.provider))
            if len(self._ttft_cache) < _CACHE_MAX:
                self._ttft_cache[key] = child
        child.observe(seconds)

    def store_op(self, op: str, seconds: float, failed: bool) -> None:
        pair = self._store_cache.get(op)
        if pair is None:
            label = _closed(op, STORE_OPS)
            pair = self._store_cache[label] = (
                self.store_duration.labels(label),
                self.store_errors.labels(label),
            )
        pair[0].observe(seconds)
        if failed:
            pair[1].inc()

    def rate_limited(self, tenant: str, limit: str) -> None:
        self.refusals.labels(self.tenant(tenant), _closed(limit, LIMITS)).inc()

    def limiter_error(self) -> None:
        self.limiter_errors.inc()

    def compaction(self, kind: str) -> None:
        self.compactions.labels(_closed(kind, COMPACTIONS)).inc()

    # -- rendering and serving ---------------------------------------------------------------------
    def render(self) -> bytes:
        """The exposition text: this app's registry, or every process's samples in multiprocess mode."""
        if self.multiprocess:
            return render_multiprocess()
        return generate_latest(self.registry)

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples named ``name`` whose labels include ``labels`` (for checks and tests)."""
        registry = multiprocess_registry() if self.multiprocess else self.registry
        return sum(
            sample.value
            for family in registry.collect()
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        )

    def sample_worker(self) -> None:
        """Multiprocess mode: this worker's own process metrics, as ``gateway_worker_*{pid}``."""
        if not self.multiprocess:
            return
        for sample in _process_samples():
            gauge = self._worker.get(sample[0])
            if gauge is not None:
                gauge.set(sample[1])

    async def start(self, host: str | None) -> None:
        """The lifespan's part: in one process, ``metrics.port``'s listener (on ``metrics.host``,
        else ``host``: the public listener's); in multiprocess mode, the worker's process sampler
        (the supervisor serves the port: ``serve_port``)."""
        cfg = self.settings.metrics
        if self.multiprocess:
            self.sample_worker()
            self._sampler = asyncio.create_task(self._sample_forever())
        elif cfg.port is not None:
            bind = cfg.host or host or "127.0.0.1"
            self._listener = serve_registry(bind, cfg.port, self.registry)

    async def _sample_forever(self) -> None:
        while True:
            await asyncio.sleep(WORKER_SAMPLE_SECONDS)
            self.sample_worker()

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
        if self._listener is not None:
            listener, self._listener = self._listener, None
            await asyncio.to_thread(_shutdown, listener)


def _token_counts(usage: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """Input, output, cached and reasoning tokens (``TOKEN_KINDS``' order)."""
    inp = usage.get("input_tokens_details") or {}
    out = usage.get("output_tokens_details") or {}
    return (
        _int(usage.get("input_tokens")),
        _int(usage.get("output_tokens")),
        _int(inp.get("cached_tokens") if isinstance(inp, Mapping) else None),
        _int(out.get("reasoning_tokens") if isinstance(out, Mapping) else None),
    )


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


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


def multiprocess_registry(path: str | None = None) -> CollectorRegistry:
    """A fresh registry over every process's samples in ``path`` (default: $PROMETHEUS_MULTIPROC_DIR),
    plus the process metrics of the process rendering it."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)
    process_collector.ProcessCollector(registry=registry)
    return registry


def render_multiprocess(path: str | None = None) -> bytes:
    return generate_latest(multiprocess_registry(path))


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
    _shutdown(server)


def _shutdown(server: WSGIServer) -> None:
    server.shutdown()
    server.server_close()


__all__ = [
    "CONTENT_TYPE",
    "MULTIPROC_ENV",
    "Metrics",
    "multiprocess_dir",
    "multiprocess_registry",
    "render_multiprocess",
    "serve_port",
    "stop_serving",
]
