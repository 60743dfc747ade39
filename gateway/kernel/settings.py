"""The one config model: a YAML file plus environment overrides, validated once at start-up.

Environment variables use the prefix ``GATEWAY_`` and ``__`` between nested names, e.g.
``GATEWAY_STATE__REDIS_URL=redis://...`` or ``GATEWAY_LIMITS__MAX_BODY_BYTES=1048576``.
The config file is named by ``--config`` or ``GATEWAY_CONFIG``. This module is the only
reader of the environment and of the config file (provider keys are read from the variable
named by ``api_key_env`` here too).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import SplitResult, parse_qs, urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

ProviderKind = Literal["mock", "openai-chat", "openai-responses", "anthropic", "gemini"]

DEFAULT_BASE_URLS: dict[str, str] = {
    "openai-chat": "https://api.openai.com/v1",
    "openai-responses": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com/v1beta",
}


_AUTO_PROVIDERS: tuple[tuple[str, ProviderKind, str], ...] = (
    ("openai", "openai-responses", "OPENAI_API_KEY"),
    ("anthropic", "anthropic", "ANTHROPIC_API_KEY"),
    ("gemini", "gemini", "GEMINI_API_KEY"),
)


AES_KEY_SIZES = (16, 24, 32)


class _Problems(ValueError):
    """What a validator below raises: each problem with its field path, relative to where it is
    raised (pydantic's ``loc`` of a model validator is the model, not the field)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{path}: {msg}" if path else msg for path, msg in problems))
        self.problems = problems


def _invalid(message: str) -> _Problems:
    return _Problems([("", message)])


def _check_url(url: str, schemes: tuple[str, ...]) -> str:
    """``url`` if its scheme is one of ``schemes`` and it names a host (a path, for ``unix://``)
    and a valid port. The messages never repeat the URL: it may hold a password."""
    parts = urlsplit(url)
    if parts.scheme not in schemes:
        raise _invalid(f"the URL must start with one of {', '.join(f'{s}://' for s in schemes)}")
    try:
        parts.port  # noqa: B018  (reading it parses it)
    except ValueError:
        raise _invalid("the URL's port is not a number from 0 to 65535") from None
    if not (parts.path if parts.scheme == "unix" else parts.hostname):
        raise _invalid(f"the URL names no {'socket path' if parts.scheme == 'unix' else 'host'}")
    return url


# RFC 3986's characters (a percent sign only as an escape): a space, a quote or a control character
# is not part of a URL, and would reach the request line
_URL_CHARS = re.compile(r"(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})+")
# what h11 sends: a header name is a token; a value visible ASCII, spaces and tabs inside only
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"(?:[\x21-\x7e](?:[\t\x20-\x7e]*[\x21-\x7e])?)?")
_API_KEY = re.compile(r"[\x21-\x7e]+")  # visible ASCII: it goes into a header
# headers the upstream client writes itself: the message's framing, its connection (hop-by-hop,
# RFC 9110 7.6.1), and the content codings it can decode
_OWN_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "accept-encoding",
    }
)


def _check_url_text(url: str) -> None:
    if not _URL_CHARS.fullmatch(url):
        raise _invalid(
            "the URL holds a character a URL cannot (a space, a quote, a control or non-ASCII "
            "character, a % not followed by two hex digits): percent-encode it"
        )


def _upstream_url(url: str) -> str:
    """A provider's ``base_url``: an http(s) URL of valid characters, without credentials (the key is
    ``api_key``), a query or a fragment (the adapter appends its path to it)."""
    _check_url_text(url)
    _check_url(url, ("http", "https"))
    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise _invalid("the URL holds credentials (user@): give the key as api_key or api_key_env")
    if parts.query or url.endswith("?"):
        raise _invalid("the URL has a query: the adapter appends its path to the base URL")
    if parts.fragment or "#" in url:
        raise _invalid("the URL has a fragment (#): it would cut the adapter's path off")
    return url


def _key_problem(key: str) -> str | None:
    if key and not _API_KEY.fullmatch(key):
        return (
            "the key holds a space, a control or a non-ASCII character, which a header cannot carry "
            "(the key is not shown)"
        )
    return None


