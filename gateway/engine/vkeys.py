"""Virtual keys: client keys made, changed, rotated and revoked through the admin API
(gateway/api/keys.py) without a reload, beside the config's keys (gateway/engine/auth.py).

Each replica holds every record in memory, by the SHA-256 digest of its secret (and of its previous
secret during a rotation's grace period), with the store's version number: a lookup never waits on
the store. The cache is read again when the version changes: at once when another replica
publishes its change (Redis pub/sub), and in any case within ``POLL_SECONDS`` (a version check,
which also covers a missed message, a Cluster, or a Redis restart). A replica's own change is in its
cache before its answer is sent.

Only digests are kept, in memory and in the store; the secret is returned once, by ``create`` and
``rotate``."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import time
from collections.abc import Callable
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field

from gateway.kernel.settings import Budget, KeyLimits
from state.keys import VirtualKeyStore

log = structlog.get_logger("gateway.engine.vkeys")

POLL_SECONDS = 0.25
SECRET_PREFIX = "sk-gw-"
NAME_PATTERN = r"^[A-Za-z0-9._:-]{1,64}$"


class VirtualKey(BaseModel):
    """One record as stored (never its secret)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    tenant: str
    name: str | None = None
    models: list[str] | None = None
    limits: KeyLimits = KeyLimits()
    budget: Budget | None = None
    expires_at: int | None = None  # unix seconds; None: never
    metadata: dict[str, str] = Field(default_factory=dict)
    tenant_admin: bool = False  # may manage its own tenant's keys (never another's)
    digest: str  # SHA-256 of the secret, hex
    previous_digest: str | None = None  # the secret before the last rotation, valid until ...
    previous_until: int | None = None  # ... this unix second
    created_at: int
    updated_at: int
    created_by: str

    def live(self, now: float) -> bool:
        return self.expires_at is None or now < self.expires_at

    def public(self) -> dict[str, Any]:
        """The API's view: no digest either."""
        out = self.model_dump(exclude={"digest", "previous_digest", "previous_until"}, mode="json")
        out = {"object": "gateway.key", **out}
        out["previous_secret_expires_at"] = self.previous_until
        return out


def digest_of(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    return "vk_" + secrets.token_hex(12)


class VirtualKeys:
    """The cache (``lookup``) and the changes (``put``, ``delete``) of the virtual keys."""

    def __init__(self, store: VirtualKeyStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self.version = -1  # nothing read yet
        self._records: dict[str, VirtualKey] = {}
        self._by_digest: dict[bytes, VirtualKey] = {}
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    # -- the cache -------------------------------------------------------------------------
    def lookup(self, digest: bytes) -> VirtualKey | None:
        """The live key whose secret (or previous secret, within its grace period) has ``digest``."""
        found = self._by_digest.get(digest)
        if found is None:
            return None
        now = self.clock()
        if not found.live(now):
            return None
        if found.digest != digest.hex():  # the previous secret
            if found.previous_until is None or now >= found.previous_until:
                return None
        return found

    def records(self) -> list[VirtualKey]:
        return sorted(self._records.values(), key=lambda r: (r.tenant, r.created_at, r.id))

    def get(self, key_id: str) -> VirtualKey | None:
        return self._records.get(key_id)

    def tenants(self) -> set[str]:
        return {r.tenant for r in self._records.values()}

    async def refresh(self, at_least: int | None = None) -> None:
        """Read every record again (unless the cache is at ``at_least`` already)."""
        async with self._lock:
            if at_least is not None and self.version >= at_least:
                return
            version, raw = await self.store.load()
            records: dict[str, VirtualKey] = {}
            by_digest: dict[bytes, VirtualKey] = {}
            for key_id, blob in raw.items():
                try:
                    rec = VirtualKey.model_validate(blob)
                except ValueError:
                    log.warning("virtual_key_unreadable", key_id=key_id)
                    continue
                records[key_id] = rec
                by_digest[bytes.fromhex(rec.digest)] = rec
                if rec.previous_digest is not None:
                    by_digest[bytes.fromhex(rec.previous_digest)] = rec
            self._records, self._by_digest, self.version = records, by_digest, version

    async def _check(self) -> None:
        with contextlib.suppress(Exception):
            if await self.store.version() != self.version:
                await self.refresh()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            await self._check()

    async def _listen(self) -> None:
        await self.store.listen(self._check)

    async def start(self) -> None:
        """Read the records (a store that does not answer now is read by the next check) and
        follow the changes."""
        with contextlib.suppress(Exception):
            await self.refresh()
        if not self._tasks:
            self._tasks = [asyncio.ensure_future(self._poll()), asyncio.ensure_future(self._listen())]

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        await self.store.aclose()

    # -- changes ---------------------------------------------------------------------------
    async def put(self, record: VirtualKey) -> None:
        version = await self.store.put(record.id, record.model_dump(mode="json"))
        await self.refresh(at_least=version)

    async def delete(self, key_id: str) -> bool:
        found, version = await self.store.delete(key_id)
        await self.refresh(at_least=version)
        return found
