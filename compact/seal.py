"""Seal and open the ``encrypted_content`` of compaction items: AES-GCM under a server key ring,
bound to the tenant, in a versioned envelope ``v1.<key-id>.<base64url(nonce | ciphertext+tag)>``."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from typing import Any

import orjson
import structlog

from gateway.kernel.errors import InvalidEncryptedContent
from gateway.kernel.settings import CompactionSettings, ConfigError, decode_aes_key

log = structlog.get_logger("compact.seal")

VERSION = "v1"
NONCE_BYTES = 12
TAG_BYTES = 16
_UNOPENABLE = (
    "The compaction item's encrypted_content could not be opened: it was altered, was made for "
    "another tenant, or was sealed with a key this gateway no longer has."
)


def key_id(key: bytes) -> str:
    """A short public name for a key (8 hex digits of a domain-separated SHA-256)."""
    return hashlib.sha256(b"orgw-compaction-key-id\x00" + key).hexdigest()[:8]


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    if not text or any(c in text for c in "=+/\n\r "):
        raise ValueError("not unpadded base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def decode_key(text: str, where: str) -> bytes:
    """A configured key (the settings' one rule, ``decode_aes_key``), its error naming ``where``."""
    try:
        return decode_aes_key(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


class Sealer:
    """Encrypts with the first key of the ring and opens with any of them (rotation).

    ``cryptography`` is imported at the first seal or open, not at start-up: it is ~7 MB of RSS
    that a gateway which never compacts does not need."""

    def __init__(self, keys: list[bytes]) -> None:
        if not keys:
            raise ValueError("a Sealer needs at least one key")
        self._keys: dict[str, bytes] = {}
        for key in keys:
            self._keys.setdefault(key_id(key), key)
        self._ring: dict[str, Any] = {}  # key id -> AESGCM, made on first use
        self._current = key_id(keys[0])

    def _aead(self, kid: str) -> Any:
        aead = self._ring.get(kid)
        if aead is None:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            key = self._keys.get(kid)
            if key is None:
                return None
            aead = self._ring[kid] = AESGCM(key)
        return aead

    @classmethod
    def from_settings(cls, settings: CompactionSettings) -> Sealer:
        keys = [
            decode_key(k.get_secret_value(), f"compaction.keys[{i}]") for i, k in enumerate(settings.keys)
        ]
        if not keys and settings.workers_key is not None:
            log.warning(
                "compaction_ephemeral_key",
                detail="compaction.keys is empty: using a random key shared by this start's workers; "
                "compacted windows will not open after a restart or on another replica",
            )
            keys = [decode_key(settings.workers_key.get_secret_value(), "compaction.workers_key")]
        if not keys:
            log.warning(
                "compaction_ephemeral_key",
                detail="compaction.keys is empty: using a random per-process key; compacted windows "
                "will not open after a restart or on another replica",
            )
            keys = [os.urandom(32)]
        return cls(keys)

    @property
    def current_key_id(self) -> str:
        return self._current

    @staticmethod
    def _aad(kid: str, tenant: str) -> bytes:
        # The header and the tenant are authenticated: a window sealed for tenant A never opens for B.
        return f"orgw-compaction\x00{VERSION}.{kid}\x00".encode() + tenant.encode()

    def seal(self, payload: dict[str, Any], tenant: str) -> str:
        nonce = os.urandom(NONCE_BYTES)
        body = self._aead(self._current).encrypt(
            nonce, orjson.dumps(payload), self._aad(self._current, tenant)
        )
        return f"{VERSION}.{self._current}.{_b64url(nonce + body)}"

    def open(self, envelope: str, tenant: str, *, param: str | None = None) -> dict[str, Any]:
        """The payload, or InvalidEncryptedContent (one message for every cause: no oracle)."""
        from cryptography.exceptions import InvalidTag

        try:
            version, kid, blob = envelope.split(".")
            if version != VERSION:
                raise ValueError("unknown version")
            aead = self._aead(kid)
            if aead is None:
                raise ValueError("unknown key")
            raw = _unb64url(blob)
            if len(raw) < NONCE_BYTES + TAG_BYTES:
                raise ValueError("too short")
            plain = aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], self._aad(kid, tenant))
            payload = orjson.loads(plain)
            if not isinstance(payload, dict):
                raise ValueError("payload is not an object")
        except (ValueError, InvalidTag, binascii.Error, orjson.JSONDecodeError):
            raise InvalidEncryptedContent(_UNOPENABLE, param=param) from None
        return payload
