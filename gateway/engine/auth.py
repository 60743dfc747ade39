"""API keys → tenant (or admin). Keys are held only as SHA-256 digests and compared in constant
time. A principal's model allow-list is its key's ``models`` and its tenant's (``tenants.<name>.
models``) together: a model must be on both, when both are given."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from gateway.engine.vkeys import VirtualKeys
from gateway.kernel.errors import AuthenticationFailed, PermissionDenied
from gateway.kernel.settings import Budget, KeyLimits, Settings


@dataclass(slots=True, frozen=True)
class Principal:
    tenant: str
    models: list[str] | None = None  # None: every model
    # Names the key in log lines: "sha256:" and the first 12 hex digits of its SHA-256 digest (the
    # same for a key configured plain or as a digest), never the key. None: auth is off.
    key_name: str | None = None
    limits: KeyLimits | None = None  # the key's own limits (gateway/engine/limits.py)
    budget: Budget | None = None  # the key's own budget (its tenant's applies too)
    # a virtual key (gateway/engine/vkeys.py) an admin allowed to manage its own tenant's keys
    tenant_admin: bool = False


ANONYMOUS = Principal(tenant="default")


@dataclass(slots=True, frozen=True)
class Admin:
    """An admin key (``admin.api_keys``): it may read every tenant's usage and reload the config
    (``POST /admin/reload``), and nothing else."""

    name: str


def allowed_models(key: list[str] | None, tenant: list[str] | None) -> list[str] | None:
    """Both allow-lists apply: the key's models that its tenant allows too (None: no list)."""
    if key is None or tenant is None:
        return key if tenant is None else list(tenant)
    return [m for m in key if m in tenant]


class Authenticator:
    """The config's keys, and the virtual keys (``virtual``: made through ``/admin/keys``, held in
    a cache that follows their changes without a reload)."""

    def __init__(self, settings: Settings, virtual: VirtualKeys | None = None) -> None:
        self.enabled = settings.auth.enabled
        self.virtual = virtual
        tenants = settings.tenants
        self._tenants = tenants

        def principal(
            tenant: str,
            models: list[str] | None,
            key_name: str | None,
            limits: KeyLimits | None = None,
            budget: Budget | None = None,
        ) -> Principal:
            t = tenants.get(tenant)
            return Principal(
                tenant, allowed_models(models, t.models if t else None), key_name, limits, budget
            )

        self.anonymous = principal("default", None, None)
        # the settings refuse a key given twice, so no entry here overwrites another
        self._by_digest: dict[bytes, Principal | Admin] = {}
        for k in settings.auth.api_keys or ():
            digest = k.digest()
            name = k.name or f"sha256:{digest.hex()[:12]}"
            self._by_digest[digest] = principal(k.tenant, k.models, name, k.limits, k.budget)
        for a in settings.admin.api_keys:
            self._by_digest[a.digest()] = Admin(a.name)

    def authenticate(self, authorization: str | None) -> Principal:
        """A client key's principal (``authorization``: the raw ``Authorization`` header value);
        an admin key is refused with 403: it serves no model."""
        found = self.identify(authorization)
        if isinstance(found, Admin):
            raise PermissionDenied(
                "An admin key may only read usage (GET /v1/usage) and reload the config; use a client key."
            )
        return found

    def identify(self, authorization: str | None) -> Principal | Admin:
        """A client key's principal or an admin key. Without client keys, a request without an
        admin key is the tenant ``default``'s."""
        if not self.enabled and not authorization:
            return self.anonymous
        if not authorization:
            raise AuthenticationFailed("Missing API key: send 'Authorization: Bearer <key>'.")
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            if not self.enabled:
                return self.anonymous
            raise AuthenticationFailed("Malformed Authorization header: expected 'Bearer <key>'.")
        digest = hashlib.sha256(key.strip().encode()).digest()
        found: Principal | Admin | None = None
        for stored, principal in self._by_digest.items():  # every key compared, in constant time
            if hmac.compare_digest(stored, digest):
                found = principal
        if found is None and self.virtual is not None:
            vk = self.virtual.lookup(digest)
            if vk is not None:
                t = self._tenants.get(vk.tenant)
                models = allowed_models(vk.models, t.models if t else None)
                return Principal(vk.tenant, models, vk.id, vk.limits, vk.budget, vk.tenant_admin)
        if found is None:
            if not self.enabled:
                return self.anonymous
            raise AuthenticationFailed("Invalid API key.")
        return found