def _env_key_problems(
    table: dict[str, ProviderSettings], configured: dict[str, ProviderSettings]
) -> list[tuple[str, str]]:
    """The variables ``api_key_env`` names (a configured provider's, or an auto provider's) hold
    keys a header can carry."""
    problems = []
    for name, p in table.items():
        if p.api_key is None and p.api_key_env:
            problem = _key_problem(os.environ.get(p.api_key_env, ""))
            if problem:
                path = f"providers.{name}.api_key_env" if name in configured else "auto_providers"
                problems.append((path, f"the variable {p.api_key_env} (provider {name}): {problem}"))
    return problems


def _header_problems(headers: dict[str, str]) -> list[tuple[str, str]]:
    problems = []
    for n, (name, value) in enumerate(headers.items()):
        if not _HEADER_NAME.fullmatch(name):
            problems.append(
                (
                    "",
                    f"header {n + 1}'s name is not a header name: letters, digits and !#$%&'*+-.^_`|~ only",
                )
            )
        elif name.lower() in _OWN_HEADERS:
            problems.append(
                (name, "the gateway writes this header itself (message framing and hop-by-hop headers)")
            )
        elif not _HEADER_VALUE.fullmatch(value):
            problems.append(
                (
                    name,
                    "the value holds a control, DEL or non-ASCII character, or begins or ends with "
                    "whitespace (the value is not shown)",
                )
            )
    return problems


def _secret_url(schemes: tuple[str, ...]) -> AfterValidator:
    def check(value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            _check_url(value.get_secret_value(), schemes)
        return value

    return AfterValidator(check)


def _proxy_url(value: SecretStr | None) -> SecretStr | None:
    """A forward proxy is reached in plain HTTP (https:// upstreams through it are CONNECT tunnels,
    TLS end to end); TLS to the proxy itself is not supported (adapters/http1.py)."""
    if value is not None:
        if urlsplit(value.get_secret_value()).scheme == "https":
            raise _invalid(
                "an https:// proxy is not supported: give it as http:// "
                "(calls to https:// upstreams through it stay TLS end to end)"
            )
        _check_url_text(value.get_secret_value())
        _check_url(value.get_secret_value(), ("http",))
    return value


def decode_aes_key(text: str) -> bytes:
    """A configured AES key: standard or URL-safe base64 of 16, 24 or 32 bytes (ValueError if not)."""
    raw = text.strip()
    try:
        key = base64.b64decode(raw.replace("-", "+").replace("_", "/") + "=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not valid base64") from None
    if len(key) not in AES_KEY_SIZES:
        raise ValueError(f"an AES key must be 16, 24 or 32 bytes (got {len(key)})")
    return key


def _aes_key(value: SecretStr) -> SecretStr:
    try:
        decode_aes_key(value.get_secret_value())
    except ValueError as exc:
        raise _invalid(str(exc)) from None
    return value


AesKey = Annotated[SecretStr, AfterValidator(_aes_key)]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a listen address) is reachable only from this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KeyRef(_Strict):
    """A key given as ``key`` (plain) or ``sha256`` (hex digest of the key): exactly one."""

    key: SecretStr | None = None
    sha256: str | None = None

    @field_validator("sha256")
    @classmethod
    def _hex_digest(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ok = len(bytes.fromhex(value)) == 32 and len(value) == 64
            except ValueError:
                ok = False
            if not ok:
                raise _invalid("must be a 64-character hex digest (SHA-256 of the key)")
        return value

    @model_validator(mode="after")
    def _one_form(self) -> KeyRef:
        if (self.key is None) == (self.sha256 is None):
            raise _invalid("give exactly one of 'key' or 'sha256'")
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


class Budget(_Strict):
    tokens: int = Field(ge=1)  # input + output tokens per period
    period: Literal["day", "month"] = "day"  # UTC


class TenantSettings(_Strict):
    limits: TenantLimits = TenantLimits()
    budget: Budget | None = None
    retention: Literal["standard", "none"] = "standard"  # none: no conversation content persisted
    models: list[str] | None = None  # an allow-list for every key of the tenant (None: all)


class ApiKey(KeyRef):
    """One client key of a tenant."""

    tenant: str
    models: list[str] | None = None  # None: every model
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._:-]{1,64}$")  # in logs, never the key
    limits: KeyLimits = KeyLimits()


