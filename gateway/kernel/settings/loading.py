"""Reading the config: the YAML file named by ``--config`` (else ``GATEWAY_CONFIG``, else none)
under the ``GATEWAY_*`` environment overrides, validated once into ``Settings``. The path is given
to the file's settings source, never passed through the environment. This package is the only
reader of the environment and of the config file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, InitSettingsSource, PydanticBaseSettingsSource

from gateway.kernel.settings.checks import Problems, is_loopback
from gateway.kernel.settings.models import AUTO_PROVIDERS, Settings

CONFIG_ENV = "GATEWAY_CONFIG"  # the config file's path when no --config is given


class YamlFileSource(PydanticBaseSettingsSource):
    """The config file's settings (none without a path); below the environment's."""

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


def resolve_config_path(given: str | None) -> str | None:
    """The config file to read: ``given`` (``--config``), else ``$GATEWAY_CONFIG``, else none."""
    return given or os.environ.get(CONFIG_ENV)


class ConfigError(Exception):
    """A config file or environment that does not validate; the message names the field."""


def _error_lines(exc: ValidationError) -> list[str]:
    lines = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"])
        error = (e.get("ctx") or {}).get("error")
        for path, msg in error.problems if isinstance(error, Problems) else [("", e["msg"])]:
            lines.append(f"  {'.'.join(p for p in (loc, path) if p) or 'config'}: {msg}")
    return lines


def _validate(path: str | None, overrides: dict[str, Any]) -> Settings:
    """``overrides`` over the GATEWAY_* environment over the file at ``path``."""
    sources = (
        InitSettingsSource(Settings, init_kwargs=overrides),
        EnvSettingsSource(Settings),
        YamlFileSource(Settings, path),
    )
    try:
        return Settings(_build_sources=(sources, overrides))  # BaseSettings.__init__'s own argument
    except ValidationError as exc:
        raise ConfigError("invalid configuration:\n" + "\n".join(_error_lines(exc))) from None
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None


def load_settings(config_path: str | None = None, *, host: str | None = None, **overrides: Any) -> Settings:
    """Load and validate the file at ``config_path`` (None: ``$GATEWAY_CONFIG``, else none) under the
    environment and ``overrides``. Raises ConfigError naming each bad field.

    ``host``: the address it will listen on. On one that is not loopback, a config without client
    keys (``auth.api_keys``) is refused unless ``auth.anonymous`` is true, and then the provider keys
    found in the environment (``auto_providers``) are not used."""
    path = resolve_config_path(config_path)
    settings = _validate(path, overrides)
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
        settings = _validate(path, {**overrides, "auto_providers": False})
    return settings


def listener_warnings(settings: Settings, host: str) -> list[tuple[str, str]]:
    """``settings.warnings()`` and, for an anonymous gateway on a non-loopback address, that."""
    found = settings.warnings()
    if not is_loopback(host) and not settings.auth.enabled:
        unused = (
            [env for _, _, env in AUTO_PROVIDERS if os.environ.get(env)] if not settings.providers else []
        )
        note = f"; {', '.join(unused)} from the environment not used here" if unused else ""
        found.append(
            (
                "auth.anonymous",
                f"serving on {host} without client keys: anyone who can reach it can use it{note}",
            )
        )
    return found
