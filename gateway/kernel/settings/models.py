"""The config's models: one ``Settings`` (the YAML file plus environment overrides, read by
``loading.py``) and the sections it holds. Their validators apply the rules of ``checks.py``.

Environment variables use the prefix ``GATEWAY_`` and ``__`` between nested names, e.g.
``GATEWAY_STATE__REDIS_URL=redis://...`` or ``GATEWAY_LIMITS__MAX_BODY_BYTES=1048576``; provider
keys are read from the variable named by ``api_key_env``.
"""

from __future__ import annotations

import hashlib
import os
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gateway.kernel.allow_list import parse_entry
from gateway.kernel.settings import checks
from gateway.kernel.settings.checks import Problems, invalid

ProviderKind = Literal["mock", "openai-chat", "openai-responses", "anthropic", "gemini"]

DEFAULT_BASE_URLS: dict[str, str] = {
    "openai-chat": "https://api.openai.com/v1",
    "openai-responses": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com/v1beta",
}


AUTO_PROVIDERS: tuple[tuple[str, ProviderKind, str], ...] = (
    ("openai", "openai-responses", "OPENAI_API_KEY"),
    ("anthropic", "anthropic", "ANTHROPIC_API_KEY"),
    ("gemini", "gemini", "GEMINI_API_KEY"),
)


