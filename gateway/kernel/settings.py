"""The one config model: a YAML file plus environment overrides, validated once at start-up.

Environment variables use the prefix ``GATEWAY_`` and ``__`` between nested names, e.g.
``GATEWAY_STATE__REDIS_URL=redis://...`` or ``GATEWAY_LIMITS__MAX_BODY_BYTES=1048576``.
The config file is named by ``--config`` or ``GATEWAY_CONFIG``. This module is the only
reader of the environment and of the config file (provider keys are read from the variable
named by ``api_key_env`` here too).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ApiKey(_Strict):
    """One client key. Give ``key`` (plain) or ``sha256`` (hex digest of the key), and a tenant."""

    key: SecretStr | None = None
    sha256: str | None = None
    tenant: str
    models: list[str] | None = None  # None: every model

    @model_validator(mode="after")
    def _one_form(self) -> ApiKey:
        if (self.key is None) == (self.sha256 is None):
            raise ValueError("give exactly one of 'key' or 'sha256'")
        if self.sha256 is not None and len(self.sha256) != 64:
            raise ValueError("'sha256' must be a 64-character hex digest")
        return self


class AuthSettings(_Strict):
    api_keys: list[ApiKey] | None = None  # None: no auth (local use), every request is tenant "default"


class StateSettings(_Strict):
    redis_url: SecretStr | None = None  # None: in-process store
    key_prefix: str = "orgw"
    ttl_seconds: int = Field(default=30 * 24 * 3600, ge=1)
    memory_max_entries: int = Field(default=10_000, ge=1)
    memory_max_bytes: int = Field(default=256 * 1024 * 1024, ge=1024)
    max_chain_depth: int = Field(default=1000, ge=1)
    timeout_seconds: float = Field(default=2.0, gt=0)


class Timeouts(_Strict):
    connect: float = Field(default=10.0, gt=0)
    read: float = Field(default=120.0, gt=0)  # between bytes of a response
    total: float = Field(default=600.0, gt=0)  # a whole upstream call


class RetrySettings(_Strict):
    attempts: int = Field(default=2, ge=0, le=10)  # retries after the first try
    backoff_base: float = Field(default=0.25, ge=0)
    backoff_max: float = Field(default=4.0, ge=0)
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
    proxy: SecretStr | None = None  # http://[user:pass@]host:port for upstream calls (none: direct)
    # anthropic
    anthropic_version: str = "2023-06-01"
    default_max_tokens: int = Field(default=4096, ge=1)
    # mock: chunk size of streamed text, in characters
    chunk_chars: int = Field(default=4, ge=1)

    def resolved_base_url(self) -> str:
        return (self.base_url or DEFAULT_BASE_URLS.get(self.kind, "")).rstrip("/")

    def resolved_api_key(self) -> str | None:
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if self.api_key_env:
            return os.environ.get(self.api_key_env)
        return None


class ModelRoute(_Strict):
    provider: str
    upstream_model: str | None = None  # None: the model name itself
    context_window: int = Field(default=128_000, ge=256)
    fallbacks: list[str] = []


class Limits(_Strict):
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # input items + their content parts + tools of one request (validating them holds the event loop)
    max_input_elements: int = Field(default=20_000, ge=10)
    max_events_per_stream: int = Field(default=200_000, ge=10)
    max_ws_frame_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    ws_connection_seconds: float = Field(default=3600.0, gt=0)
    ws_queue_size: int = Field(default=16, ge=1)
    ws_cache_entries: int = Field(default=8, ge=1)
    # on SIGTERM, in-flight WebSocket turns and HTTP responses get this long; then they are cut
    ws_drain_seconds: float = Field(default=10.0, ge=0)
    # the request line and headers, through the blank line (-> 431)
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    header_read_seconds: float = Field(default=10.0, gt=0)  # a whole head, from its first byte (-> 408)
    body_read_seconds: float = Field(default=10.0, gt=0)  # a whole body, from the end of its head (-> 408)


class CompactionSettings(_Strict):
    keys: list[SecretStr] = []  # base64 AES keys; first encrypts, all decrypt. Empty: a per-process key
    keep_recent_items: int = Field(default=4, ge=0)
    summary_max_tokens: int = Field(default=1024, ge=16)


class LogSettings(_Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    json_logs: bool = Field(default=True, alias="json")


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
    compaction: CompactionSettings = CompactionSettings()
    log: LogSettings = LogSettings()
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
    def _routes_name_providers(self) -> Settings:
        for name, route in self.models.items():
            if route.provider not in self.providers and route.provider != "mock":
                raise ValueError(f"models.{name}.provider: unknown provider '{route.provider}'")
            for fb in route.fallbacks:
                if fb not in self.models:
                    raise ValueError(f"models.{name}.fallbacks: unknown model '{fb}'")
        return self


class ConfigError(Exception):
    """A config file or environment that does not validate; the message names the field."""


def load_settings(config_path: str | None = None, **overrides: Any) -> Settings:
    """Load and validate. Raises ConfigError naming each bad field."""
    if config_path is not None:
        os.environ["GATEWAY_CONFIG_FILE_OVERRIDE"] = config_path
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
            lines.append(f"  {loc}: {e['msg']}")
        raise ConfigError("invalid configuration:\n" + "\n".join(lines)) from None
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None
    finally:
        if config_path is not None:
            os.environ.pop("GATEWAY_CONFIG_FILE_OVERRIDE", None)