class AdminKey(KeyRef):
    """A key that may read every tenant's usage (GET /v1/usage); it serves no model."""

    name: str = Field(default="admin", pattern=r"^[A-Za-z0-9._:-]{1,64}$")


class AdminSettings(_Strict):
    api_keys: list[AdminKey] = []


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
            raise _Problems([("anonymous", "true contradicts api_keys: give one or the other")])
        return self


def _db(url: SplitResult) -> str:
    """The db a redis:// URL selects: its path, or a ``db`` query parameter."""
    return parse_qs(url.query).get("db", [url.path.strip("/")])[0]


class StateSettings(_Strict):
    # None: in-process store
    redis_url: Annotated[SecretStr | None, _secret_url(("redis", "rediss", "unix"))] = None
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
        problems: list[tuple[str, str]] = []
        url = urlsplit(self.redis_url.get_secret_value()) if self.redis_url is not None else None
        mode = self.redis_mode
        if mode != "standalone":
            if url is None:
                problems.append(("redis_url", f"redis_mode {mode} needs a redis_url"))
            elif url.scheme == "unix":
                problems.append(("redis_url", f"redis_mode {mode} needs a redis:// or rediss:// URL"))
        if mode == "cluster" and url is not None and url.scheme != "unix" and _db(url) not in ("", "0"):
            problems.append(("redis_url", "a Redis Cluster has only db 0: end the URL with /0 or no db"))
        if self.wait_replicas and mode == "cluster":
            problems.append(("wait_replicas", "is not supported with redis_mode: cluster"))
        if self.wait_replicas and url is None:
            problems.append(("wait_replicas", "needs a redis_url (the in-process store has no replicas)"))
        if mode == "sentinel":
            if not self.sentinels:
                problems.append(("sentinels", 'sentinel mode needs the sentinels, e.g. ["10.0.0.7:26379"]'))
            if not self.sentinel_master:
                problems.append(("sentinel_master", "sentinel mode needs the name of the master"))
            for i, address in enumerate(self.sentinels):
                host, sep, port = address.rpartition(":")
                if not (sep and host.strip("[]") and port.isdigit() and 0 < int(port) < 65536):
                    problems.append((f"sentinels.{i}", "must be host:port, e.g. 10.0.0.7:26379"))
        else:
            for name in ("sentinels", "sentinel_master", "sentinel_password"):
                if getattr(self, name):
                    problems.append((name, f"is only used with redis_mode: sentinel (it is {mode})"))
        if problems:
            raise _Problems(problems)
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
    proxy: Annotated[SecretStr | None, AfterValidator(_proxy_url)] = None
    # no proxy above: take HTTPS_PROXY / HTTP_PROXY / ALL_PROXY / NO_PROXY from the environment
    trust_env: bool = False
    # text/argument deltas decoded from one upstream read go out as one event (README "Relay cost");
    # false: one event per upstream delta
    merge_deltas: bool = True
    # anthropic
    anthropic_version: str = "2023-06-01"
    default_max_tokens: int = Field(default=4096, ge=1)
    # mock: chunk size of streamed text, in characters
    chunk_chars: int = Field(default=4, ge=1)

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str | None) -> str | None:
        return None if value is None else _upstream_url(value)

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and (problem := _key_problem(value.get_secret_value())):
            raise _invalid(problem)
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        if problems := _header_problems(value):
            raise _Problems(problems)
        return value

    @field_validator("anthropic_version")
    @classmethod
    def _version_header(cls, value: str) -> str:
        if problems := _header_problems({"anthropic-version": value}):
            raise _invalid(problems[0][1])
        return value

    def resolved_base_url(self) -> str:
        return (self.base_url or DEFAULT_BASE_URLS.get(self.kind, "")).rstrip("/")

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

    @model_validator(mode="after")
    def _one_form(self) -> ModelRoute:
        if self.deployments is None:
            if self.provider is None:
                raise _Problems([("provider", "give a provider, or a list of deployments")])
            return self
        if self.provider is not None:
            why = "give either provider (one deployment) or deployments, not both"
            raise _Problems([("deployments", why)])
        if not self.deployments:
            raise _Problems([("deployments", "must list at least one deployment")])
        problems = []
        seen: dict[str, int] = {}
        for i, name in enumerate(self.deployment_names()):
            first = seen.setdefault(name, i)
            if first != i:
                why = f"the same name '{name}' as deployments.{first}: each deployment needs its own"
                problems.append((f"deployments.{i}.name", why))
        if problems:
            raise _Problems(problems)
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
    """Where /metrics is served (README "Metrics")."""

    # None: on the public listener (an admin key required when auth is on); a port: only on a
    # listener of its own there, and the public /metrics answers 404
    port: int | None = Field(default=None, ge=1, le=65535)
    host: str | None = Field(default=None, min_length=1)  # None: the public listener's host
    # pass-through models (provider/model) get a label each up to this many, then "_other"
    max_pass_through_models: int = Field(default=100, ge=0, le=10_000)