AesKey = Annotated[SecretStr, AfterValidator(checks.aes_key)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KeyRef(_Strict):
    """A key given as ``key`` (plain) or ``sha256`` (hex digest of the key): exactly one."""

    key: SecretStr | None = None
    sha256: str | None = None

    @field_validator("sha256")
    @classmethod
    def _hex_digest(cls, value: str | None) -> str | None:
        if value is not None and (problem := checks.sha256_problem(value)):
            raise invalid(problem)
        return value

    @model_validator(mode="after")
    def _one_form(self) -> KeyRef:
        if (self.key is None) == (self.sha256 is None):
            raise invalid("give exactly one of 'key' or 'sha256'")
        return self

    def digest(self) -> bytes:
        """The SHA-256 of the key, whichever form it was given in."""
        if self.key is not None:
            return hashlib.sha256(self.key.get_secret_value().encode()).digest()
        return bytes.fromhex(self.sha256 or "")


class KeyLimits(_Strict):
    """Fair-use limits of one API key (None: no limit of that kind). A key's and its tenant's
    limits both apply; the stricter wins."""

    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    concurrent_requests: int | None = Field(default=None, ge=1)  # in-flight HTTP requests + WS turns


class TenantLimits(KeyLimits):
    websocket_connections: int | None = Field(default=None, ge=1)  # open sockets


def _money(value: Any) -> Any:
    """An amount of money as written: a string or an integer (a YAML float is read back through
    its shortest repr, e.g. 0.15 -> "0.15", never used as a float)."""
    if isinstance(value, bool):
        raise invalid('an amount must be a number such as "2.50", not a boolean')
    if isinstance(value, float):
        return repr(value)
    return value


def _micro(value: Decimal) -> Decimal:
    if problem := checks.money_problem(value):
        raise invalid(problem)
    return value


# an amount of the configured currency (``currency``), at most 6 decimals (micro-units), >= 0
Money = Annotated[Decimal, BeforeValidator(_money), AfterValidator(_micro)]


def micros(amount: Decimal) -> int:
    """``amount`` in integer micro-units of the currency (exact: ``Money`` has at most 6 decimals)."""
    return int(amount * 1_000_000)


class Price(_Strict):
    """A model's prices per million tokens, in the configured ``currency``. ``cached_input`` and
    ``cache_write`` default to ``input``, ``reasoning`` to ``output``."""

    input: Money
    output: Money
    cached_input: Money | None = None
    cache_write: Money | None = None
    reasoning: Money | None = None


class BudgetWindow(_Strict):
    """A budget period other than a calendar day or month: ``seconds`` (consecutive windows of
    that length, counted from the Unix epoch), or one window from ``start`` to ``end``."""

    seconds: int | None = Field(default=None, ge=60)
    start: datetime | None = None
    end: datetime | None = None

    @model_validator(mode="after")
    def _one_form(self) -> BudgetWindow:
        if problem := checks.window_problem(self.seconds, self.start, self.end):
            raise invalid(problem)
        return self


class Budget(_Strict):
    """Spend per period (UTC): ``tokens`` (input + output), ``amount`` (money, in ``currency``, at
    the models' prices), or both."""

    tokens: int | None = Field(default=None, ge=1)
    amount: Money | None = None
    period: Literal["day", "month"] | BudgetWindow = "day"

    @model_validator(mode="after")
    def _something(self) -> Budget:
        if self.tokens is None and self.amount is None:
            raise invalid("give 'tokens', 'amount' or both")
        if self.amount is not None and self.amount <= 0:
            raise Problems([("amount", "must be more than 0")])
        return self


def _allow_entries(values: list[str]) -> list[str]:
    for value in values:
        try:
            parse_entry(value)
        except ValueError as exc:
            raise invalid(str(exc)) from None
    return values


AllowList = Annotated[list[str], AfterValidator(_allow_entries), Field(max_length=1024)]


class TenantMcp(_Strict):
    """A tenant's MCP servers (hosted tools): the hosts, addresses and URL prefixes its requests'
    ``server_url`` may name (None: the ``mcp.allow`` default)."""

    allow: AllowList | None = None


class McpServerSettings(_Strict):
    """An MCP server the operator declares: tenants name it by its label (``server_label``, no
    ``server_url``), and its credentials stay here."""

    url: Annotated[str, AfterValidator(checks.http_url)]
    headers: dict[str, SecretStr] = {}
    authorization: SecretStr | None = None  # sent as "Authorization: Bearer <it>"
    description: str | None = None
    transport: Literal["streamable_http", "sse"] | None = None  # None: by the URL (a path ending /sse)
    tenants: list[str] | None = None  # the tenants that may use it (None: every tenant)


class McpSettings(_Strict):
    """Hosted MCP tools (docs/mcp.md): where servers may be, and the bounds of their calls."""

    allow: AllowList = []  # the default allow-list of every tenant that sets none
    servers: dict[Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")], McpServerSettings] = {}
    call_timeout_seconds: float = Field(default=30.0, gt=0)  # one listing or one tool call
    response_timeout_seconds: float = Field(default=120.0, gt=0)  # every hosted call of one response
    max_result_bytes: int = Field(default=256 * 1024, ge=1024)  # one tool call's result
    max_servers: int = Field(default=8, ge=1)  # per request
    max_tools: int = Field(default=128, ge=1)  # per server listing
    max_tool_calls: int = Field(default=32, ge=1)  # per response, when the request sets no max_tool_calls


class TenantSettings(_Strict):
    limits: TenantLimits = TenantLimits()
    budget: Budget | None = None
    # the JSON answer of POST /v1/responses carries x-gateway-cost: its cost in ``currency``
    cost_header: bool = False
    retention: Literal["standard", "none"] = "standard"  # none: no conversation content persisted
    models: list[str] | None = None  # an allow-list for every key of the tenant (None: all)
    mcp: TenantMcp = TenantMcp()


class ApiKey(KeyRef):
    """One client key of a tenant."""

    tenant: str
    models: list[str] | None = None  # None: every model
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._:-]{1,64}$")  # in logs, never the key
    limits: KeyLimits = KeyLimits()
    budget: Budget | None = None  # the key's own budget; its tenant's applies too


class AdminKey(KeyRef):
    """A key that may read every tenant's usage (GET /v1/usage); it serves no model."""

    name: str = Field(default="admin", pattern=r"^[A-Za-z0-9._:-]{1,64}$")


class AdminSettings(_Strict):
    api_keys: list[AdminKey] = []
    # signs the console's session cookies (/console); None: a random key per process (a session
    # then works only on the replica that made it: set one shared secret behind a balancer)
    console_secret: SecretStr | None = None


class AuthSettings(_Strict):
    # None: no client keys, every request is tenant "default" (local use: on a non-loopback
    # address the gateway then refuses to start unless ``anonymous`` is true)
    api_keys: list[ApiKey] | None = None
    anonymous: bool = False  # serve without client keys on any address, on purpose

    @property
    def enabled(self) -> bool:
        return self.api_keys is not None

    @model_validator(mode="after")
    def _one_mode(self) -> AuthSettings:
        if self.anonymous and self.api_keys is not None:
            raise Problems([("anonymous", "true contradicts api_keys: give one or the other")])
        return self


class StateSettings(_Strict):
    # None: in-process store
    redis_url: Annotated[SecretStr | None, checks.secret_url(("redis", "rediss", "unix"))] = None
    # standalone: redis_url is the server. cluster: redis_url names any node of a Redis Cluster
    # (db 0). sentinel: the sentinels name the master of sentinel_master; redis_url gives only the
    # credentials, db and scheme (rediss: TLS), its host is not used
    redis_mode: Literal["standalone", "cluster", "sentinel"] = "standalone"
    sentinels: list[str] = []  # "host:port" of each sentinel
    sentinel_master: str | None = None
    sentinel_password: SecretStr | None = None  # the sentinels' own (redis_url's is the master's)
    key_prefix: str = "orgw"
    ttl_seconds: int = Field(default=30 * 24 * 3600, ge=1)
    memory_max_entries: int = Field(default=10_000, ge=1)
    memory_max_bytes: int = Field(default=256 * 1024 * 1024, ge=1024)
    max_chain_depth: int = Field(default=1000, ge=1)
    timeout_seconds: float = Field(default=2.0, gt=0)
    # how long a store health check holds before a store: true request probes again
    health_recheck_seconds: float = Field(default=1.0, gt=0)
    # a store: true response is acknowledged only once this many replicas have it too (Redis
    # WAIT, within half of timeout_seconds; fewer is a 503). 0: once the master has it
    wait_replicas: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _topology(self) -> StateSettings:
        if problems := checks.topology_problems(self):
            raise Problems(problems)
        return self


class Timeouts(_Strict):
    connect: float = Field(default=10.0, gt=0)
    read: float = Field(default=120.0, gt=0)  # between bytes of a response
    total: float = Field(default=600.0, gt=0)  # a whole upstream call


class RetrySettings(_Strict):
    attempts: int = Field(default=2, ge=0, le=10)  # retries after the first try
    backoff_base: float = Field(default=0.25, ge=0)
    backoff_max: float = Field(default=4.0, ge=0)
    # the longest upstream Retry-After waited for (a longer one is waited for this long)
    retry_after_cap: float = Field(default=10.0, ge=0)


class ProviderSettings(_Strict):
    kind: ProviderKind
    base_url: str | None = None  # None: the provider's public endpoint (DEFAULT_BASE_URLS)
    api_key_env: str | None = None
    api_key: SecretStr | None = None  # for local use; prefer api_key_env
    timeouts: Timeouts = Timeouts()
    retry: RetrySettings = RetrySettings()
    headers: dict[str, str] = {}
    pass_through: bool = True  # "provider/model" names route here without a models: entry
    max_connections: int = Field(default=200, ge=1)
    # http://[user:pass@]host:port for upstream calls (none: direct)
    proxy: Annotated[SecretStr | None, AfterValidator(checks.proxy_url)] = None
    # no proxy above: take HTTPS_PROXY / HTTP_PROXY / ALL_PROXY / NO_PROXY from the environment
    trust_env: bool = False
    # text/argument deltas decoded from one upstream read go out as one event
    # (docs/architecture.md, "The relay"); false: one event per upstream delta
    merge_deltas: bool = True
    # anthropic: prompt-cache breakpoints on the tools, the system prompt and the conversation so
    # far (docs/adapters.md, "Prompt caching"); off: none, every turn pays full input price
    prompt_caching: Literal["auto", "off"] = "auto"
    # openai-chat / openai-responses / anthropic: send temperature and top_p when they are the spec's
    # default (1.0), which the response states (anthropic: both, as stated). None: send them, except
    # to OpenAI's and Anthropic's own APIs (api.openai.com, *.openai.azure.com, api.anthropic.com),
    # whose defaults are those values (and whose reasoning models refuse the parameter, or refuse
    # both at once); other servers (llama.cpp, vLLM, ...) sample at defaults of their own otherwise
    send_default_sampling: bool | None = None
    anthropic_version: str = "2023-06-01"
    default_max_tokens: int = Field(default=4096, ge=1)
    # mock: chunk size of streamed text, in characters
    chunk_chars: int = Field(default=4, ge=1)

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str | None) -> str | None:
        return None if value is None else checks.upstream_url(value)

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and (problem := checks.key_problem(value.get_secret_value())):
            raise invalid(problem)
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        if problems := checks.header_problems(value):
            raise Problems(problems)
        return value

    @field_validator("anthropic_version")
    @classmethod
    def _version_header(cls, value: str) -> str:
        if problems := checks.header_problems({"anthropic-version": value}):
            raise invalid(problems[0][1])
        return value

    def resolved_base_url(self) -> str:
        return (self.base_url or DEFAULT_BASE_URLS.get(self.kind, "")).rstrip("/")

    def sends_default_sampling(self) -> bool:
        """``send_default_sampling``, or (None) whether the upstream is not OpenAI's own API."""
        if self.send_default_sampling is not None:
            return self.send_default_sampling
        host = (urlsplit(self.resolved_base_url()).hostname or "").lower()
        return not (host in ("api.openai.com", "api.anthropic.com") or host.endswith(".openai.azure.com"))

    def resolved_api_key(self) -> str | None:
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if self.api_key_env:
            return os.environ.get(self.api_key_env)
        return None


