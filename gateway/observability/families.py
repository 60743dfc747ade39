"""The gateway's Prometheus families (docs/operations.md, "Metrics") and their bounded label values.

Label values are bounded: a tenant is one the config names (else ``_other``), a model one it routes
(pass-through models up to ``metrics.max_pass_through_models``; anything not routed is ``_other``),
everything else a closed set with ``_other`` for anything unexpected; ``-`` means none (a tenant,
provider or error code not known: refused before it was).
"""

from __future__ import annotations

import re

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    gc_collector,
    platform_collector,
    process_collector,
)

from gateway.kernel.client_api import ClientApi
from gateway.kernel.errors import ErrorCode
from gateway.kernel.settings import Settings

OTHER = "_other"
NONE = "-"

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

MAX_MCP_LABELS = 32
MCP_OUTCOMES = frozenset({"ok", "error", "cancelled"})
TRANSPORTS = frozenset({"http", "websocket", "compact"})
APIS = frozenset(api.value for api in ClientApi)
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


def closed(value: object, allowed: frozenset[str]) -> str:
    """``value``'s label in the closed set ``allowed``: itself, ``_other``, or ``-`` for none."""
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


class Labels:
    """The label values of the open kinds: the tenants, models, providers and deployments the
    settings allow (``relabel`` at the start and after a live reload), and error codes."""

    def __init__(self, settings: Settings) -> None:
        self._codes = _Bounded(_KNOWN_CODES, MAX_EXTRA_ERROR_CODES)
        self.relabel(settings)

    def relabel(self, settings: Settings) -> None:
        """The label values ``settings`` allows: its tenants, routed models and providers; anything
        else is ``_other``."""
        table = settings.provider_table()
        routed = set(settings.models)
        if settings.serves_mock_model(table):
            routed.add("mock")
        self._models = _Bounded(frozenset(routed), settings.metrics.max_pass_through_models)
        self._providers = frozenset(table)
        # a deployment: its name (the provider's, unless a model lists deployments), capped
        self.deployment = _Bounded(self._providers, MAX_DEPLOYMENTS)
        # an MCP server's label: an operator-declared one, or the first few clients name
        self.mcp_server = _Bounded(frozenset(settings.mcp.servers), MAX_MCP_LABELS)
        tenants = {k.tenant for k in settings.auth.api_keys or ()} | set(settings.tenants)
        self._tenants = frozenset(tenants | ({"default"} if not settings.auth.enabled else set()))

    def model(self, value: str | None) -> str:
        """A routed model's label; ``_other`` for anything else (none given: refused before it was
        routed; or past the pass-through cap)."""
        if not value:
            return OTHER
        return self._models(value) if len(value) <= 200 else OTHER

    def tenant(self, value: str | None) -> str:
        return closed(value, self._tenants)

    def provider(self, value: str | None) -> str:
        return closed(value, self._providers)

    def status(self, value: int | str) -> str:
        if isinstance(value, int):
            return str(value) if 100 <= value <= 599 else OTHER
        return closed(value, STATUSES)

    def error_code(self, value: str | None) -> str:
        if not value:
            return NONE
        return self._codes(value) if _CODE_RE.match(value) else OTHER


class Families:
    """Every family of the gateway, on ``registry``. In one process, the default process, platform
    and GC collectors beside them; in multiprocess mode (process metrics cannot be summed across
    processes) each worker's own instead, as the ``worker`` gauges (``gateway_worker_*{pid}``)."""

    def __init__(self, registry: CollectorRegistry, multiprocess: bool) -> None:
        reg = registry
        self.requests = Counter(
            "gateway_requests_total",
            "Requests (HTTP and compaction requests, WebSocket turns, refused WebSocket upgrades) by how "
            "they ended: status is the HTTP status of a refused request or the final status of a response.",
            ["api", "transport", "model", "provider", "tenant", "status", "error_code"],
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
        self.spend = Counter(
            "gateway_spend_total",
            "Spend in the configured currency (models.<name>.price applied to each turn's usage).",
            ["tenant", "model"],
            registry=reg,
        )
        self.ws_connections = Gauge(
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
        self.mcp_calls = Counter(
            "gateway_mcp_calls_total",
            "Calls to MCP servers (hosted tools): kind list_tools or call, outcome ok, error or cancelled.",
            ["server_label", "kind", "outcome"],
            registry=reg,
        )
        self.mcp_duration = Histogram(
            "gateway_mcp_call_duration_seconds",
            "Time an MCP server took to answer a listing or a tool call.",
            ["server_label", "kind"],
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self.compactions = Counter(
            "gateway_compactions_total",
            "Compactions: compact (POST /v1/responses/compact) and truncation (truncation: auto).",
            ["kind"],
            registry=reg,
        )
        self.worker: dict[str, Gauge] = {}
        if multiprocess:
            self.worker = {
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