def _http_url(value: str | None) -> str | None:
    return None if value is None else _check_url(value, ("http", "https"))


class TracingSettings(_Strict):
    """OpenTelemetry tracing (README "Tracing"); the standard OTEL_* variables apply as well."""

    # None: on when the OTEL_* environment asks for it (an OTLP endpoint, OTEL_TRACES_EXPORTER)
    enabled: bool | None = None
    # the OTLP/HTTP endpoint (spans go to <endpoint>/v1/traces); None: OTEL_EXPORTER_OTLP_* or
    # http://localhost:4318. Given, it turns tracing on (unless enabled: false).
    endpoint: Annotated[str | None, AfterValidator(_http_url)] = None
    service_name: str = Field(default="openresponses-gateway", min_length=1)  # OTEL_SERVICE_NAME wins
    sample_ratio: float = Field(default=1.0, ge=0, le=1)  # parent-based; OTEL_TRACES_SAMPLER wins


class _YamlSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], path: str | None) -> None:
        super().__init__(settings_cls)
        self.path = path

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if not self.path:
            return {}
        text = Path(self.path).read_text()
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise ValueError(f"config file {self.path}: the top level must be a mapping")
        return data


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
    log: LogSettings = LogSettings()
    server: ServerSettings = ServerSettings()
    metrics: MetricsSettings = MetricsSettings()
    tracing: TracingSettings = TracingSettings()
    auto_providers: bool = True  # register openai/anthropic/gemini from OPENAI_API_KEY etc.

    def provider_table(self) -> dict[str, ProviderSettings]:
        """Configured providers, plus the built-in ``mock`` and (with ``auto_providers``) the public
        providers whose usual key variable is set (OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY)."""
        table: dict[str, ProviderSettings] = {"mock": ProviderSettings(kind="mock")}
        if self.auto_providers and not self.providers:
            for name, kind, env in _AUTO_PROVIDERS:
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
        path = os.environ.get("GATEWAY_CONFIG_FILE_OVERRIDE") or os.environ.get("GATEWAY_CONFIG")
        return (init_settings, env_settings, _YamlSource(settings_cls, path))

    @model_validator(mode="after")
    def _names_resolve(self) -> Settings:
        """Every provider a route names, every fallback and every model of an allow-list (a key's,
        a tenant's) exists; no key is given twice (to one tenant or two, or as a client key and an
        admin key: the last would silently win)."""
        table = self.provider_table()
        problems = _env_key_problems(table, self.providers)
        keys = self.auth.api_keys or []
        seen: dict[bytes, int] = {}
        names: dict[tuple[str, str], int] = {}
        for i, k in enumerate(keys):
            first = seen.setdefault(k.digest(), i)
            if first != i:
                owner = keys[first].tenant
                why = f"the same key as auth.api_keys.{first} (tenant '{owner}'): a key names one tenant"
                problems.append((f"auth.api_keys.{i}", why))
            if k.name is not None:
                named = names.setdefault((k.tenant, k.name), i)
                if named != i:
                    why = f"the same name as auth.api_keys.{named}: a key's limits are counted by its name"
                    problems.append((f"auth.api_keys.{i}.name", why))
            for j, model in enumerate(k.models or ()):
                if not self.routes_model(model, table):
                    problems.append((f"auth.api_keys.{i}.models.{j}", f"unknown model '{model}'"))
        for i, a in enumerate(self.admin.api_keys):
            first = seen.setdefault(a.digest(), len(keys) + i)
            if first != len(keys) + i:
                n = len(keys)
                other = f"auth.api_keys.{first}" if first < n else f"admin.api_keys.{first - n}"
                why = f"the same key as {other}: an admin key must be a key of its own"
                problems.append((f"admin.api_keys.{i}", why))
        for tenant, t in self.tenants.items():
            for j, model in enumerate(t.models or ()):
                if not self.routes_model(model, table):
                    problems.append((f"tenants.{tenant}.models.{j}", f"unknown model '{model}'"))
        for name, route in self.models.items():
            if (
                route.provider is not None
                and route.provider not in self.providers
                and route.provider != "mock"
            ):
                problems.append((f"models.{name}.provider", f"unknown provider '{route.provider}'"))
            for i, d in enumerate(route.deployments or ()):
                if d.provider not in self.providers and d.provider != "mock":
                    problems.append(
                        (f"models.{name}.deployments.{i}.provider", f"unknown provider '{d.provider}'")
                    )
            for i, fb in enumerate(route.fallbacks):
                if not self.routes_model(fb, table):
                    problems.append((f"models.{name}.fallbacks.{i}", f"unknown model '{fb}'"))
        if problems:
            raise _Problems(problems)
        return self