class Deployment(_Strict):
    """One replica of a model: a provider (its base URL, key, timeouts and retry policy) and the
    model's name there. ``name`` labels it in logs and metrics and is its identity for affinity
    hashing (default: ``<provider>``, or ``<provider>/<index>`` when the model names it twice)."""

    provider: str
    upstream_model: str | None = None  # None: the model's upstream_model, else its name
    weight: float = Field(default=1.0, gt=0)  # its share of the traffic, relative to the others
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._:/-]{1,64}$")


class RoutingSettings(_Strict):
    """How a model's deployments share its traffic (gateway/engine/balance.py)."""

    strategy: Literal["least_busy", "weighted", "latency"] = "least_busy"
    # prompt_cache_key: a request's prompt_cache_key, else its previous_response_id chain, else its
    # WebSocket connection keeps it on one deployment (rendezvous hashing); none: the strategy alone
    affinity: Literal["prompt_cache_key", "none"] = "prompt_cache_key"
    # failures in a row (connect errors, timeouts, 5xx) that take a deployment out of rotation
    eject_after: int = Field(default=3, ge=1)
    cooldown_seconds: float = Field(default=30.0, gt=0)  # how long it stays out; then one trial


class ModelRoute(_Strict):
    """A model: one ``provider`` (one deployment), or ``deployments`` balanced by ``routing``."""

    provider: str | None = None
    upstream_model: str | None = None  # None: the model name itself
    deployments: list[Deployment] | None = None
    routing: RoutingSettings = RoutingSettings()
    context_window: int = Field(default=128_000, ge=256)
    fallbacks: list[str] = []
    price: Price | None = None  # None: priced at zero (docs/spend.md)

    @model_validator(mode="after")
    def _one_form(self) -> ModelRoute:
        if problems := checks.route_form_problems(self):
            raise Problems(problems)
        return self

    def targets(self) -> list[Deployment]:
        """The deployments, each with its name and upstream model filled in (``upstream_model``
        None still means the model's own name)."""
        if self.deployments is None:
            assert self.provider is not None  # _one_form
            return [
                Deployment(provider=self.provider, upstream_model=self.upstream_model, name=self.provider)
            ]
        return [
            d.model_copy(update={"name": name, "upstream_model": d.upstream_model or self.upstream_model})
            for d, name in zip(self.deployments, self.deployment_names(), strict=True)
        ]

    def deployment_names(self) -> list[str]:
        deps = self.deployments or []
        counts: dict[str, int] = {}
        for d in deps:
            counts[d.provider] = counts.get(d.provider, 0) + 1
        return [
            d.name or (d.provider if counts[d.provider] == 1 else f"{d.provider}/{i}")
            for i, d in enumerate(deps)
        ]

    @property
    def owner(self) -> str:
        """The provider that owns the model in ``GET /v1/models``: its (first) deployment's."""
        return self.targets()[0].provider


