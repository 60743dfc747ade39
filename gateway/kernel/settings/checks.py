"""The config's rules: what the models' validators (``models.py``) check, as functions of the values
they are given, each problem with its field path (``Problems``). The messages never repeat a URL, a
key or a header value: they may hold a secret."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import re
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING
from urllib.parse import SplitResult, parse_qs, urlsplit

from pydantic import AfterValidator, SecretStr

if TYPE_CHECKING:
    from gateway.kernel.settings.models import ModelRoute, ProviderSettings, Settings, StateSettings

AES_KEY_SIZES = (16, 24, 32)


class Problems(ValueError):
    """What a validator below raises: each problem with its field path, relative to where it is
    raised (pydantic's ``loc`` of a model validator is the model, not the field)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{path}: {msg}" if path else msg for path, msg in problems))
        self.problems = problems


def invalid(message: str) -> Problems:
    return Problems([("", message)])


def check_url(url: str, schemes: tuple[str, ...]) -> str:
    """``url`` if its scheme is one of ``schemes`` and it names a host (a path, for ``unix://``)
    and a valid port. The messages never repeat the URL: it may hold a password."""
    parts = urlsplit(url)
    if parts.scheme not in schemes:
        raise invalid(f"the URL must start with one of {', '.join(f'{s}://' for s in schemes)}")
    try:
        parts.port  # noqa: B018  (reading it parses it)
    except ValueError:
        raise invalid("the URL's port is not a number from 0 to 65535") from None
    if not (parts.path if parts.scheme == "unix" else parts.hostname):
        raise invalid(f"the URL names no {'socket path' if parts.scheme == 'unix' else 'host'}")
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


def check_url_text(url: str) -> None:
    if not _URL_CHARS.fullmatch(url):
        raise invalid(
            "the URL holds a character a URL cannot (a space, a quote, a control or non-ASCII "
            "character, a % not followed by two hex digits): percent-encode it"
        )


def upstream_url(url: str) -> str:
    """A provider's ``base_url``: an http(s) URL of valid characters, without credentials (the key is
    ``api_key``), a query or a fragment (the adapter appends its path to it)."""
    check_url_text(url)
    check_url(url, ("http", "https"))
    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise invalid("the URL holds credentials (user@): give the key as api_key or api_key_env")
    if parts.query or url.endswith("?"):
        raise invalid("the URL has a query: the adapter appends its path to the base URL")
    if parts.fragment or "#" in url:
        raise invalid("the URL has a fragment (#): it would cut the adapter's path off")
    return url


def key_problem(key: str) -> str | None:
    if key and not _API_KEY.fullmatch(key):
        return (
            "the key holds a space, a control or a non-ASCII character, which a header cannot carry "
            "(the key is not shown)"
        )
    return None


def env_key_problems(
    table: dict[str, ProviderSettings], configured: dict[str, ProviderSettings]
) -> list[tuple[str, str]]:
    """The variables ``api_key_env`` names (a configured provider's, or an auto provider's) hold
    keys a header can carry."""
    problems = []
    for name, p in table.items():
        if p.api_key is None and p.api_key_env:
            problem = key_problem(os.environ.get(p.api_key_env, ""))
            if problem:
                path = f"providers.{name}.api_key_env" if name in configured else "auto_providers"
                problems.append((path, f"the variable {p.api_key_env} (provider {name}): {problem}"))
    return problems


def header_problems(headers: dict[str, str]) -> list[tuple[str, str]]:
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


def secret_url(schemes: tuple[str, ...]) -> AfterValidator:
    def check(value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            check_url(value.get_secret_value(), schemes)
        return value

    return AfterValidator(check)


def proxy_url(value: SecretStr | None) -> SecretStr | None:
    """A forward proxy is reached in plain HTTP (https:// upstreams through it are CONNECT tunnels,
    TLS end to end); TLS to the proxy itself is not supported (adapters/http1.py)."""
    if value is not None:
        if urlsplit(value.get_secret_value()).scheme == "https":
            raise invalid(
                "an https:// proxy is not supported: give it as http:// "
                "(calls to https:// upstreams through it stay TLS end to end)"
            )
        check_url_text(value.get_secret_value())
        check_url(value.get_secret_value(), ("http",))
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


def aes_key(value: SecretStr) -> SecretStr:
    try:
        decode_aes_key(value.get_secret_value())
    except ValueError as exc:
        raise invalid(str(exc)) from None
    return value


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a listen address) is reachable only from this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def redis_db(url: SplitResult) -> str:
    """The db a redis:// URL selects: its path, or a ``db`` query parameter."""
    return parse_qs(url.query).get("db", [url.path.strip("/")])[0]


def http_url(value: str | None) -> str | None:
    return None if value is None else check_url(value, ("http", "https"))


def money_problem(value: Decimal) -> str | None:
    """An amount of money: finite, not negative, at most 6 decimals (micro-units)."""
    if not value.is_finite():
        return 'must be a finite amount such as "2.50"'
    if value < 0:
        return "must not be negative"
    if value >= 10**12:
        return "must be less than 1000000000000"
    if value != value.quantize(Decimal("0.000001")):
        return "at most 6 decimals (micro-units of the currency)"
    return None


def window_problem(seconds: int | None, start: datetime | None, end: datetime | None) -> str | None:
    """A budget window: ``seconds``, or ``start`` and ``end`` (with a time zone, ``end`` later)."""
    if (seconds is None) == (start is None and end is None):
        return "give 'seconds', or 'start' and 'end'"
    if seconds is None:
        if start is None or end is None:
            return "give both 'start' and 'end'"
        if start.tzinfo is None or end.tzinfo is None:
            return "'start' and 'end' need a time zone (e.g. 2026-12-01T00:00:00Z)"
        if end <= start:
            return "'end' must be after 'start'"
    return None


def sha256_problem(value: str) -> str | None:
    """A key's ``sha256``: the hex digest of 32 bytes."""
    try:
        ok = len(bytes.fromhex(value)) == 32 and len(value) == 64
    except ValueError:
        ok = False
    return None if ok else "must be a 64-character hex digest (SHA-256 of the key)"


def topology_problems(state: StateSettings) -> list[tuple[str, str]]:
    """The Redis topology's fields agree (``redis_mode`` and what it needs)."""
    problems: list[tuple[str, str]] = []
    url = urlsplit(state.redis_url.get_secret_value()) if state.redis_url is not None else None
    mode = state.redis_mode
    if mode != "standalone":
        if url is None:
            problems.append(("redis_url", f"redis_mode {mode} needs a redis_url"))
        elif url.scheme == "unix":
            problems.append(("redis_url", f"redis_mode {mode} needs a redis:// or rediss:// URL"))
    if mode == "cluster" and url is not None and url.scheme != "unix" and redis_db(url) not in ("", "0"):
        problems.append(("redis_url", "a Redis Cluster has only db 0: end the URL with /0 or no db"))
    if state.wait_replicas and mode == "cluster":
        problems.append(("wait_replicas", "is not supported with redis_mode: cluster"))
    if state.wait_replicas and url is None:
        problems.append(("wait_replicas", "needs a redis_url (the in-process store has no replicas)"))
    if mode == "sentinel":
        if not state.sentinels:
            problems.append(("sentinels", 'sentinel mode needs the sentinels, e.g. ["10.0.0.7:26379"]'))
        if not state.sentinel_master:
            problems.append(("sentinel_master", "sentinel mode needs the name of the master"))
        for i, address in enumerate(state.sentinels):
            host, sep, port = address.rpartition(":")
            if not (sep and host.strip("[]") and port.isdigit() and 0 < int(port) < 65536):
                problems.append((f"sentinels.{i}", "must be host:port, e.g. 10.0.0.7:26379"))
    else:
        for name in ("sentinels", "sentinel_master", "sentinel_password"):
            if getattr(state, name):
                problems.append((name, f"is only used with redis_mode: sentinel (it is {mode})"))
    return problems


def route_form_problems(route: ModelRoute) -> list[tuple[str, str]]:
    """One ``provider``, or ``deployments``: a non-empty list, each with a name of its own."""
    if route.deployments is None:
        if route.provider is None:
            return [("provider", "give a provider, or a list of deployments")]
        return []
    if route.provider is not None:
        why = "give either provider (one deployment) or deployments, not both"
        return [("deployments", why)]
    if not route.deployments:
        return [("deployments", "must list at least one deployment")]
    problems: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for i, name in enumerate(route.deployment_names()):
        first = seen.setdefault(name, i)
        if first != i:
            why = f"the same name '{name}' as deployments.{first}: each deployment needs its own"
            problems.append((f"deployments.{i}.name", why))
    return problems


def names_problems(settings: Settings) -> list[tuple[str, str]]:
    """Every provider a route names, every fallback and every model of an allow-list (a key's,
    a tenant's) exists; no key is given twice (to one tenant or two, or as a client key and an
    admin key: the last would silently win); the keys the environment holds fit in a header."""
    table = settings.provider_table()
    problems = env_key_problems(table, settings.providers)
    keys = settings.auth.api_keys or []
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
            if not settings.routes_model(model, table):
                problems.append((f"auth.api_keys.{i}.models.{j}", f"unknown model '{model}'"))
    for i, a in enumerate(settings.admin.api_keys):
        first = seen.setdefault(a.digest(), len(keys) + i)
        if first != len(keys) + i:
            n = len(keys)
            other = f"auth.api_keys.{first}" if first < n else f"admin.api_keys.{first - n}"
            why = f"the same key as {other}: an admin key must be a key of its own"
            problems.append((f"admin.api_keys.{i}", why))
    for tenant, t in settings.tenants.items():
        for j, model in enumerate(t.models or ()):
            if not settings.routes_model(model, table):
                problems.append((f"tenants.{tenant}.models.{j}", f"unknown model '{model}'"))
    for name, route in settings.models.items():
        if (
            route.provider is not None
            and route.provider not in settings.providers
            and route.provider != "mock"
        ):
            problems.append((f"models.{name}.provider", f"unknown provider '{route.provider}'"))
        for i, d in enumerate(route.deployments or ()):
            if d.provider not in settings.providers and d.provider != "mock":
                problems.append(
                    (f"models.{name}.deployments.{i}.provider", f"unknown provider '{d.provider}'")
                )
        for i, fb in enumerate(route.fallbacks):
            if not settings.routes_model(fb, table):
                problems.append((f"models.{name}.fallbacks.{i}", f"unknown model '{fb}'"))
    return problems
