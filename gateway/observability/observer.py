"""The per-request sample and the engine's ``Observer``: ``Metrics`` records into the families
(``families.py``) through ``prometheus_client``, and renders them, in one process or across several
(``multiprocess.py``).

Single process: the families live in the app's own ``CollectorRegistry`` (several apps may share a
process, as the tests do). With ``PROMETHEUS_MULTIPROC_DIR`` set (``serve --workers``), a scrape
renders every process's samples.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, generate_latest

from gateway.engine.routing import Deployment, Route
from gateway.engine.telemetry import Observer
from gateway.kernel.client_api import ClientApi
from gateway.kernel.settings import Settings
from gateway.observability.families import (
    APIS,
    COMPACTIONS,
    LIMITS,
    MCP_OUTCOMES,
    OUTCOMES,
    STORE_OPS,
    TOKEN_KINDS,
    TRANSPORTS,
    Families,
    Labels,
    closed,
)
from gateway.observability.multiprocess import (
    WorkerSampler,
    multiprocess_dir,
    multiprocess_registry,
    render_multiprocess,
    serve_registry,
    stop_serving,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_CACHE_MAX = 4096  # cached label combinations per kind (the label values themselves are bounded)


class Metrics(Observer):
    """The app's metrics: every family of the gateway, and the engine's ``Observer``."""

    def __init__(self, settings: Settings | None = None) -> None:
        settings = settings or Settings()
        self.settings = settings
        self.multiprocess = multiprocess_dir() is not None
        self.registry = CollectorRegistry()
        self.labels = Labels(settings)
        self._ws_open = 0
        self._clear_caches()
        self._store_cache: dict[str, tuple[Any, Any]] = {}
        self._sampler: WorkerSampler | None = None
        self._listener: WSGIServer | None = None
        self.families = Families(self.registry, self.multiprocess)

    # -- a request's end (api/exchange.py RequestLog) ------------------------------------------------
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
        api: str = ClientApi.RESPONSES,
    ) -> None:
        """One request's end. ``turn``: a WebSocket one is a turn (gateway_websocket_turns_total),
        unless it is a refused upgrade. ``api``: the client API it came in by."""
        key = (transport, model, status, tenant, provider, error_code, turn, api)
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
        api: str,
    ) -> tuple[Any, Any, Any, tuple[Any, ...]]:
        """The series one kind of request end goes to (looked up once, then cached: ``labels()``
        costs a microsecond or two each time)."""
        labels, families = self.labels, self.families
        transport = closed(transport, TRANSPORTS)
        model = labels.model(model)
        tenant = labels.tenant(tenant)
        status_label = labels.status(status)
        requests = families.requests.labels(
            closed(api, APIS),
            transport,
            model,
            labels.provider(provider),
            tenant,
            status_label,
            labels.error_code(error_code),
        )
        turns = families.ws_turns.labels(tenant, status_label) if turn and transport == "websocket" else None
        tokens = tuple(families.tokens.labels(tenant, model, kind) for kind in TOKEN_KINDS)
        return requests, families.duration.labels(transport, model), turns, tokens

    # -- WebSocket connections (gateway/api/ws.py counts with +=/-=) -------------------------------
    @property
    def ws_connections(self) -> int:
        return self._ws_open

    @ws_connections.setter
    def ws_connections(self, value: int) -> None:
        self._ws_open = value
        self.families.ws_connections.set(value)  # livesum: each worker sets its own; a scrape adds them

    def relabel(self, settings: Settings) -> None:
        """The label values ``settings`` allows (at the start, and after a live reload): its tenants,
        routed models and providers; anything else is ``_other``."""
        self.labels.relabel(settings)
        self._clear_caches()

    def _clear_caches(self) -> None:
        # label values → their series, so that the hot path calls labels() once per combination
        self._request_cache: dict[tuple[Any, ...], tuple[Any, Any, Any, tuple[Any, ...]]] = {}
        self._attempt_cache: dict[tuple[str, str, str], Any] = {}
        self._ttft_cache: dict[tuple[str, str], Any] = {}

    # -- the engine's Observer ---------------------------------------------------------------------
    def upstream_attempt(self, deployment: Deployment, outcome: str, seconds: float) -> None:
        key = (deployment.provider, deployment.name, outcome)
        child = self._attempt_cache.get(key)
        if child is None:
            labels = self.labels
            child = self.families.upstream.labels(
                labels.provider(deployment.provider),
                labels.deployment(deployment.name),
                closed(outcome, OUTCOMES),
            )
            if len(self._attempt_cache) < _CACHE_MAX:
                self._attempt_cache[key] = child
        child.observe(seconds)

    def upstream_retry(self, deployment: Deployment) -> None:
        self.families.retries.labels(self.labels.provider(deployment.provider)).inc()

    def fallback(self, primary: Route, fallback: Route) -> None:
        labels = self.labels
        self.families.fallbacks.labels(labels.model(primary.model), labels.model(fallback.model)).inc()

    def first_token(self, primary: Route, deployment: Deployment, seconds: float) -> None:
        key = (primary.model, deployment.provider)
        child = self._ttft_cache.get(key)
        if child is None:
            labels = self.labels
            child = self.families.ttft.labels(
                labels.model(primary.model), labels.provider(deployment.provider)
            )
            if len(self._ttft_cache) < _CACHE_MAX:
                self._ttft_cache[key] = child
        child.observe(seconds)

    def store_op(self, op: str, seconds: float, failed: bool) -> None:
        pair = self._store_cache.get(op)
        if pair is None:
            label = closed(op, STORE_OPS)
            pair = self._store_cache[label] = (
                self.families.store_duration.labels(label),
                self.families.store_errors.labels(label),
            )
        pair[0].observe(seconds)
        if failed:
            pair[1].inc()

    def rate_limited(self, tenant: str, limit: str) -> None:
        self.families.refusals.labels(self.labels.tenant(tenant), closed(limit, LIMITS)).inc()

    def limiter_error(self) -> None:
        self.families.limiter_errors.inc()

    def spend(self, tenant: str, model: str, micros: int) -> None:
        # a Prometheus sample is a float: the exact figure is the ledger's (GET /v1/usage)
        labels = self.labels
        self.families.spend.labels(labels.tenant(tenant), labels.model(model)).inc(micros / 1_000_000)

    def compaction(self, kind: str) -> None:
        self.families.compactions.labels(closed(kind, COMPACTIONS)).inc()

    def mcp_call(self, server_label: str, outcome: str, seconds: float, *, list_tools: bool = False) -> None:
        label = self.labels.mcp_server(server_label)
        kind = "list_tools" if list_tools else "call"
        self.families.mcp_calls.labels(label, kind, closed(outcome, MCP_OUTCOMES)).inc()
        self.families.mcp_duration.labels(label, kind).observe(seconds)

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

    async def start(self, host: str | None) -> None:
        """The lifespan's part: in one process, ``metrics.port``'s listener (on ``metrics.host``,
        else ``host``: the public listener's); in multiprocess mode, the worker's process sampler
        (the supervisor serves the port: ``serve_port``)."""
        cfg = self.settings.metrics
        if self.multiprocess:
            self._sampler = WorkerSampler(self.families.worker)
            self._sampler.start()
        elif cfg.port is not None:
            bind = cfg.host or host or "127.0.0.1"
            self._listener = serve_registry(bind, cfg.port, self.registry)

    async def stop(self) -> None:
        if self._sampler is not None:
            sampler, self._sampler = self._sampler, None
            await sampler.stop()
        if self._listener is not None:
            listener, self._listener = self._listener, None
            await asyncio.to_thread(stop_serving, listener)


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