class Limits(_Strict):
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # input items + their content parts + tools of one request (validating them holds the event loop)
    max_input_elements: int = Field(default=20_000, ge=10)
    # nesting of free-form JSON (tool parameters, a json_schema format, annotations): deeper is
    # refused with 400 before it can break serialization (orjson stops at 255)
    max_json_depth: int = Field(default=64, ge=8, le=200)
    # how long one send to a client may block (a client that stops reading) before it is dropped
    # and its upstream call cancelled: SSE and WebSocket alike
    client_send_seconds: float = Field(default=30.0, gt=0)
    max_events_per_stream: int = Field(default=200_000, ge=10)
    max_ws_frame_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    ws_connection_seconds: float = Field(default=3600.0, gt=0)
    ws_queue_size: int = Field(default=16, ge=1)
    # background responses of one tenant waiting for a concurrency slot, per process (past: 429)
    background_queue_size: int = Field(default=100, ge=0)
    ws_cache_entries: int = Field(default=8, ge=1)
    # lanes (stream_id) of one socket running at once, the default lane included
    ws_max_lanes: int = Field(default=4, ge=1)
    # steering inputs (response.steer) queued for one response, not yet committed
    ws_max_pending_steers: int = Field(default=8, ge=1)
    # on SIGTERM, in-flight WebSocket turns and HTTP responses get this long; then they are cut
    ws_drain_seconds: float = Field(default=10.0, ge=0)
    # the request line and headers, through the blank line (-> 431)
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    header_read_seconds: float = Field(default=10.0, gt=0)  # a whole head, from its first byte (-> 408)
    body_read_seconds: float = Field(default=10.0, gt=0)  # a whole body, from the end of its head (-> 408)
    # the tenancy limits' limiter (Redis) unreachable: allow serves unlimited, deny answers 503
    on_limiter_error: Literal["allow", "deny"] = "allow"
    # output tokens reserved against tokens_per_minute and budgets when a request sets no
    # max_output_tokens (settled to the real usage at the end of the turn)
    output_token_reservation: int = Field(default=4096, ge=1)


