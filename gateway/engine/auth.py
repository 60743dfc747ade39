"""API keys → tenant. Keys are held only as SHA-256 digests and compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from gateway.kernel.errors import AuthenticationFailed
from gateway.kernel.settings import AuthSettings, KeyLimits


@dataclass(slots=True, frozen=True)
class Principal:
    tenant: str
    models: list[str] | None = None  # None: every model
    # Names the key in log lines: "sha256:" and the first 12 hex digits of its SHA-256 digest (the
    # same for a key configured plain or as a digest), never the key. None: auth is off.
    key_name: str | None = None
    limits: KeyLimits | None = None  # the key's own limits (gateway/engine/limits.py)


ANONYMOUS = Principal(tenant="default")


class Authenticator:
    def __init__(self, settings: AuthSettings) -> None:
        self.enabled = settings.enabled
        # the settings refuse a key given twice, so no entry here overwrites another
        self._by_digest: dict[bytes, Principal] = {}
        for k in settings.api_keys or ():
            digest = k.digest()
            self._by_digest[digest] = Principal(
                tenant=k.tenant,
                models=k.models,
                key_name=k.name or f"sha256:{digest.hex()[:12]}",
                limits=k.limits,
            )

    def authenticate(self, authorization: str | None) -> Principal:
        """``authorization`` is the raw ``Authorization`` header value."""
        if not self.enabled:
            return ANONYMOUS
        if not authorization:
            raise AuthenticationFailed("Missing API key: send 'Authorization: Bearer <key>'.")
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise AuthenticationFailed("Malformed Authorization header: expected 'Bearer <key>'.")
        digest = hashlib.sha256(key.strip().encode()).digest()
        found: Principal | None = None
        for stored, principal in self._by_digest.items():  # every key compared, in constant time
            if hmac.compare_digest(stored, digest):
                found = principal
        if found is None:
            raise AuthenticationFailed("Invalid API key.")
        return found