class ConfigError(Exception):
    """A config file or environment that does not validate; the message names the field."""


def _error_lines(exc: ValidationError) -> list[str]:
    lines = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"])
        error = (e.get("ctx") or {}).get("error")
        for path, msg in error.problems if isinstance(error, _Problems) else [("", e["msg"])]:
            lines.append(f"  {'.'.join(p for p in (loc, path) if p) or 'config'}: {msg}")
    return lines


def _validate(**overrides: Any) -> Settings:
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError("invalid configuration:\n" + "\n".join(_error_lines(exc))) from None
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None


def load_settings(config_path: str | None = None, *, host: str | None = None, **overrides: Any) -> Settings:
    """Load and validate. Raises ConfigError naming each bad field.

    ``host``: the address it will listen on. On one that is not loopback, a config without client
    keys (``auth.api_keys``) is refused unless ``auth.anonymous`` is true, and then the provider keys
    found in the environment (``auto_providers``) are not used."""
    if config_path is not None:
        os.environ["GATEWAY_CONFIG_FILE_OVERRIDE"] = config_path
    try:
        settings = _validate(**overrides)
        if host is None or is_loopback(host) or settings.auth.enabled:
            return settings
        if not settings.auth.anonymous:
            raise ConfigError(
                f"refusing to serve on {host} without client keys: anyone who can reach it could spend "
                "the providers' keys. Give keys under auth.api_keys in the config file (auth: {api_keys: "
                "[{key: <secret>, tenant: <name>}]}) or in GATEWAY_AUTH__API_KEYS (JSON), or set "
                "auth.anonymous: true (GATEWAY_AUTH__ANONYMOUS=true) to serve without keys on purpose."
            )
        if settings.auto_providers and not settings.providers:
            settings = _validate(**{**overrides, "auto_providers": False})
        return settings
    finally:
        if config_path is not None:
            os.environ.pop("GATEWAY_CONFIG_FILE_OVERRIDE", None)


def listener_warnings(settings: Settings, host: str) -> list[tuple[str, str]]:
    """``settings.warnings()`` and, for an anonymous gateway on a non-loopback address, that."""
    found = settings.warnings()
    if not is_loopback(host) and not settings.auth.enabled:
        unused = (
            [env for _, _, env in _AUTO_PROVIDERS if os.environ.get(env)] if not settings.providers else []
        )
        note = f"; {', '.join(unused)} from the environment not used here" if unused else ""
        found.append(
            (
                "auth.anonymous",
                f"serving on {host} without client keys: anyone who can reach it can use it{note}",
            )
        )
    return found