class CompactionSettings(_Strict):
    """A compaction keeps, after the summary, the newest items that fit a token budget
    (``recent_budget``): ``keep_recent_tokens`` when set, else ``keep_recent_fraction`` of the routed
    model's ``context_window``. System/developer messages are always kept and count against it first.
    ``keep_recent_items`` optionally also caps how many items that tail may hold. An explicit
    ``/v1/responses/compact`` also summarizes everything before the newest user message and keeps
    at most half the input verbatim (compact/strategy.py ``compact_start``)."""

    keys: list[AesKey] = []  # base64 AES keys; first encrypts, all decrypt. Empty: a per-process key
    # Set by ``serve --workers N`` in its workers' environment (GATEWAY_COMPACTION__WORKERS_KEY)
    # when ``keys`` is empty: one random key shared by the workers of one start, so that an item
    # one worker compacted opens on the others (not after a restart, nor on another replica).
    workers_key: AesKey | None = None
    keep_recent_tokens: int | None = Field(default=None, ge=0)  # absolute, for every model
    keep_recent_fraction: float = Field(default=0.15, ge=0, le=1)  # of context_window, when no tokens
    keep_recent_items: int | None = Field(default=None, ge=0)  # an upper bound; None: no count limit
    summary_max_tokens: int = Field(default=1024, ge=16)

    def recent_budget(self, context_window: int) -> int:
        """Estimated tokens the verbatim part of a compacted window may take on a model with
        ``context_window`` tokens."""
        if self.keep_recent_tokens is not None:
            return self.keep_recent_tokens
        return int(context_window * self.keep_recent_fraction)


class ServerSettings(_Strict):
    """The serving processes (``serve --workers`` overrides ``workers``); read at start only."""

    # worker processes sharing one listening socket (1: a single process, no supervisor)
    workers: int = Field(default=1, ge=1, le=64)


class LogSettings(_Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    json_logs: bool = Field(default=True, alias="json")


class MetricsSettings(_Strict):
    """Where /metrics is served (docs/operations.md, "Metrics")."""

    # None: on the public listener (an admin key required when auth is on); a port: only on a
    # listener of its own there, and the public /metrics answers 404
    port: int | None = Field(default=None, ge=1, le=65535)
    host: str | None = Field(default=None, min_length=1)  # None: the public listener's host
    # pass-through models (provider/model) get a label each up to this many, then "_other"
    max_pass_through_models: int = Field(default=100, ge=0, le=10_000)


class TracingSettings(_Strict):
    """OpenTelemetry tracing (docs/operations.md, "Tracing"); the standard OTEL_* variables apply as well."""

    # None: on when the OTEL_* environment asks for it (an OTLP endpoint, OTEL_TRACES_EXPORTER)
    enabled: bool | None = None
    # the OTLP/HTTP endpoint (spans go to <endpoint>/v1/traces); None: OTEL_EXPORTER_OTLP_* or
    # http://localhost:4318. Given, it turns tracing on (unless enabled: false).
    endpoint: Annotated[str | None, AfterValidator(checks.http_url)] = None
    service_name: str = Field(default="openresponses-gateway", min_length=1)  # OTEL_SERVICE_NAME wins
    sample_ratio: float = Field(default=1.0, ge=0, le=1)  # parent-based; OTEL_TRACES_SAMPLER wins


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_", env_nested_delimiter="__", extra="forbid", populate_by_name=True
    )

    auth: AuthSettings = AuthSettings()
    state: StateSettings = StateSettings()
    providers: dict[str, ProviderSettings] = {}
    models: dict[str, ModelRoute] = {}
    limits: Limits = Limits()
    tenants: dict[str, TenantSettings] = {}
    admin: AdminSettings = AdminSettings()
    compaction: CompactionSettings = CompactionSettings()
    mcp: McpSettings = McpSettings()
    log: LogSettings = LogSettings()
    server: ServerSettings = ServerSettings()
    metrics: MetricsSettings = MetricsSettings()
    tracing: TracingSettings = TracingSettings()
    auto_providers: bool = True  # register openai/anthropic/gemini from OPENAI_API_KEY etc.
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")  # of prices and budgets (ISO 4217)

    def provider_table(self) -> dict[str, ProviderSettings]:
        """Configured providers, plus the built-in ``mock`` and (with ``auto_providers``) the public
        providers whose usual key variable is set (OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY)."""
        table: dict[str, ProviderSettings] = {"mock": ProviderSettings(kind="mock")}
        if self.auto_providers and not self.providers:
            for name, kind, env in AUTO_PROVIDERS:
                if os.environ.get(env):
                    table[name] = ProviderSettings(kind=kind, api_key_env=env)
        table.update(self.providers)
        return table

    def serves_mock_model(self, table: dict[str, ProviderSettings] | None = None) -> bool:
        """The built-in model ``mock`` is served when ``models:`` lists it, or when there is no other
        provider (none configured, none found in the environment): a real deployment never offers it
        by accident. ``table``: the ``provider_table()`` already computed."""
        return "mock" in self.models or set(table or self.provider_table()) == {"mock"}

    def routes_model(self, name: str, table: dict[str, ProviderSettings] | None = None) -> bool:
        """Whether a request for ``name`` has a route: a ``models:`` entry, the built-in ``mock``
        when it is served, or ``provider/model`` for a pass-through provider."""
        table = table or self.provider_table()
        if name in self.models:
            return True
        if name == "mock":
            return self.serves_mock_model(table)
        provider, sep, upstream = name.partition("/")
        p = table.get(provider)
        return bool(sep and upstream and p is not None and p.pass_through and p.kind != "mock")

    def warnings(self) -> list[tuple[str, str]]:
        """What is valid but probably not meant, as (field path, message)."""
        found = []
        for name, p in self.providers.items():
            if p.api_key is None and p.api_key_env and not os.environ.get(p.api_key_env):
                found.append(
                    (
                        f"providers.{name}.api_key_env",
                        f"the variable {p.api_key_env} is not set: calls to this provider send no key",
                    )
                )
        found += self.unpriced()
        return found

    def money_budgets(self) -> bool:
        """Whether any tenant or key has a budget in money."""
        budgets = [t.budget for t in self.tenants.values()] + [k.budget for k in self.auth.api_keys or ()]
        return any(b is not None and b.amount is not None for b in budgets)

    def unpriced(self) -> list[tuple[str, str]]:
        """With budgets in money: the models that have no price (they cost nothing), and the
        pass-through providers (their ``provider/model`` names have no price)."""
        if not self.money_budgets():
            return []
        found = [
            (f"models.{name}.price", "no price: this model's turns cost 0 against budgets in money")
            for name, route in self.models.items()
            if route.price is None
        ]
        found += [
            (
                f"providers.{name}.pass_through",
                f"'{name}/<model>' names have no price: they cost 0 against budgets in money",
            )
            for name, p in self.providers.items()
            if p.pass_through and p.kind != "mock"
        ]
        return found

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Built directly, the arguments over the GATEWAY_* environment over the defaults;
        ``loading.load_settings`` adds the config file beneath them."""
        return (init_settings, env_settings)

    @model_validator(mode="after")
    def _names_resolve(self) -> Settings:
        if problems := checks.names_problems(self):
            raise Problems(problems)
        return self
